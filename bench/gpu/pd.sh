#!/usr/bin/env bash
# PD disaggregation on two GPUs (issue 21): 1 prefill + 1 decode server against 2 plain servers on the same traces.
# Run from the repository root on the device, after bench/gpu/stage.sh in the call before (within 30 s); results:
# $OUT/pd.tgz (one folder per run, the servers' logs and /server_info, bandwidth.json, the stage timings).
#   bw     the KV-transfer bandwidth for the simulator's --kv-transfer-bandwidth: $BW_N requests of $BW_LEN prompt
#          tokens and one output token, one at a time, through the 1P1D pair; bench/gpu/pd_bandwidth.py reads the
#          prefill server's sglang:kv_transfer_* counters (run.json pd.server_metrics) -> bandwidth.json
#   pd     1P1D (GPU 0 prefill, GPU 1 decode, --disaggregation-transfer-backend $BACKEND), attached: each trace
#          through tracebench's router (--prefill-policy/--decode-policy round_robin: one server each) and through
#          sglang-router 0.3.2 --pd-disaggregation (--router sglang-router --router-policy round_robin)
#   plain  two plain servers (GPU 0, GPU 1), attached: each trace with round_robin and cache_aware
# Traces (each run ~60 s): shared.jsonl (shared-prompt: $GROUPS_N system prompts of $PREFIX_LEN tokens, $N
# requests at $RATE req/s) and mooncake.jsonl (the first $MC_N rows of the Mooncake synthetic trace, Poisson at
# $MC_RATE req/s, clamped to the context). Their rates are low on purpose: a request's KV is 0.5 MiB per prompt token
# (~0.9 GiB for shared, ~1.7 GiB for mooncake), so they offer ~1.5-1.8 GiB/s of KV to a TCP link.
# BACKEND: mooncake_tcp (mooncake with MC_FORCE_TCP=1: no RDMA hardware needed; .DUCUMENT/pd-disaggregation.md 1, 8).
# STAGES picks the steps (default "bw pd plain"; a call lasts at most 600 s: "bw pd" then "plain" in two calls).
# SIM=1 runs every step on sim-servers on this machine (a check of the script; no staging needed).
#   SIM=1 bash bench/gpu/pd.sh
source bench/gpu/common.sh
STAGES=${STAGES:-"bw pd plain"}; BACKEND=${BACKEND:-mooncake_tcp}
GROUPS_N=${GROUPS_N:-16}; PREFIX_LEN=${PREFIX_LEN:-1536}; QUESTION=${QUESTION:-256}; OUTPUT=${OUTPUT:-128}
N=${N:-120}; RATE=${RATE:-2}
MC_DATA=${MC_DATA:-tests/data/mooncake_synthetic_trace_last1000.jsonl.xz}; MC_N=${MC_N:-50}; MC_RATE=${MC_RATE:-0.8}
BW_N=${BW_N:-12}; BW_LEN=${BW_LEN:-2048}; BW_RATE=${BW_RATE:-0.5}   # 1 GiB each, 2 s apart: one transfer at a time down to 0.5 GiB/s
PORT0=${PORT0:-30300}; BOOT_PORT=${BOOT_PORT:-30390}
NAME=pd
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
PY=${TB% -m tracebench}
trap 'pack; ls -la "$PACK_TO"' EXIT
if [ "${SIM:-0}" != 1 ]; then
  # staging from the call before (bench/gpu/stage.sh); a fresh machine has none
  if [ ! -f /opt/pd/staged ] || [ ! -e /opt/pd/mooncake/mooncake/engine.so ] || [ ! -d /opt/pd/router/sglang_router ]; then
    echo "pd.sh: /opt/pd has no staged mooncake / sglang-router: run 'bash bench/gpu/stage.sh' (carry .stage) in the"
    echo "call just before this one (the machine keeps /opt/pd only while warm, 30 s). Nothing ran."
    trap - EXIT; exit 3
  fi
  export PYTHONPATH=/opt/pd/mooncake:/opt/pd/router:$PYTHONPATH
  echo "staged mooncake: $(cat /opt/pd/staged)" | tee "$RES/staging.txt"
fi

$TB generate --workload shared-prompt --groups "$GROUPS_N" --prefix-len "$PREFIX_LEN" --group-dist uniform \
  --input-len "$QUESTION" --output-len "$OUTPUT" --rate "$RATE" --num-requests "$N" --seed 0 -o "$RES/shared.jsonl"
$TB generate --dataset "$MC_DATA" --dataset-format mooncake --in-order --num-requests "$MC_N" --arrival poisson \
  --rate "$MC_RATE" --seed 0 -o "$RES/mooncake.jsonl"
$TB generate --input-len "$BW_LEN" --output-len 1 --length-dist fixed --arrival constant --rate "$BW_RATE" \
  --num-requests "$BW_N" --seed 0 -o "$RES/bw.jsonl"
for t in shared mooncake bw; do $TB inspect "$RES/$t.jsonl" > "$RES/$t-inspect.txt"; done
# --timeout: a run the link cannot keep up with ends in bounded time (its requests recorded as timeout)
COMMON=(--out-dir "$RES" --quiet --timeout "${TIMEOUT:-120}")
t0=$SECONDS
stamp() { echo "$1: $((SECONDS - t0)) s" | tee -a "$RES/timings.txt"; }

# start GPU PORT LOG [server args...]: one server in its own session, then wait until it is healthy
start() {
  local gpu=$1 port=$2 log=$3; shift 3
  if reuse_server "$port" "$log"; then return; fi
  if [ "${SIM:-0}" = 1 ]; then
    setsid $TB sim-server --port "$port" --skip-tokenizer-init "$@" > "$log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$gpu setsid python3 -m sglang.launch_server --model-path "$MODEL" $SGL_ARGS \
      --skip-tokenizer-init --enable-metrics --host 127.0.0.1 --port "$port" "$@" > "$log" 2>&1 &
  fi
  echo $! > "$log.pid"
}
ready() {  # ready PORT LOG: wait until healthy, keep its /server_info
  wait_healthy "$1" "$2"
  curl -s "http://127.0.0.1:$1/server_info" > "$2.server_info.json"
}
vocab() { if [ "${SIM:-0}" = 1 ]; then echo ""; else echo "--model $MODEL"; fi; }
P_URL=http://127.0.0.1:$PORT0; D_URL=http://127.0.0.1:$((PORT0 + 1))
PAIR=(--attach-prefill "$P_URL" --attach-decode "$D_URL")

if [[ " $STAGES " == *" bw "* || " $STAGES " == *" pd "* ]]; then
  PD_ARGS=(--disaggregation-transfer-backend "$BACKEND")
  start 0 "$PORT0" "$RES/prefill.log" --disaggregation-mode prefill --disaggregation-bootstrap-port "$BOOT_PORT" "${PD_ARGS[@]}"
  start 1 $((PORT0 + 1)) "$RES/decode.log" --disaggregation-mode decode "${PD_ARGS[@]}"
  ready "$PORT0" "$RES/prefill.log"; ready $((PORT0 + 1)) "$RES/decode.log"
  stamp "pd servers up"
  if [[ " $STAGES " == *" bw "* ]]; then
    $TB replay "$RES/bw.jsonl" "${PAIR[@]}" $(vocab) --run-name bw "${COMMON[@]}"
    $PY bench/gpu/pd_bandwidth.py "$RES/bw" | tee "$RES/bandwidth.json"
    stamp bw; pack
  fi
  if [[ " $STAGES " == *" pd "* ]]; then
    for t in shared mooncake; do
      $TB replay "$RES/$t.jsonl" "${PAIR[@]}" $(vocab) --prefill-policy round_robin --decode-policy round_robin \
        --run-name "pd-$t" "${COMMON[@]}"
      stamp "pd-$t"; pack
      $TB replay "$RES/$t.jsonl" "${PAIR[@]}" $(vocab) --router sglang-router --router-policy round_robin \
        --run-name "pd-sglang-router-$t" "${COMMON[@]}"
      stamp "pd-sglang-router-$t"; pack
    done
  fi
  stop_server "$RES/prefill.log"; stop_server "$RES/decode.log"
fi

if [[ " $STAGES " == *" plain "* ]]; then
  start 0 $((PORT0 + 2)) "$RES/plain-0.log"; start 1 $((PORT0 + 3)) "$RES/plain-1.log"
  ready $((PORT0 + 2)) "$RES/plain-0.log"; ready $((PORT0 + 3)) "$RES/plain-1.log"
  stamp "plain servers up"
  for t in shared mooncake; do
    for policy in round_robin cache_aware; do
      $TB replay "$RES/$t.jsonl" --attach "http://127.0.0.1:$((PORT0 + 2))" --attach "http://127.0.0.1:$((PORT0 + 3))" \
        $(vocab) --policy "$policy" --run-name "plain-$policy-$t" "${COMMON[@]}"
      stamp "plain-$policy-$t"; pack
    done
  done
  stop_server "$RES/plain-0.log"; stop_server "$RES/plain-1.log"
fi
