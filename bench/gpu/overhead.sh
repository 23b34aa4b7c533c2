#!/usr/bin/env bash
# Where a request's time goes, and how much of it is tracebench's (issue 19 part 2; docs/overhead.md). On the two
# servers of PORT0 and PORT0+1 (already running: h100_profile.sh's; START=1 starts them here, as SIM=1 does), the
# routing Mooncake workload (h100_profile.sh's routing trace: N requests of ~3.5k-token prompts at RATE req/s) is
# replayed three times, one after the other, each from an empty prefix cache:
#   (a) plainly: `tracebench replay --attach S0 --attach S1 --policy round_robin` (the figures of record);
#   (b) the same under py-spy (`record --format raw --idle --nonblocking`, PYSPY_RATE samples/s): where the replay
#       process spends its time. A run of its own, so the profiler changes nothing in (a);
#   (c) bench/gpu/raw_client.py: a minimal aiohttp client, the same ids, arrivals and servers in turn, stamping the
#       same moments (RAW="aiohttp socket" adds hand-written HTTP on asyncio streams, one more run).
# Then bench/gpu/overhead_compare.py writes summary.md (printed at the end): the breakdown per source, the spans every
# source has, and the profile's groups and top frames. Results: $OUT/overhead.tgz (run folders, raw_*.jsonl,
# pyspy.txt, summary.md, env.txt). About 3.5 minutes at the defaults (3 x 66 s of load + ~10 s); py-spy is looked
# for on PATH, then under /opt/pyspy (where the lead installs the py_spy-0.4.3 wheel); without it (b) is skipped.
# KEEP_SERVERS=1 (common.sh): servers already answering /health on PORT0 and PORT0+1 are used as they are (started
# by an earlier call of the machine session), others are started, and none is stopped at the end.
# Checked here with `SIM=1 N=60 RATE=20 bash bench/gpu/overhead.sh` (two sim-servers started and stopped by it).
source bench/gpu/common.sh
PORT0=${PORT0:-30100}; N=${N:-400}; RATE=${RATE:-6.1}; RAW=${RAW:-aiohttp}; PYSPY_RATE=${PYSPY_RATE:-250}
START=${START:-${SIM:-0}}; [ "${KEEP_SERVERS:-0}" = 1 ] && START=1  # start_server reuses a healthy one
NAME=overhead
RES=$RES_ROOT/$NAME; rm -rf "$RES"; mkdir -p "$RES"  # this script's own folder: a second call starts afresh
trap 'tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"; ls -la "$PACK_TO"' EXIT
PY=${TB% -m tracebench}
S0=http://127.0.0.1:$PORT0; S1=http://127.0.0.1:$((PORT0 + 1))
if [ "$START" = 1 ]; then
  for i in 0 1; do start_server "$i" $((PORT0 + i)) "$RES/server-$i.log"; done
  for i in 0 1; do wait_healthy $((PORT0 + i)) "$RES/server-$i.log"; done
  trap 'for i in 0 1; do stop_server "$RES/server-$i.log"; done; tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"; ls -la "$PACK_TO"' EXIT
fi
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=(--vocab-size 32000)
PYSPY=${PYSPY:-$(command -v py-spy || echo /opt/pyspy/bin/py-spy)}
{ echo "date: $(date -u +%FT%TZ)"; uname -srm; nproc; $PY -V
  $PY -c 'import aiohttp, orjson, numpy; print("aiohttp", aiohttp.__version__, "orjson", orjson.__version__, "numpy", numpy.__version__)'
  [ -x "$PYSPY" ] && "$PYSPY" --version || echo "py-spy: not found ($PYSPY)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; uptime; } > "$RES/env.txt" 2>&1
cat "$RES/env.txt"
$TB generate --dataset tests/data/mooncake_synthetic_trace_last1000.jsonl.xz --dataset-format mooncake --in-order \
  --rate "$RATE" --num-requests "$N" --seed 1 -o "$RES/trace.jsonl"
REPLAY=(replay "$RES/trace.jsonl" --attach "$S0" --attach "$S1" "${VOCAB[@]}" --policy round_robin --out-dir "$RES" --quiet)
t0=$SECONDS
$TB "${REPLAY[@]}" --run-name overhead-plain
echo "(a) plain: $((SECONDS - t0)) s"
RUNS=(--run "tracebench=$RES/overhead-plain")
if [ -x "$PYSPY" ]; then
  "$PYSPY" record --rate "$PYSPY_RATE" --nonblocking --idle --format raw -o "$RES/pyspy.txt" -- \
    $TB "${REPLAY[@]}" --run-name overhead-pyspy > "$RES/pyspy.log" 2>&1 || echo "py-spy run failed: $(tail -5 "$RES/pyspy.log")"
  # py-spy may be refused (no ptrace in the container): the rest of the summary is made without (b)
  if [ -s "$RES/overhead-pyspy/requests.jsonl" ]; then RUNS+=(--run "under-py-spy=$RES/overhead-pyspy"); fi
else
  echo "py-spy not found ($PYSPY): (b) skipped" | tee "$RES/pyspy.log"
fi
echo "(b) py-spy: $((SECONDS - t0)) s"
RAWS=()
for http in $RAW; do
  $PY bench/gpu/raw_client.py "$RES/trace.jsonl" --attach "$S0" --attach "$S1" "${VOCAB[@]}" --http "$http" \
    --out "$RES/raw-$http.jsonl"
  RAWS+=(--raw "raw-$http=$RES/raw-$http.jsonl")
  echo "(c) raw $http: $((SECONDS - t0)) s"
done
PROFILE=(); if [ -s "$RES/pyspy.txt" ]; then PROFILE=(--profile "$RES/pyspy.txt"); fi
$PY bench/gpu/overhead_compare.py "${RUNS[@]}" "${RAWS[@]}" "${PROFILE[@]}" > "$RES/summary.md"
cat "$RES/summary.md"
