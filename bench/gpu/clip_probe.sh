#!/usr/bin/env bash
# sglang's context rule on one GPU (issue 19 item 1): start one server like tracebench does (--skip-tokenizer-init
# --enable-metrics), run bench/gpu/clip_probe.py against it (~15 requests, a few seconds), stop it. Result:
# $OUT/clip.tgz (clip_probe.json, the probe's output, the server's /server_info and log tail).
# SIM=1 runs it on a sim-server here (a check of the script).
source bench/gpu/common.sh
PORT=${PORT:-30200}
NAME=clip
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
trap 'stop_server "$RES/server.log"; pack; ls -la "$PACK_TO"' EXIT
start_server 0 "$PORT" "$RES/server.log"
wait_healthy "$PORT" "$RES/server.log"
curl -s "http://127.0.0.1:$PORT/server_info" > "$RES/server_info.json"
PY=${TB% -m tracebench}
$PY bench/gpu/clip_probe.py --url "http://127.0.0.1:$PORT" --out "$RES/clip_probe.json" | tee "$RES/clip_probe.txt"
