#!/usr/bin/env bash
# Issue 13 on real GPUs: sglang-router 0.3.2 vs tracebench's policies, one trace, $GPUS sglang servers started once and
# attached. Run from the repository root on the device; results: $OUT/router-<GPUS>g.tgz
# The device has no network and the router wheel (30 MB) does not fit in one carry with the sglang overlay (53 MiB):
#   1. install call, carrying only the wheel (downloaded here: pip download sglang-router==0.3.2 --no-deps -d .carry/):
#        STEP=install bash bench/gpu/router.sh        # pip install --no-deps into /opt/sglang-router
#   2. within the machine's warm period, the run call, carrying .carry/ with the overlay (not the wheel):
#        GPUS=4 TRACE=path bash bench/gpu/router.sh
# Runs: sglang-router --router-policy each of $ROUTER_POLICIES, then tracebench --policy each of $POLICIES.
# SIM=1 runs the same steps on sim-servers here (installs nothing; the venv's router is used).
if [ "${STEP:-run}" = install ]; then
  set -euo pipefail
  wheel=$(ls .carry/sglang_router-0.3.2-*.whl)
  python3 -m pip install --no-deps --no-index --target /opt/sglang-router "$wheel"
  ls /opt/sglang-router
  exit 0
fi
source bench/gpu/common.sh
[ "${SIM:-0}" = 1 ] || export PYTHONPATH=/opt/sglang-router:$PYTHONPATH
GPUS=${GPUS:-4}; RATE=${RATE:-16}; N=${N:-720}; TRACE=${TRACE:-}; PORT0=${PORT0:-30300}
ROUTER_POLICIES=${ROUTER_POLICIES:-"cache_aware round_robin random"}
POLICIES=${POLICIES:-"cache_aware prefix_hash random"}
NAME=router-${GPUS}g
RES=$RES_ROOT/$NAME; mkdir -p "$RES"
pack() {
  for log in $(find "$RES" -name '*.log'); do tail -n 200 "$log" > "$log.tail" && mv "$log.tail" "$log"; done
  tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"
}
trap 'pack; ls -la "$PACK_TO"' EXIT
if [ -n "$TRACE" ]; then
  cp "$TRACE" "$RES/trace.jsonl"
else
  $TB generate --dataset tests/data/AzureLLMInferenceTrace_conv.csv --rate "$RATE" --num-requests "$N" --seed 0 \
    -o "$RES/trace.jsonl"
fi
ATTACH=(--model "$MODEL")
[ "${SIM:-0}" = 1 ] && ATTACH=()
for ((i = 0; i < GPUS; i++)); do
  start_server "$i" $((PORT0 + i)) "$RES/attached-server-$i.log"
  ATTACH+=(--attach "http://127.0.0.1:$((PORT0 + i))")
done
for ((i = 0; i < GPUS; i++)); do wait_healthy $((PORT0 + i)) "$RES/attached-server-$i.log"; done
COMMON=(--out-dir "$RES" --quiet)
t0=$SECONDS
for policy in $ROUTER_POLICIES; do
  $TB replay "$RES/trace.jsonl" "${ATTACH[@]}" --router sglang-router --router-policy "$policy" \
    --run-name "sglang-router-$policy" "${COMMON[@]}"
  echo "sglang-router-$policy: $((SECONDS - t0)) s"; pack
done
for policy in $POLICIES; do
  $TB replay "$RES/trace.jsonl" "${ATTACH[@]}" --policy "$policy" --run-name "tracebench-$policy" "${COMMON[@]}"
  echo "tracebench-$policy: $((SECONDS - t0)) s"; pack
done
for ((i = 0; i < GPUS; i++)); do stop_server "$RES/attached-server-$i.log"; done
