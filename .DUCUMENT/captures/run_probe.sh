#!/usr/bin/env bash
# Device-side driver for probe_0517.py (run from the repo root with .carry carried; $OUT set by the device tool).
# Server A: text mode + --enable-metrics; server B: --skip-tokenizer-init --max-running-requests 8.
source .carry/sglang-device/setup-on-device.sh
P=.DUCUMENT/captures/probe_0517.py
MISC=$OUT/misc.txt
t0=$(date +%s.%N)
stamp() { echo "[$(python3 -c "print(round($(date +%s.%N)-$t0,1))")s] $*" >> "$MISC"; }
stamp "overlay ready; nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"

# text-mode model folder: config + word-level tokenizer (name must keep 'llama-2-7b-hf'), in a scratch folder
MODEL_A=$(mktemp -d)/llama-2-7b-hf
mkdir -p "$MODEL_A" && cp .carry/models/llama-2-7b-hf/*.json .carry/sglang-device/wordlevel-tokenizer/*.json "$MODEL_A"/

wait_health() {  # port name pid
  local s=$(date +%s.%N) last=""
  while true; do
    code=$(python3 - "$1" <<'EOF'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
EOF
)
    if [ "$code" != "$last" ]; then stamp "$2 /health -> $code (t_since_launch=$(python3 -c "print(round($(date +%s.%N)-$s,1))")s)"; last=$code; fi
    [ "$code" = "200" ] && return 0
    kill -0 "$3" 2>/dev/null || { stamp "$2 process died"; return 1; }
    sleep 1
  done
}

python3 -m sglang.launch_server --model-path "$MODEL_A" --load-format dummy \
  --attention-backend triton --sampling-backend pytorch --enable-metrics \
  --host 127.0.0.1 --port 30000 > "$OUT/serverA.log" 2>&1 &
PA=$!
stamp "server A launched pid=$PA"
{ echo "=== python3 -m sglang.launch_server --help"; python3 -m sglang.launch_server --help 2>&1;
  echo "=== python3 -m sglang.bench_serving --help"; python3 -m sglang.bench_serving --help 2>&1; } > "$OUT/help.txt"
stamp "help captured"
wait_health 30000 A $PA || exit 1
python3 $P "$OUT/resultsA.json" A >> "$MISC" 2>&1
stamp "probe A done"
python3 -c "import urllib.request;open('$OUT/metricsA.txt','w').write(urllib.request.urlopen('http://127.0.0.1:30000/metrics').read().decode())"
stamp "metrics captured"
python3 -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port 30000 --dataset-name random-ids \
  --random-input-len 512 --random-output-len 128 --random-range-ratio 1.0 --num-prompts 40 --request-rate 8 \
  --tokenizer .carry/sglang-device/wordlevel-tokenizer --output-file "$OUT/bench_small.jsonl" >> "$MISC" 2>&1
stamp "bench_serving done rc=$?"
kill $PA; wait $PA 2>/dev/null
stamp "server A stopped"

python3 -m sglang.launch_server --model-path .carry/models/llama-2-7b-hf --load-format dummy --skip-tokenizer-init \
  --attention-backend triton --sampling-backend pytorch --enable-metrics --max-running-requests 8 \
  --host 127.0.0.1 --port 30001 > "$OUT/serverB.log" 2>&1 &
PB=$!
stamp "server B launched pid=$PB"
wait_health 30001 B $PB || exit 1
python3 $P "$OUT/resultsB.json" B >> "$MISC" 2>&1
stamp "probe B done"
kill $PB; wait $PB 2>/dev/null
stamp "all done"
