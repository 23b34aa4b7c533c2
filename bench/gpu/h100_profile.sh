#!/usr/bin/env bash
# The H100 profile's measurements and its held-out runs (issue 19 part 3), on 2 GPUs in one call; results:
# $OUT/h100.tgz. Two servers started once (GPU i, port PORT0+i, sglang defaults + --enable-metrics):
#   1. at the same time, on different GPUs: bench/gpu/calibrate.py on server 1 (one request at a time: prefill,
#      decode, prefix-cache series, the context clip) and the held-out node run on server 0 (a Mooncake slice:
#      ~3.4k-token prompts, 17% prefix hits at this cache size, NODE_N requests at NODE_RATE req/s);
#   2. the fit's decode run on both servers (Azure conversation lengths, round_robin, cap 24: long outputs, the
#      decode cost per KV token);
#   3. the held-out routing run on both servers (the Mooncake slice at ROUTING_RATE req/s, round_robin, no cap).
# Held-out means: no run of 1 or 3 is used by the fit (tracebench/sim/fit.py), only to compare the simulator with.
# SIM=1 runs it on sim-servers here (a check of the script). About 7 minutes on H100s after start-up.
source bench/gpu/common.sh
PORT0=${PORT0:-30100}; NODE_N=${NODE_N:-300}; NODE_RATE=${NODE_RATE:-3.1}
ROUTING_N=${ROUTING_N:-400}; ROUTING_RATE=${ROUTING_RATE:-6.1}; FIT_N=${FIT_N:-720}; FIT_RATE=${FIT_RATE:-16}
DATA=tests/data/mooncake_synthetic_trace_last1000.jsonl.xz
NAME=h100
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
trap 'pack; ls -la "$PACK_TO"' EXIT
# llama-2's context is 4096 (generate's default): sglang generates the whole output only when input + output <= 4094,
# which is what generate's clamp keeps. (The traces of 2026-11-25 were made by that day's clamp with --max-context
# 4094: long prompts cut to 4087 tokens + 7 output; today's default cuts them to 4089 + 5. Both fit sglang's rule.)
MOON=(--dataset "$DATA" --dataset-format mooncake --in-order)
$TB generate "${MOON[@]}" --rate "$NODE_RATE" --num-requests "$NODE_N" --seed 0 -o "$RES/mooncake-node.jsonl"
$TB generate "${MOON[@]}" --rate "$ROUTING_RATE" --num-requests "$ROUTING_N" --seed 1 -o "$RES/mooncake-routing.jsonl"
$TB generate --dataset tests/data/AzureLLMInferenceTrace_conv.csv.xz --rate "$FIT_RATE" --num-requests "$FIT_N" --seed 0 \
  -o "$RES/azure-fit.jsonl"
PY=${TB% -m tracebench}
t0=$SECONDS
for i in 0 1; do start_server "$i" $((PORT0 + i)) "$RES/server-$i.log"; done
for i in 0 1; do wait_healthy $((PORT0 + i)) "$RES/server-$i.log"; done
for i in 0 1; do curl -s "http://127.0.0.1:$((PORT0 + i))/server_info" > "$RES/server-$i.server_info.json"; done
echo "servers healthy: $((SECONDS - t0)) s"
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=()
S0=http://127.0.0.1:$PORT0; S1=http://127.0.0.1:$((PORT0 + 1))
QUICK=(); [ "${SIM:-0}" = 1 ] && QUICK=(--quick)
$PY bench/gpu/calibrate.py "$S1" "$RES/calibration-h100.json" "${QUICK[@]}" > "$RES/calibrate.log" 2>&1 &
CAL=$!
$TB replay "$RES/mooncake-node.jsonl" --attach "$S0" "${VOCAB[@]}" --run-name node-mooncake --out-dir "$RES" --quiet
wait $CAL; cat "$RES/calibrate.log"
echo "calibration + node run: $((SECONDS - t0)) s"; pack
$TB replay "$RES/azure-fit.jsonl" --attach "$S0" --attach "$S1" "${VOCAB[@]}" --policy round_robin \
  --max-running-requests 24 --run-name fit-azure-round_robin --out-dir "$RES" --quiet
echo "fit run: $((SECONDS - t0)) s"; pack
$TB replay "$RES/mooncake-routing.jsonl" --attach "$S0" --attach "$S1" "${VOCAB[@]}" --policy round_robin \
  --run-name routing-mooncake-round_robin --out-dir "$RES" --quiet
echo "routing run: $((SECONDS - t0)) s"
for i in 0 1; do stop_server "$RES/server-$i.log"; done
