#!/usr/bin/env bash
# Shared prefixes on real sglang (issue 12). Run from the repository root on the device; results: $OUT/prefix.tgz
#   1. seq: the first $SEQ_N requests of the Mooncake synthetic trace (prompts cut to llama-2's context, blocks cut
#      to match) one at a time (constant $SEQ_RATE req/s: no two prefills share a batch) on one server: sglang's
#      cached_tokens must equal the leading tokens already sent, request by request (bench/prefix_check.py).
#   2. node: a shared-prompt trace ($GROUPS system prompts of $PREFIX_LEN tokens, uniform, questions of $QUESTION
#      tokens, $N requests at $RATE req/s) on the same server, whole GPU.
#   3. routing (SERVERS > 0): the same trace on $SERVERS servers of --mem-fraction-static $MEM_FRACTION each, on the
#      GPUs of GPU_OF (default: server i on GPU i; "0 0" puts two servers on GPU 0 when one GPU is lent), one run per
#      policy of $POLICIES. Servers sharing a GPU share its compute: their latencies are not a multi-GPU cluster's,
#      their caches (hit rates) are real. ROUTER_POLICIES: also one run per sglang-router policy on the same servers
#      (--router sglang-router; the package must be importable: PYTHONPATH, see bench/gpu/README.md).
# STAGES: which of seq, node, routing to run (default all three).
# SIM=1 runs every step on sim-servers on this machine (a check of the script, no GPU).
#   bash bench/gpu/prefix.sh                                               # 1 and 2
#   SERVERS=2 GPU_OF="0 0" MEM_FRACTION=0.4 bash bench/gpu/prefix.sh      # + routing on two servers sharing GPU 0
source bench/gpu/common.sh
SEQ_N=${SEQ_N:-120}; SEQ_RATE=${SEQ_RATE:-1.5}; DATA=${DATA:-tests/data/mooncake_synthetic_trace_last1000.jsonl.xz}
GROUPS_N=${GROUPS_N:-64}; PREFIX_LEN=${PREFIX_LEN:-2048}; QUESTION=${QUESTION:-256}; OUTPUT=${OUTPUT:-64}
N=${N:-600}; RATE=${RATE:-20}
SERVERS=${SERVERS:-0}; GPU_OF=${GPU_OF:-}; MEM_FRACTION=${MEM_FRACTION:-0.4}; PORT0=${PORT0:-30200}
POLICIES=${POLICIES:-"random round_robin prefix_hash cache_aware"}; ROUTER_POLICIES=${ROUTER_POLICIES:-}
STAGES=${STAGES:-"seq node routing"}
NAME=prefix
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
PY=${TB% -m tracebench}
trap 'pack; ls -la "$PACK_TO"' EXIT

$TB generate --dataset "$DATA" --dataset-format mooncake --in-order --num-requests "$SEQ_N" --arrival constant \
  --rate "$SEQ_RATE" -o "$RES/seq.jsonl"
$TB generate --workload shared-prompt --groups "$GROUPS_N" --prefix-len "$PREFIX_LEN" --group-dist uniform \
  --input-len "$QUESTION" --output-len "$OUTPUT" --rate "$RATE" --num-requests "$N" --seed 0 -o "$RES/shared.jsonl"
$TB inspect "$RES/shared.jsonl" > "$RES/shared-inspect.txt"
COMMON=(--out-dir "$RES" --quiet)
t0=$SECONDS

# start GPU PORT LOG [extra sglang args]: a server in its own session, then wait until it is healthy (servers sharing
# a GPU: each takes its memory before the next one measures what is free)
start() {
  local gpu=$1 port=$2 log=$3; shift 3
  if [ "${SIM:-0}" = 1 ]; then
    setsid $TB sim-server --port "$port" > "$log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$gpu setsid python3 -m sglang.launch_server --model-path "$MODEL" $SGL_ARGS \
      --skip-tokenizer-init --enable-metrics --host 127.0.0.1 --port "$port" "$@" > "$log" 2>&1 &
  fi
  echo $! > "$log.pid"
  wait_healthy "$port" "$log"
  curl -s "http://127.0.0.1:$port/server_info" > "$log.server_info.json"
}
attach_args() {  # attach_args PORT...: --attach URL for each, and what gives the vocabulary
  local out=()
  [ "${SIM:-0}" = 1 ] || out+=(--model "$MODEL")
  for port in "$@"; do out+=(--attach "http://127.0.0.1:$port"); done
  echo "${out[@]}"
}

if [[ " $STAGES " == *" seq "* || " $STAGES " == *" node "* ]]; then
  start 0 "$PORT0" "$RES/node-server.log"
  if [[ " $STAGES " == *" seq "* ]]; then
    $TB replay "$RES/seq.jsonl" $(attach_args "$PORT0") --run-name seq "${COMMON[@]}"
    $PY bench/prefix_check.py "$RES/seq" | tee "$RES/seq-check.txt" || echo "seq: cached_tokens differ from the trace (above)"
    echo "seq: $((SECONDS - t0)) s"; pack
  fi
  if [[ " $STAGES " == *" node "* ]]; then
    $TB replay "$RES/shared.jsonl" $(attach_args "$PORT0") --run-name node "${COMMON[@]}"
    echo "node: $((SECONDS - t0)) s"; pack
  fi
  stop_server "$RES/node-server.log"
fi

if [ "$SERVERS" -gt 0 ] && [[ " $STAGES " == *" routing "* ]]; then
  read -r -a gpus <<< "${GPU_OF:-$(seq -s ' ' 0 $((SERVERS - 1)))}"
  ports=()
  for ((i = 0; i < SERVERS; i++)); do
    ports+=($((PORT0 + 1 + i)))
    start "${gpus[$i]}" $((PORT0 + 1 + i)) "$RES/routing-server-$i.log" --mem-fraction-static "$MEM_FRACTION"
  done
  echo "routing servers up: $((SECONDS - t0)) s"
  for policy in $POLICIES; do
    $TB replay "$RES/shared.jsonl" $(attach_args "${ports[@]}") --policy "$policy" --run-name "routing-$policy" "${COMMON[@]}"
    echo "routing-$policy: $((SECONDS - t0)) s"; pack
  done
  for policy in $ROUTER_POLICIES; do
    $TB replay "$RES/shared.jsonl" $(attach_args "${ports[@]}") --router sglang-router --router-policy "$policy" \
      --run-name "routing-sglang-router-$policy" "${COMMON[@]}"
    echo "routing-sglang-router-$policy: $((SECONDS - t0)) s"; pack
  done
  for ((i = 0; i < SERVERS; i++)); do stop_server "$RES/routing-server-$i.log"; done
fi
