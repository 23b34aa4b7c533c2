#!/usr/bin/env bash
# Issue 22, what runs beside the load, on GPUS GPUs (default 2; GPUS=1 on a one-GPU machine). Run from the repository
# root on the device; results: $OUT/telemetry.tgz (the run folder, packed, its Perfetto timeline, check.txt).
#   tracebench launches GPUS sglang servers (--backend sglang --gpus $GPUS: each on its own CUDA_VISIBLE_DEVICES) and
#   replays a ~40 s trace with /metrics scraped every second and nvidia-smi sampled every second; then
#   bench/gpu/check_telemetry.py checks the scrapes against the records, the GPU samples' spacing (1 s, no bursts)
#   and their map to the servers, and writes the timeline.
# SIM=1: the same steps on sim-servers here, with a stand-in nvidia-smi (a script printing its CSV) named by
# TRACEBENCH_NVIDIA_SMI (simulated servers are not mapped to GPUs).
source bench/gpu/common.sh
GPUS=${GPUS:-2}; RATE=${RATE:-8}; N=${N:-320}
RES=$RES_ROOT/telemetry; rm -rf "$RES"; mkdir -p "$RES"
PY=python3; [ "${SIM:-0}" = 1 ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
trap 'tar -czf "$PACK_TO/telemetry.tgz" -C "$RES_ROOT" telemetry; ls -la "$PACK_TO"' EXIT
$TB generate --rate "$RATE" --num-requests "$N" --input-len 512 --output-len 128 --seed 0 -o "$RES/trace.jsonl"
t0=$SECONDS
if [ "${SIM:-0}" = 1 ]; then
  cat > "$RES/fake-nvidia-smi" <<'SMI'
#!/bin/sh
while :; do
  echo "0, GPU-sim-0, 50, 20, 30000, 81559, 300.5, NVIDIA H100 80GB HBM3"
  echo "1, GPU-sim-1, 40, 10, 30000, 81559, 280.0, NVIDIA H100 80GB HBM3"
  sleep 1
done
SMI
  chmod +x "$RES/fake-nvidia-smi"
  TRACEBENCH_NVIDIA_SMI=$RES/fake-nvidia-smi $TB replay "$RES/trace.jsonl" --backend sim --gpus "$GPUS" \
    --policy round_robin --metrics-interval 1 --run-name run --out-dir "$RES" --quiet
  EXPECT=()
else
  $TB replay "$RES/trace.jsonl" --backend sglang --gpus "$GPUS" --model "$MODEL" --server-arg "$SGL_ARGS" \
    --policy round_robin --metrics-interval 1 --run-name run --out-dir "$RES" --quiet
  EXPECT=(--expect-gpus "$GPUS")
fi
echo "replay: $((SECONDS - t0)) s (server start-up included)"
$PY bench/gpu/check_telemetry.py "$RES/run" "${EXPECT[@]}" --trace-out "$RES/run.json.trace" 2>&1 \
  | tee "$RES/check.txt" || true
$TB pack "$RES/run" --log-tail 200
