#!/usr/bin/env bash
# The two waits a run asks for, on real sglang (2026-11-26): a router cap's wait for a free slot (`slot_wait_s`) and
# static batching's wait for the batch (`batch_wait_s`) are the run's, not tracebench's (docs/overhead.md). One server
# on GPU 0 (started like h100_profile.sh's), one trace (N requests, 512 in / 128 out, Poisson RATE req/s, seed 0)
# replayed three ways: uncapped (the control: both waits 0), capped at CAP (requests wait for slots), static batches of
# BATCH. `tracebench report` on the three then shows each wait as its own stage and tracebench's own time apart.
# Results: $OUT/waits.tgz; ~5 minutes on one GPU (2.5 min start, three replays of ~35-60 s).
# SIM=1 runs it against a sim-server here (a check of the script).
source bench/gpu/common.sh
PORT=${PORT:-30100}; N=${N:-200}; RATE=${RATE:-6}; CAP=${CAP:-4}; BATCH=${BATCH:-8}
RES=$RES_ROOT/waits; mkdir -p "$RES"
trap 'tar -czf "$PACK_TO/waits.tgz" -C "$RES_ROOT" waits; ls -la "$PACK_TO"' EXIT
$TB generate --rate "$RATE" --num-requests "$N" --input-len 512 --output-len 128 --length-dist fixed --seed 0 \
  -o "$RES/trace.jsonl"
start_server 0 "$PORT" "$RES/server.log"
wait_healthy "$PORT" "$RES/server.log"
URL=http://127.0.0.1:$PORT
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=()
t0=$SECONDS
$TB replay "$RES/trace.jsonl" --attach "$URL" "${VOCAB[@]}" --run-name uncapped --out-dir "$RES" --quiet
$TB replay "$RES/trace.jsonl" --attach "$URL" "${VOCAB[@]}" --max-running-requests "$CAP" --run-name "cap$CAP" \
  --out-dir "$RES" --quiet
$TB replay "$RES/trace.jsonl" --attach "$URL" "${VOCAB[@]}" --mode static --batch-size "$BATCH" \
  --run-name "static$BATCH" --out-dir "$RES" --quiet
echo "three replays: $((SECONDS - t0)) s"
stop_server "$RES/server.log"
