# Shared by the device scripts. Sourced from the repository root.
# SIM=1 runs the same steps against tracebench sim-servers on this machine (to check the script without a GPU).
set -euo pipefail
export PYTHONUNBUFFERED=1
# Results are gathered in RES_ROOT and packed into one archive in $OUT (the device returns at most 8 files).
# RES_ROOT is inside the repository (reports/ is ignored), so the run folders record their paths relative to it.
RES_ROOT=reports/gpu-results
PACK_TO=${OUT:-$PWD/reports/gpu-out}
mkdir -p "$RES_ROOT" "$PACK_TO"
MODEL=.carry/models/llama-2-7b-hf
# What our device's sglang needs (bench/gpu/README.md, "sglang on the GPU machine"): dummy weights, triton attention.
SGL_ARGS="--load-format dummy --attention-backend triton --sampling-backend pytorch"
if [ "${SIM:-0}" = 1 ]; then
  TB="python3 -m tracebench"
  [ -x .venv/bin/python ] && TB=".venv/bin/python -m tracebench"
else
  source .carry/sglang-device/setup-on-device.sh
  export PYTHONPATH=$PWD:$PYTHONPATH
  # polars for the report side (sweep summaries, checks), when bench/gpu/stage_report.sh put it there
  if [ -d /opt/report ]; then export PYTHONPATH=$PYTHONPATH:/opt/report; fi
  TB="python3 -m tracebench"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$PACK_TO/gpus.csv"
fi

# start_server GPU PORT LOG [TEXT_MODEL_DIR]: one server in its own session (so its whole group can be stopped).
# Without TEXT_MODEL_DIR it is started like tracebench starts it (--skip-tokenizer-init: ids in, ids out);
# with it, in text mode (the tokenizer in that folder), which sglang's bench_serving needs.
# KEEP_SERVERS=1 (one machine session, several calls): a server already answering /health on the port is used as it
# is (started by an earlier script or call), and stop_server leaves servers running for the next call; the last
# call stops them (stop_port).
start_server() {
  local gpu=$1 port=$2 log=$3 model=${4:-} tok_args="--skip-tokenizer-init"
  if reuse_server "$port" "$log"; then return; fi
  if [ -n "$model" ]; then tok_args=""; else model=$MODEL; fi
  if [ "${SIM:-0}" = 1 ]; then
    setsid $TB sim-server --port "$port" > "$log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$gpu setsid python3 -m sglang.launch_server --model-path "$model" $SGL_ARGS $tok_args \
      --enable-metrics --host 127.0.0.1 --port "$port" > "$log" 2>&1 &
  fi
  echo $! > "$log.pid"
}

# wait_healthy PORT LOG: poll /health until 200 (fail with the log's tail after 600 s).
wait_healthy() {
  local port=$1 log=$2 t0=$SECONDS
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; do
    if [ $((SECONDS - t0)) -gt 600 ] || ! kill -0 "$(cat "$log.pid")" 2>/dev/null; then
      echo "server on port $port did not become healthy"; tail -40 "$log"; return 1
    fi
    sleep 2
  done
  echo "server on port $port healthy after $((SECONDS - t0)) s"
}

# reuse_server PORT LOG: with KEEP_SERVERS=1, true (and LOG.pid names its process) when a server answers on PORT
reuse_server() {
  local port=$1 log=$2
  [ "${KEEP_SERVERS:-0}" = 1 ] || return 1
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] || return 1
  pgrep -f -- "--port $port( |\$)" | head -1 > "$log.pid"
  echo "reusing the server on port $port (pid $(cat "$log.pid"))" | tee "$log"
}

# stop_port PORT: stop the server listening on PORT (its whole session), whoever started it
stop_port() {
  local pid
  pid=$(pgrep -f -- "--port $1( |\$)" | head -1) || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  sleep 5
  kill -KILL -- "-$pid" 2>/dev/null || true
}

stop_server() {
  local log=$1
  [ "${KEEP_SERVERS:-0}" = 1 ] && return 0
  kill -TERM -- "-$(cat "$log.pid")" 2>/dev/null || true  # its whole session (sglang has child processes)
  sleep 5
  kill -KILL -- "-$(cat "$log.pid")" 2>/dev/null || true
}

# pack: the script's results ($RES_ROOT/$NAME) as $PACK_TO/$NAME.tgz, each log under $RES cut to its last 300 lines
# (the device returns at most 8 files, each of limited size); every script's EXIT trap calls it
pack() {
  local log
  for log in $(find "$RES" -name '*.log'); do tail -n 300 "$log" > "$log.tail" && mv "$log.tail" "$log"; done
  tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"
}
