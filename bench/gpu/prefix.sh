#!/usr/bin/env bash
# Shared prefixes on real sglang (issue 12). Run from the repository root on the device; results: $OUT/prefix.tgz
#   1. seq: the first $SEQ_N requests of a Mooncake-derived trace one at a time (constant $SEQ_RATE req/s: no two
#      prefills share a batch) on one launched server: sglang's cached_tokens must equal the leading tokens already
#      sent (bench/prefix_check.py checks it, request by request).
#   2. node: $N requests of the same trace at its own arrival times sped up $TIME_SCALE times, one launched server.
#   3. routing (SERVERS > 0): $SERVERS servers, each with --mem-fraction-static $MEM_FRACTION, on the GPUs given by
#      GPU_OF (default: server i on GPU i; "0 0" puts two servers on GPU 0 when only one GPU is lent), attached, one
#      run per policy of $POLICIES.
# The trace comes from tests/data/mooncake_synthetic_slice.jsonl (the Mooncake synthetic trace, Apache-2.0), clamped
# to llama-2's 4,096-token context by `tracebench generate` (prefix blocks cut to match).
# SIM=1 runs every step on sim-servers on this machine (a check of the script, no GPU).
#   bash bench/gpu/prefix.sh                                   # seq + node on one GPU
#   SERVERS=2 GPU_OF="0 0" MEM_FRACTION=0.4 bash bench/gpu/prefix.sh   # + two servers sharing one GPU
source bench/gpu/common.sh
SEQ_N=${SEQ_N:-120}; SEQ_RATE=${SEQ_RATE:-1.5}; N=${N:-600}; TIME_SCALE=${TIME_SCALE:-4}
SERVERS=${SERVERS:-0}; GPU_OF=${GPU_OF:-}; MEM_FRACTION=${MEM_FRACTION:-0.85}; PORT0=${PORT0:-30200}
POLICIES=${POLICIES:-"random round_robin prefix_hash cache_aware"}
DATA=${DATA:-tests/data/mooncake_synthetic_slice.jsonl}
NAME=prefix
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
pack() {
  for log in $(find "$RES" -name '*.log'); do tail -n 200 "$log" > "$log.tail" && mv "$log.tail" "$log"; done
  tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"
}
trap 'pack; ls -la "$PACK_TO"' EXIT

$TB generate --dataset "$DATA" --dataset-format mooncake --in-order --num-requests "$SEQ_N" --arrival constant \
  --rate "$SEQ_RATE" -o "$RES/seq.jsonl"
$TB generate --dataset "$DATA" --dataset-format mooncake --keep-timestamps --time-scale "$TIME_SCALE" \
  --num-requests "$N" -o "$RES/node.jsonl"
COMMON=(--out-dir "$RES" --quiet)
launch() {  # launch RUN_NAME TRACE: one server launched by tracebench
  if [ "${SIM:-0}" = 1 ]; then
    $TB replay "$2" --backend sim --run-name "$1" "${COMMON[@]}"
  else
    $TB replay "$2" --backend sglang --model "$MODEL" --server-arg "$SGL_ARGS" --run-name "$1" "${COMMON[@]}"
  fi
}
t0=$SECONDS
launch seq "$RES/seq.jsonl"
${TB% -m tracebench} bench/prefix_check.py "$RES/seq" | tee "$RES/seq-check.txt"
echo "seq: $((SECONDS - t0)) s"; pack
launch node "$RES/node.jsonl"
echo "node: $((SECONDS - t0)) s"; pack

if [ "$SERVERS" -gt 0 ]; then
  read -r -a gpus <<< "${GPU_OF:-$(seq -s ' ' 0 $((SERVERS - 1)))}"
  ATTACH=(--model "$MODEL")
  for ((i = 0; i < SERVERS; i++)); do
    if [ "${SIM:-0}" = 1 ]; then
      start_server "${gpus[$i]}" $((PORT0 + i)) "$RES/attached-server-$i.log"
    else
      CUDA_VISIBLE_DEVICES=${gpus[$i]} setsid python3 -m sglang.launch_server --model-path "$MODEL" $SGL_ARGS \
        --skip-tokenizer-init --enable-metrics --mem-fraction-static "$MEM_FRACTION" --host 127.0.0.1 \
        --port $((PORT0 + i)) > "$RES/attached-server-$i.log" 2>&1 &
      echo $! > "$RES/attached-server-$i.log.pid"
      # servers sharing a GPU: each takes its memory before the next one measures what is free
      wait_healthy $((PORT0 + i)) "$RES/attached-server-$i.log"
    fi
    ATTACH+=(--attach "http://127.0.0.1:$((PORT0 + i))")
  done
  [ "${SIM:-0}" = 1 ] && ATTACH=("${ATTACH[@]:2}")
  for ((i = 0; i < SERVERS; i++)); do wait_healthy $((PORT0 + i)) "$RES/attached-server-$i.log"; done
  for ((i = 0; i < SERVERS; i++)); do
    curl -s "http://127.0.0.1:$((PORT0 + i))/server_info" > "$RES/attached-server-$i.server_info.json"
  done
  for policy in $POLICIES; do
    $TB replay "$RES/node.jsonl" "${ATTACH[@]}" --policy "$policy" --run-name "routing-$policy" "${COMMON[@]}"
    echo "routing-$policy: $((SECONDS - t0)) s"; pack
  done
  for ((i = 0; i < SERVERS; i++)); do stop_server "$RES/attached-server-$i.log"; done
fi
