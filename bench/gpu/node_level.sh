#!/usr/bin/env bash
# Issue 6, steps 1-2, on one GPU. Run from the repository root on the device:
#   source-able carry: .carry/ (sglang-device, models); results: $OUT/node.tgz
# 1. tracebench launches sglang itself (--backend sglang --gpus 1), continuous mode.
# 2. one text-mode sglang server (tokenizer in the model folder, as bench_serving needs) serves, in turn:
#    tracebench continuous, tracebench static (batch 8), and sglang's own bench_serving on the same workload.
source bench/gpu/common.sh
RES=$RES_ROOT/node; mkdir -p "$RES"
trap 'tar -czf "$PACK_TO/node.tgz" -C "$RES_ROOT" node; ls -la "$PACK_TO"' EXIT
$TB generate --rate 8 --num-requests 400 --input-len 512 --output-len 128 --length-dist fixed --seed 0 -o "$RES/trace.jsonl"

if [ "${SIM:-0}" = 1 ]; then
  $TB replay "$RES/trace.jsonl" --backend sim --gpus 1 --run-name launch-continuous --out-dir "$RES" --quiet
else
  $TB replay "$RES/trace.jsonl" --backend sglang --gpus 1 --model "$MODEL" --server-arg "$SGL_ARGS" \
    --run-name launch-continuous --out-dir "$RES" --quiet
fi

TEXT_MODEL=$RES_ROOT/llama-2-7b-hf-text  # the model folder with the tokenizer (bench_serving needs text mode)
mkdir -p "$TEXT_MODEL" && cp "$MODEL"/*.json "$TEXT_MODEL"/ && cp .carry/sglang-device/wordlevel-tokenizer/*.json "$TEXT_MODEL"/
start_server 0 30100 "$RES/server-text.log" "$TEXT_MODEL"
wait_healthy 30100 "$RES/server-text.log"
URL=http://127.0.0.1:30100
$TB replay "$RES/trace.jsonl" --attach $URL --model "$MODEL" --run-name attach-continuous --out-dir "$RES" --quiet
$TB replay "$RES/trace.jsonl" --attach $URL --model "$MODEL" --mode static --batch-size 8 --run-name attach-static8 \
  --out-dir "$RES" --quiet
if [ "${SIM:-0}" != 1 ]; then
  python3 -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port 30100 --dataset-name random-ids \
    --random-input-len 512 --random-output-len 128 --random-range-ratio 1.0 --num-prompts 400 --request-rate 8 \
    --tokenizer .carry/sglang-device/wordlevel-tokenizer --output-file "$RES/bench_serving.jsonl" > "$RES/bench_serving.log" 2>&1
  tail -40 "$RES/bench_serving.log"
fi
stop_server "$RES/server-text.log"
