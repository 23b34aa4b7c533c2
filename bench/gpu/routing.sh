#!/usr/bin/env bash
# Routing level on GPUS GPUs (issue 6 on two, issue 11 on four). Run from the repository root on the device;
# results: $OUT/routing-<GPUS>g.tgz
#   random (tracebench launches the servers itself: --backend sglang --gpus $GPUS), then, on $GPUS servers started once
#   and attached: each policy of $POLICIES, and (CAP_RUN=1) random with the cap lowered mid-run (15 s: 8 per server,
#   30 s: back to $CAP).
# The trace: TRACE=path (an existing trace), or one derived from the Azure conversation trace (its lengths, Poisson
# arrivals at $RATE, $N requests).
# Examples:
#   GPUS=2 bash bench/gpu/routing.sh                                     # issue 6 (h200x2-routing)
#   xz -dk reports/examples/sim4-routing/azure4.jsonl.xz; GPUS=4 TRACE=reports/examples/sim4-routing/azure4.jsonl POLICIES="round_robin sjf param_aware power_of_two" \
#     CAP_RUN=0 bash bench/gpu/routing.sh                                # issue 11 (h200x4-routing)
source bench/gpu/common.sh
GPUS=${GPUS:-2}; RATE=${RATE:-16}; N=${N:-720}; CAP=${CAP:-24}; TRACE=${TRACE:-}
POLICIES=${POLICIES:-"round_robin sjf param_aware"}; CAP_RUN=${CAP_RUN:-1}; PORT0=${PORT0:-30100}
PORT_LAUNCH=${PORT_LAUNCH:-30000}  # the launched run's servers: PORT_LAUNCH + i (attached ones: PORT0 + i)
NAME=routing-${GPUS}g
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
# after every run: a call cut short keeps what ran (server logs cut to their last 200 lines: size)
trap 'pack; ls -la "$PACK_TO"' EXIT
if [ -n "$TRACE" ]; then
  cp "$TRACE" "$RES/trace.jsonl"
else
  $TB generate --dataset tests/data/AzureLLMInferenceTrace_conv.csv.xz --rate "$RATE" --num-requests "$N" --seed 0 \
    -o "$RES/trace.jsonl"
fi
COMMON=(--max-running-requests "$CAP" --out-dir "$RES" --quiet)

t0=$SECONDS
if [ "${SIM:-0}" = 1 ]; then
  $TB replay "$RES/trace.jsonl" --backend sim --gpus "$GPUS" --port-base "$PORT_LAUNCH" --policy random \
    --run-name random "${COMMON[@]}"
else
  $TB replay "$RES/trace.jsonl" --backend sglang --gpus "$GPUS" --port-base "$PORT_LAUNCH" --model "$MODEL" \
    --server-arg "$SGL_ARGS" --policy random --run-name random "${COMMON[@]}"
fi
echo "launched random run: $((SECONDS - t0)) s (server start-up included)"
pack

ATTACH=(--model "$MODEL")
for ((i = 0; i < GPUS; i++)); do
  start_server "$i" $((PORT0 + i)) "$RES/attached-server-$i.log"
  ATTACH+=(--attach "http://127.0.0.1:$((PORT0 + i))")
done
for ((i = 0; i < GPUS; i++)); do wait_healthy $((PORT0 + i)) "$RES/attached-server-$i.log"; done
for policy in $POLICIES; do
  $TB replay "$RES/trace.jsonl" "${ATTACH[@]}" --policy "$policy" --run-name "$policy" "${COMMON[@]}"
  pack
done
if [ "$CAP_RUN" = 1 ]; then
  $TB replay "$RES/trace.jsonl" "${ATTACH[@]}" --policy random --cap-schedule "15s:8,30s:$CAP" \
    --run-name random-cap8-15s-30s "${COMMON[@]}"
fi
for ((i = 0; i < GPUS; i++)); do stop_server "$RES/attached-server-$i.log"; done
