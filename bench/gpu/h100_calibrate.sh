#!/usr/bin/env bash
# The H100 calibration alone (issue 19 part 3, 2026-11-26): bench/gpu/calibrate.py on one idle server (GPU 0, sglang
# defaults + --enable-metrics), prefill points up to 4,089 tokens (the first H100 calibration stopped at 3,968, below
# the 4,087-token prompts of the held-out Mooncake runs). Results: $OUT/h100cal.tgz. About 3 minutes with start-up.
# SIM=1 runs it against a sim-server here (a check of the script).
source bench/gpu/common.sh
PORT=${PORT:-30100}
NAME=h100cal
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
trap 'pack; ls -la "$PACK_TO"' EXIT
PY=${TB% -m tracebench}
t0=$SECONDS
start_server 0 "$PORT" "$RES/server.log"
wait_healthy "$PORT" "$RES/server.log"
echo "server healthy: $((SECONDS - t0)) s"
QUICK=(); [ "${SIM:-0}" = 1 ] && QUICK=(--quick)
$PY bench/gpu/calibrate.py "http://127.0.0.1:$PORT" "$RES/calibration-h100.json" "${QUICK[@]}"
echo "calibration: $((SECONDS - t0)) s"
stop_server "$RES/server.log"
