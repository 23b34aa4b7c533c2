#!/usr/bin/env bash
# The 1,000-request held-out routing run of h100_heldout.sh on ONE H100, one server at a time (issue 19 part 3,
# 2026-11-26: every request for two H100s was given H200s). With round_robin and no cap, tracebench's router sends
# request i to server i mod 2 at its arrival whatever the servers do, so each server of the two-GPU run replays a fixed
# half of the trace: bench/split_trace.py writes the halves, and each is replayed on the one server (attached, its
# cache flushed first: --flush-cache, the default), half 0 then half 1. Each server sees what it would have seen in the
# two-GPU run; what differs: one physical card instead of two, and the client drives one server at a time.
# bench/sim_vs_real.py --pool compares the two halves' records together with the simulator's. Stops at once (exit 3)
# when GPU 0 is not an H100. Results: $OUT/h100halves.tgz. SIM=1 runs it against a sim-server here (ROUTING_N=40
# keeps it short). ~8 minutes on a GPU (2 min start, 2 x ~2.8 min replays).
source bench/gpu/common.sh
PORT0=${PORT0:-30100}; ROUTING_N=${ROUTING_N:-1000}; ROUTING_RATE=${ROUTING_RATE:-6.1}
DATA=tests/data/mooncake_synthetic_trace_last1000.jsonl.xz
NAME=h100halves
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
if [ "${SIM:-0}" != 1 ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q "H100"; then
  echo "not an H100: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; exit 3
fi
trap 'pack; ls -la "$PACK_TO"' EXIT
$TB generate --dataset "$DATA" --dataset-format mooncake --in-order --rate "$ROUTING_RATE" --num-requests "$ROUTING_N" \
  --seed 2 -o "$RES/mooncake-routing-long.jsonl"
python3 bench/split_trace.py "$RES/mooncake-routing-long.jsonl" --parts 2 --out-dir "$RES"
t0=$SECONDS
start_server 0 "$PORT0" "$RES/server-0.log"
wait_healthy "$PORT0" "$RES/server-0.log"
echo "server healthy: $((SECONDS - t0)) s"
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=()
for part in 0 1; do
  $TB replay "$RES/mooncake-routing-long.part${part}of2.jsonl" --attach "http://127.0.0.1:$PORT0" "${VOCAB[@]}" \
    --policy round_robin --flush-cache --run-name "routing-long-part${part}of2" --out-dir "$RES" --quiet
  echo "part $part: $((SECONDS - t0)) s"
done
stop_server "$RES/server-0.log"
