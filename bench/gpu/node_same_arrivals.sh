#!/usr/bin/env bash
# Issue 6 step 1, like with like: on one text-mode sglang server, tracebench replays the exact arrival sequence
# sglang's bench_serving draws (bench_serving_trace.py), then bench_serving runs the same workload; then the GPU
# tests (tests/gpu) run. Results: $OUT/same.tgz. Needs .carry/whl (pytest wheels) on the device.
source bench/gpu/common.sh
RES=$RES_ROOT/same; mkdir -p "$RES"
trap 'tar -czf "$PACK_TO/same.tgz" -C "$RES_ROOT" same; ls -la "$PACK_TO"' EXIT
python3 bench/gpu/bench_serving_trace.py -o "$RES/bs-arrivals.jsonl"
TEXT_MODEL=$RES_ROOT/llama-2-7b-hf-text  # the model folder with the tokenizer (bench_serving needs text mode)
mkdir -p "$TEXT_MODEL" && cp "$MODEL"/*.json "$TEXT_MODEL"/ && cp .carry/sglang-device/wordlevel-tokenizer/*.json "$TEXT_MODEL"/
start_server 0 30100 "$RES/server-text.log" "$TEXT_MODEL"
wait_healthy 30100 "$RES/server-text.log"
$TB replay "$RES/bs-arrivals.jsonl" --attach http://127.0.0.1:30100 --model "$MODEL" --run-name attach-bs-arrivals \
  --out-dir "$RES" --quiet
if [ "${SIM:-0}" != 1 ]; then
  python3 -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port 30100 --dataset-name random-ids \
    --random-input-len 512 --random-output-len 128 --random-range-ratio 1.0 --num-prompts 400 --request-rate 8 \
    --tokenizer .carry/sglang-device/wordlevel-tokenizer --output-file "$RES/bench_serving.jsonl" > "$RES/bench_serving.log" 2>&1
  grep -A3 "Benchmark duration" "$RES/bench_serving.log"
fi
stop_server "$RES/server-text.log"
if [ "${SIM:-0}" != 1 ]; then
  python3 -m pip install -q --no-index --no-deps --target "$RES_ROOT/pytest-site" .carry/whl/*.whl
  PYTHONPATH=$RES_ROOT/pytest-site:$PYTHONPATH python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider 2>&1 | tee "$RES/gpu-tests.log"
fi
