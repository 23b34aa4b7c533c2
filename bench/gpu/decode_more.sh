#!/usr/bin/env bash
# Issue 36, second pass: decode_more.py's families (small batches at long context, shared prefixes, mixed batches of
# real traces' lengths, prefill to 4,089 tokens, the decode grid again) on one idle server (one GPU, sglang defaults +
# --enable-metrics + --decode-log-interval 10). Results in $OUT: decode-more-<family>.json as each family finishes,
# server.log.gz (whole, for decode_grid_log.py), gpu.csv (the GPU's clocks before and after). SIM=1: against a
# sim-server here (--quick). MORE_DIR: where decode_more.py and decode_grid.py are (default: beside this script; the
# device call runs copies under .carry/). DEADLINE_S: seconds from this script's start (default 540) by which the
# families stop.
source bench/gpu/common.sh
PORT=${PORT:-30100}
NAME=decodemore
MORE_DIR=${MORE_DIR:-$(dirname "$0")}
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
[ "${SIM:-0}" = 1 ] || SGL_ARGS="$SGL_ARGS --decode-log-interval 10"
PY=${TB% -m tracebench}
DEADLINE_S=${DEADLINE_S:-540}
gpu_state() {
  [ "${SIM:-0}" = 1 ] && return 0
  nvidia-smi --query-gpu=name,uuid,pci.bus_id,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu \
    --format=csv >> "$PACK_TO/gpu.csv"
}
save() { cp "$RES"/decode-more-*.json "$PACK_TO/" 2>/dev/null || true; gzip -c "$RES/server.log" > "$PACK_TO/server.log.gz"; }
trap 'save; ls -la "$PACK_TO"' EXIT
t0=$SECONDS
gpu_state
start_server 0 "$PORT" "$RES/server.log"
wait_healthy "$PORT" "$RES/server.log"
echo "server healthy: $((SECONDS - t0)) s"
QUICK=(); [ "${SIM:-0}" = 1 ] && QUICK=(--quick)
$PY "$MORE_DIR/decode_more.py" "http://127.0.0.1:$PORT" "$RES" --budget-s $((DEADLINE_S - 15 - (SECONDS - t0))) \
  ${FAMILIES:+--families "$FAMILIES"} "${QUICK[@]}"
echo "decode_more: $((SECONDS - t0)) s"
gpu_state
stop_server "$RES/server.log"
