#!/usr/bin/env bash
# Source this on the GPU machine, from the folder that holds it:  source ./setup-on-device.sh
# It lives in .carry/sglang-device/ beside the overlay and the two wheels (bench/gpu/README.md, "Preparing a call").
# Unpacks the sglang 0.5.17 overlay once per machine and exports what sglang needs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -f /opt/sgl-overlay/.done ]; then
  mkdir -p /opt/sgl-overlay && tar -xJf "$here/sglang-0.5.17-overlay-sm90.tar.xz" -C /opt/sgl-overlay
  python3 -m pip install -q --no-index --no-deps --no-compile --target /opt/sgl-overlay "$here"/*.whl
  touch /opt/sgl-overlay/.done
fi
export PYTHONPATH=/opt/sgl-overlay${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
