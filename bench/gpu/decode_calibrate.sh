#!/usr/bin/env bash
# Issue 36: the decode step cost over batch size x per-request context, on one idle server (one GPU, sglang defaults +
# --enable-metrics + --decode-log-interval 10, so sglang's own "Decode batch ... gen throughput" lines come every 10
# steps), then bench/gpu/calibrate.py (prefill 64..4,089 tokens, the decode sweep, prefix series) on the same server.
# Results in $OUT: decode-grid-0.json, decode-grid-1.json, calibration-h200.json, server.log.gz (whole), decodecal.tgz. SIM=1: against a
# sim-server here (a check of the script; --quick). GRID_DIR: where decode_grid.py is (default: beside this script;
# the device call runs a copy under .carry/).
source bench/gpu/common.sh
PORT=${PORT:-30100}
NAME=decodecal
GRID_DIR=${GRID_DIR:-$(dirname "$0")}
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
[ "${SIM:-0}" = 1 ] || SGL_ARGS="$SGL_ARGS --decode-log-interval 10"
# keep the whole server log (pack cuts *.log to 300 lines): it is saved as server.txt at exit
trap 'pack; ls -la "$PACK_TO"' EXIT
PY=${TB% -m tracebench}
t0=$SECONDS
start_server 0 "$PORT" "$RES/server.log"
wait_healthy "$PORT" "$RES/server.log"
echo "server healthy: $((SECONDS - t0)) s"
QUICK=(); [ "${SIM:-0}" = 1 ] && [ "${FULL:-0}" != 1 ] && QUICK=(--quick)
# the call's plan (one device call of < 10 min): grid pass 0, the calibration, grid pass 1 with what is left of
# DEADLINE_S seconds after this script started; each result is copied to $PACK_TO as soon as it exists (a call killed
# at its limit still returns them)
DEADLINE_S=${DEADLINE_S:-480}
save() { cp "$@" "$PACK_TO/"; gzip -c "$RES/server.log" > "$PACK_TO/server.log.gz"; }
$PY "$GRID_DIR/decode_grid.py" "http://127.0.0.1:$PORT" "$RES/decode-grid-0.json" --pass 0 \
  --budget-s $((DEADLINE_S - 150 - (SECONDS - t0))) "${QUICK[@]}"
save "$RES/decode-grid-0.json"
echo "decode grid pass 0: $((SECONDS - t0)) s"
if [ "${CALIBRATE:-1}" = 1 ]; then
  $PY bench/gpu/calibrate.py "http://127.0.0.1:$PORT" "$RES/calibration-h200.json" "${QUICK[@]}"
  save "$RES/calibration-h200.json"
  echo "calibration: $((SECONDS - t0)) s"
fi
left=$((DEADLINE_S - (SECONDS - t0)))
if [ "$left" -gt 40 ]; then
  $PY "$GRID_DIR/decode_grid.py" "http://127.0.0.1:$PORT" "$RES/decode-grid-1.json" --pass 1 --budget-s "$left" \
    "${QUICK[@]}"
  save "$RES/decode-grid-1.json"
  echo "decode grid pass 1: $((SECONDS - t0)) s"
fi
stop_server "$RES/server.log"
