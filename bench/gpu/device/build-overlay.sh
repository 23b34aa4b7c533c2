#!/usr/bin/env bash
# Rebuilds sglang-0.5.17-overlay-sm90.tar.xz: every package that `python3 -m sglang.launch_server` needs on the
# GPU machine beyond what its image already has (Python 3.12, torch 2.11.0+cu130, nvcc, aiohttp, numpy, click, rich ...).
# Runs on a machine with package-registry access; takes a few minutes (sglang-kernel alone is ~380 MB to download).
# Usage (bench/gpu/README.md): bash bench/gpu/device/build-overlay.sh "$PWD/.carry/sglang-device/sglang-0.5.17-overlay-sm90.tar.xz"
# Trims: sglang-kernel keeps only sm90/common_ops and spatial_ops (so use --attention-backend triton on H100/H200);
#        xgrammar drops its unused static library.
set -euo pipefail
out=${1:-$PWD/sglang-0.5.17-overlay-sm90.tar.xz}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
pins="annotated_types==0.8.0 apache_tvm_ffi==0.1.11 cffi==2.1.1 compressed_tensors==0.20.0 dill==0.4.1 distro==1.9.0
fastapi==0.165.0 flashinfer_python==0.6.15.post1 gguf==0.19.0 ipython==9.18.1 jsonschema==4.26.0
jsonschema_specifications==2025.9.1 loguru==0.7.3 msgspec==0.22.0 openai==2.6.1 opentelemetry_api==1.45.2 orjson==3.13.0
partial_json_parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.3 pydantic_core==2.50.4 python_multipart==0.0.34
pyzmq==27.3.0 referencing==0.37.0 rpds_py==2026.9.1 setproctitle==1.3.8 sglang==0.5.17 sglang_kernel==0.4.5 sniffio==1.3.1
soundfile==0.13.1 starlette==1.10.0 tokenizers==0.22.2 traitlets==5.16.1 transformers==5.12.1 typing_inspection==0.4.5
uvicorn==0.54.0 xgrammar==0.2.1"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$work/whl" $pins
mkdir "$work/site"; cd "$work/site"
for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" .; done
for d in *.data; do [ -d "$d" ] || continue; for s in purelib platlib; do [ -d "$d/$s" ] && cp -r "$d/$s/." .; done; rm -rf "$d"; done
rm -f sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/infllm_ops.*.so xgrammar/lib/libxgrammar.a
rm -rf sgl_kernel/sm100
find . -name __pycache__ -prune -exec rm -rf {} +
tar -cJf "$out" -C "$work/site" .
ls -la "$out"
