#!/usr/bin/env bash
# Issue 6, step 3, on two GPUs. Run from the repository root on the device; results: $OUT/routing.tgz
# A trace derived from the Azure conversation trace (its lengths, Poisson arrivals at $RATE), replayed on two
# llama-2-7b servers with a per-server router cap of $CAP:
#   random (tracebench launches both servers itself: --backend sglang --gpus 2), then, on two servers started once
#   and attached: round_robin, sjf, param_aware, and random with the cap lowered mid-run (30 s: 4 per server).
source bench/gpu/common.sh
RATE=${RATE:-16}; N=${N:-720}; CAP=${CAP:-24}
RES=$RES_ROOT/routing; mkdir -p "$RES"
pack() { tar -czf "$PACK_TO/routing.tgz" -C "$RES_ROOT" routing; }  # after every run: a call cut short keeps what ran
trap 'pack; ls -la "$PACK_TO"' EXIT
$TB generate --dataset .carry/AzureLLMInferenceTrace_conv.csv --rate "$RATE" --num-requests "$N" --seed 0 \
  -o "$RES/azure.jsonl"
COMMON=(--max-running-requests "$CAP" --out-dir "$RES" --quiet)

if [ "${SIM:-0}" = 1 ]; then
  $TB replay "$RES/azure.jsonl" --backend sim --gpus 2 --policy random --run-name random "${COMMON[@]}"
else
  $TB replay "$RES/azure.jsonl" --backend sglang --gpus 2 --model "$MODEL" --server-arg "$SGL_ARGS" --policy random \
    --run-name random "${COMMON[@]}"
fi
pack

start_server 0 30100 "$RES/server-0.log"
start_server 1 30101 "$RES/server-1.log"
wait_healthy 30100 "$RES/server-0.log"
wait_healthy 30101 "$RES/server-1.log"
ATTACH=(--attach http://127.0.0.1:30100 --attach http://127.0.0.1:30101 --model "$MODEL")
for policy in round_robin sjf param_aware; do
  $TB replay "$RES/azure.jsonl" "${ATTACH[@]}" --policy $policy --run-name $policy "${COMMON[@]}"
  pack
done
$TB replay "$RES/azure.jsonl" "${ATTACH[@]}" --policy random --cap-schedule "15s:8,30s:24" --run-name random-cap8-15s-30s \
  "${COMMON[@]}"
stop_server "$RES/server-0.log"
stop_server "$RES/server-1.log"
