#!/usr/bin/env bash
# Issue 33 items 7 and 8 on real sglang: four servers (one per GPU), short requests (128 in / 16 out, Poisson) replayed
# by tracebench at RATES req/s (default 400 and 800) for DURATION s each, attached, round_robin, no cap.
# Item 7: no request may fail for a reason of the client's making (before the fix: 2 of 7,961 at 400 req/s, written into
# a pooled connection sglang's uvicorn was closing after 5 s idle; now --keepalive, default 4 s, below it).
# Item 8: a run whose client falls behind says so (run.json client_keepup; the report's line).
# Results: $OUT/keepalive.tgz (run folders, summary.txt). SIM=1 checks the script here against sim-servers.
source bench/gpu/common.sh
GPUS=${GPUS:-4}; PORT0=${PORT0:-30300}; RATES=${RATES:-"400 800"}; DURATION=${DURATION:-20}
NAME=keepalive
RES=$RES_ROOT/$NAME; rm -rf "$RES"; mkdir -p "$RES"
stop_all() { for i in $(seq 0 $((GPUS - 1))); do stop_server "$RES/server-$i.log"; done; }
trap 'stop_all; tar -czf "$PACK_TO/$NAME.tgz" -C "$RES_ROOT" "$NAME"; ls -la "$PACK_TO"' EXIT
for i in $(seq 0 $((GPUS - 1))); do start_server "$i" $((PORT0 + i)) "$RES/server-$i.log"; done
for i in $(seq 0 $((GPUS - 1))); do wait_healthy $((PORT0 + i)) "$RES/server-$i.log"; done
ATTACH=(); for i in $(seq 0 $((GPUS - 1))); do ATTACH+=(--attach "http://127.0.0.1:$((PORT0 + i))"); done
VOCAB=(--model "$MODEL"); [ "${SIM:-0}" = 1 ] && VOCAB=(--vocab-size 32000)
{ echo "date: $(date -u +%FT%TZ)"; nproc; uptime; git rev-parse --short HEAD 2>/dev/null || true; } > "$RES/summary.txt"
for rate in $RATES; do
  n=$((rate * DURATION))
  $TB generate --rate "$rate" --num-requests "$n" --input-len 128 --output-len 16 --length-dist fixed --seed 7 \
    -o "$RES/r$rate.jsonl"
  $TB replay "$RES/r$rate.jsonl" "${ATTACH[@]}" "${VOCAB[@]}" --policy round_robin --metrics-interval 0 \
    --run-name "rate-$rate" --out-dir "$RES" --quiet 2>&1 | tee "$RES/rate-$rate.txt" | tail -5 || true
  python3 - "$RES/rate-$rate" >> "$RES/summary.txt" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
meta = json.loads((run / "run.json").read_text())
recs = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
errors = [r["error"] for r in recs if r["status"] in ("error", "timeout")]
def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")
lag = [r["t_released"] - r["t_arrival"] for r in recs if r["t_released"] is not None]
wire = [r["t_written"] - r["t_arrival"] for r in recs if r["t_written"] is not None]
print(f"{run.name}: {meta['status']}, counts {meta['counts']}, errors {len(errors)} {sorted(set(errors))[:3]}")
print(f"  release lag p50/p99 {p(lag, .5):.2f}/{p(lag, .99):.2f} ms; arrival -> written p50/p99 "
      f"{p(wire, .5):.2f}/{p(wire, .99):.2f} ms; client_keepup {json.dumps(meta.get('client_keepup'))[:400]}")
EOF
done
cat "$RES/summary.txt"
