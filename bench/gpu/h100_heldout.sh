#!/usr/bin/env bash
# A longer held-out routing run on two H100s (issue 19 part 3, 2026-11-26): the whole Mooncake slice (ROUTING_N 1,000
# requests, in order, Poisson ROUTING_RATE 6.1 req/s, seed 2), round_robin, no cap, on two servers started like
# h100_profile.sh's (GPU i, port PORT0+i, sglang defaults + --enable-metrics). The profile llama-2-7b-h100-triton is
# fitted before this run and reads nothing of it. Why: the first held-out routing run has 400 requests, so its TTFT
# p99 is the 4th largest TTFT and one pair of requests prefilled together or apart moves it by ~5%; 1,000 requests put
# 10 requests above the p99. Stops at once (exit 3) when the GPUs are not H100s. Results: $OUT/h100heldout.tgz.
# Ran 2026-11-26 on two H100s (332 s): reports/examples/h100-sim-vs-real/routing-long-1000/routing-long-round_robin.
# ONE_GPU=1: the same workload on ONE H100, one server at a time (made while requests for two H100s were given
# H200s). With round_robin and no cap, the router sends request i to server i mod 2 at its arrival whatever the servers
# do, so each server of the two-GPU run replays a fixed half of the trace: bench/split_trace.py writes the halves, each
# replayed on the one server (attached, its cache flushed first: --flush-cache, the default), half 0 then half 1. What
# differs: one physical card, and the client drives one server at a time. bench/sim_vs_real.py --pool compares the
# halves together with the simulator's. Results: $OUT/h100halves.tgz; ~8 minutes (2 min start, 2 x ~2.8 min replays).
# SIM=1 runs it against sim-servers here (a check of the script; ROUTING_N=40 keeps it short). Two GPUs: ~5 minutes.
source bench/gpu/common.sh
PORT0=${PORT0:-30100}; ROUTING_N=${ROUTING_N:-1000}; ROUTING_RATE=${ROUTING_RATE:-6.1}
DATA=tests/data/mooncake_synthetic_trace_last1000.jsonl.xz
GPUS=2; NAME=h100heldout
if [ "${ONE_GPU:-0}" = 1 ]; then GPUS=1; NAME=h100halves; fi
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
if [ "${SIM:-0}" != 1 ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | head -$GPUS | grep -q "H100"; then
  echo "not H100s: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -$GPUS | tr '\n' ' ')"; exit 3
fi
trap 'pack; ls -la "$PACK_TO"' EXIT
$TB generate --dataset "$DATA" --dataset-format mooncake --in-order --rate "$ROUTING_RATE" --num-requests "$ROUTING_N" \
  --seed 2 -o "$RES/mooncake-routing-long.jsonl"
t0=$SECONDS
for ((i = 0; i < GPUS; i++)); do start_server "$i" $((PORT0 + i)) "$RES/server-$i.log"; done
for ((i = 0; i < GPUS; i++)); do wait_healthy $((PORT0 + i)) "$RES/server-$i.log"; done
echo "servers healthy: $((SECONDS - t0)) s"
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=()
if [ "$GPUS" = 2 ]; then
  $TB replay "$RES/mooncake-routing-long.jsonl" --attach "http://127.0.0.1:$PORT0" --attach "http://127.0.0.1:$((PORT0 + 1))" \
    "${VOCAB[@]}" --policy round_robin --run-name routing-long-round_robin --out-dir "$RES" --quiet
  echo "routing run: $((SECONDS - t0)) s"
else
  python3 bench/split_trace.py "$RES/mooncake-routing-long.jsonl" --parts 2 --out-dir "$RES"
  for part in 0 1; do
    $TB replay "$RES/mooncake-routing-long.part${part}of2.jsonl" --attach "http://127.0.0.1:$PORT0" "${VOCAB[@]}" \
      --policy round_robin --flush-cache --run-name "routing-long-part${part}of2" --out-dir "$RES" --quiet
    echo "part $part: $((SECONDS - t0)) s"
  done
fi
for ((i = 0; i < GPUS; i++)); do stop_server "$RES/server-$i.log"; done
