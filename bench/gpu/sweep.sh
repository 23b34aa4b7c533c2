#!/usr/bin/env bash
# Issue 22 on GPUs: one 4-point rate sweep and one capacity search on 2 servers started once (GPU 0 and 1) and
# attached, each point POINT_S seconds of arrivals (the trace rescaled to the point's rate; a point found
# over-saturated stops early, --saturation-window WINDOW). Run from the repository root on the device (nvidia-h100-x2
# or nvidia-h200-x2, carry .carry); results: $OUT/sweep.tgz (the two sweep folders: summary.csv/json,
# load-latency.html/png, traces/, one run folder per point; the terminal summaries; timing.txt).
# SIM=1 runs the same steps on two sim-servers on this machine (real time: as long as on the GPUs).
# Examples:
#   bash bench/gpu/sweep.sh
#   SIM=1 bash bench/gpu/sweep.sh
#   RATES=10,20,40,80 START=30 POINT_S=30 bash bench/gpu/sweep.sh
source bench/gpu/common.sh
RATES=${RATES:-15,30,60,120}; POINT_S=${POINT_S:-25}; WINDOW=${WINDOW:-8}; SLO=${SLO:-ttft=500ms,tpot=50ms}
START=${START:-40}; MAX_POINTS=${MAX_POINTS:-5}; TOL=${TOL:-0.15}; POLICY=${POLICY:-round_robin}
PORT0=${PORT0:-30200}
NAME=sweep
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
# after each sweep: a call cut short keeps what ran (server logs cut to their last 200 lines: size)
trap 'for i in 0 1; do [ -f "$RES/server-$i.log.pid" ] && stop_server "$RES/server-$i.log"; done; pack; ls -la "$PACK_TO"' EXIT

# Poisson arrivals, 512 in / 128 out (lognormal), enough requests for POINT_S seconds at the rate sweep's highest
# rate and at 4 x START (a search that doubles further gets shorter points: its summary warns)
top=$(python3 -c "print(max(max(float(r) for r in '$RATES'.split(',')), 4 * $START))")
N=$(python3 -c "print(int($top * $POINT_S) + 50)")
$TB generate --rate 20 --num-requests "$N" --seed 0 -o "$RES/trace.jsonl"

t0=$SECONDS
ATTACH=()
for i in 0 1; do
  start_server "$i" $((PORT0 + i)) "$RES/server-$i.log"
  ATTACH+=(--attach "http://127.0.0.1:$((PORT0 + i))")
done
for i in 0 1; do wait_healthy $((PORT0 + i)) "$RES/server-$i.log"; done
echo "servers healthy: $((SECONDS - t0)) s" | tee "$RES/timing.txt"
# the simulators report their vocabulary; real sglang needs the model folder for it
[ "${SIM:-0}" = 1 ] || ATTACH+=(--model "$MODEL")
COMMON=(--policy "$POLICY" --point-duration "$POINT_S" --saturation-window "$WINDOW" --slo "$SLO" --out-dir "$RES"
        --quiet)

t1=$SECONDS
$TB sweep "$RES/trace.jsonl" --rates "$RATES" "${ATTACH[@]}" "${COMMON[@]}" --name rates | tee "$RES/rates.txt"
echo "rate sweep ($RATES req/s, $POINT_S s points): $((SECONDS - t1)) s" | tee -a "$RES/timing.txt"
pack

t2=$SECONDS
$TB sweep "$RES/trace.jsonl" --find-max-rate --start-rate "$START" --rate-tolerance "$TOL" --max-points "$MAX_POINTS" \
  "${ATTACH[@]}" "${COMMON[@]}" --name capacity | tee "$RES/capacity.txt"
echo "capacity search (start $START req/s, at most $MAX_POINTS points): $((SECONDS - t2)) s" | tee -a "$RES/timing.txt"
echo "total: $((SECONDS - t0)) s" | tee -a "$RES/timing.txt"
