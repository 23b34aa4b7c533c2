#!/usr/bin/env bash
# Issue 13: sglang's own router vs tracebench's policies, same trace, same (simulated) servers. CPU only.
# One shared-prompt trace (issue 12: --workload shared-prompt), replayed on $GPUS sim-servers (--speed $SPEED, the
# simulated prefix cache) through:
#   sglang-router 0.3.2 --policy cache_aware | round_robin | random     (--router sglang-router)
#   tracebench's cache_aware | prefix_hash | random                      (--policy)
# then one report of all runs (hit rate, TTFT, total latency, per-server balance) in $OUT_DIR.
# Needs: the extra `tracebench[router]` (make venv installs it), and issue 12 merged (the shared-prompt generator,
# the prefix-cache sim, the cache_aware and prefix_hash policies). Give TRACE=path to replay a trace of your own.
#   bash bench/router_comparison.sh
#   N=4000 RATE=40 GPUS=4 bash bench/router_comparison.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TB=".venv/bin/python -m tracebench"
N=${N:-2000}; RATE=${RATE:-30}; SEED=${SEED:-0}; GPUS=${GPUS:-4}; SPEED=${SPEED:-4}
PROMPT_GROUPS=${PROMPT_GROUPS:-16}; PREFIX_LEN=${PREFIX_LEN:-1024}; BLOCK=${BLOCK:-64}
PORT_BASE=${PORT_BASE:-30400}  # sim-server i listens on PORT_BASE + i
ROUTER_POLICIES=${ROUTER_POLICIES:-"cache_aware round_robin random"}
POLICIES=${POLICIES:-"cache_aware prefix_hash random"}
STAMP=$(date +%Y%m%d-%H%M%S)
OUT_DIR=${OUT_DIR:-reports/examples/router-comparison}
RUNS=${RUNS:-$(mktemp -d -t tracebench-router-comparison-$STAMP-XXXX)}
mkdir -p "$OUT_DIR" "$RUNS"

TRACE=${TRACE:-}
if [ -z "$TRACE" ]; then
  TRACE=$RUNS/shared-prompt.jsonl
  $TB generate --workload shared-prompt --groups "$PROMPT_GROUPS" --prefix-len "$PREFIX_LEN" --block-size "$BLOCK" \
    --num-requests "$N" --rate "$RATE" --seed "$SEED" -o "$TRACE"
fi
$TB inspect "$TRACE" | tee "$RUNS/inspect.txt"

COMMON=(--backend sim --gpus "$GPUS" --speed "$SPEED" --port-base "$PORT_BASE" --out-dir "$RUNS" --quiet)
names=()
for policy in $ROUTER_POLICIES; do
  $TB replay "$TRACE" "${COMMON[@]}" --router sglang-router --router-policy "$policy" --run-name "sglang-router-$policy"
  names+=("$RUNS/sglang-router-$policy")
done
for policy in $POLICIES; do
  $TB replay "$TRACE" "${COMMON[@]}" --policy "$policy" --run-name "tracebench-$policy"
  names+=("$RUNS/tracebench-$policy")
done
$TB report "${names[@]}" -o "$OUT_DIR/report.html"
$TB report "${names[@]}" --format md > "$OUT_DIR/report.md"
cp "$RUNS/inspect.txt" "$OUT_DIR/trace-inspect.txt"
echo "runs in $RUNS; report in $OUT_DIR"
