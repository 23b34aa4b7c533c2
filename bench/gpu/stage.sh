#!/usr/bin/env bash
# PD disaggregation, first of the calls (issue 21): install under /opt/pd what sglang's PD needs beyond the overlay. The
# next call (bench/gpu/pd.sh, started while the machine is still warm: /opt/pd lasts 30 s after a call) uses it.
# Carried in: .stage/ (ignored; prepared on the CPU machine, bench/gpu/README.md "PD disaggregation"):
#   mooncake-0.3.13.post1-cu12.tar.xz  what sglang imports of mooncake-transfer-engine 0.3.13.post1 (mooncake/
#                                      __init__.py, buffer_pool.py, engine.so, libasio.so, libetcd_wrapper.so, and
#                                      the four .libs/ it needs); engine.so links libcudart.so.12
#   mooncake-cuda13-0.3.14.tar.xz      the same of mooncake-transfer-engine-cuda13 0.3.14 (libcudart.so.13: the
#                                      image's torch is cu130)
#   sglang-router-0.3.2.tar.xz         the sglang-router 0.3.2 wheel, unpacked (its deps are in the overlay/image)
#   py_spy-0.4.3-*.whl                 (optional) the sampling profiler bench/gpu/overhead.sh uses: into /opt/pyspy
# Keeps the first mooncake that imports and makes a TransferEngine as /opt/pd/mooncake; writes /opt/pd/staged.
set -euo pipefail
S=${STAGE_DIR:-.stage}
for f in mooncake-0.3.13.post1-cu12.tar.xz mooncake-cuda13-0.3.14.tar.xz sglang-router-0.3.2.tar.xz; do
  [ -f "$S/$f" ] || { echo "stage.sh: $S/$f missing (carry .stage, see bench/gpu/README.md)"; exit 1; }
done
t0=$SECONDS
rm -rf /opt/pd/mooncake /opt/pd/mooncake-cu12 /opt/pd/mooncake-cu13 /opt/pd/router /opt/pd/staged
mkdir -p /opt/pd/mooncake-cu12 /opt/pd/mooncake-cu13 /opt/pd/router
tar -xJf "$S/mooncake-0.3.13.post1-cu12.tar.xz" -C /opt/pd/mooncake-cu12
tar -xJf "$S/mooncake-cuda13-0.3.14.tar.xz" -C /opt/pd/mooncake-cu13
tar -xJf "$S/sglang-router-0.3.2.tar.xz" -C /opt/pd/router
echo "unpacked in $((SECONDS - t0)) s"
for v in cu13 cu12; do
  echo "== mooncake $v: libraries not found"
  ldd /opt/pd/mooncake-$v/mooncake/engine.so | grep "not found" || echo "(none)"
  if PYTHONPATH=/opt/pd/mooncake-$v python3 -c "from mooncake.engine import TransferEngine; TransferEngine(); print('TransferEngine ok')"; then
    ln -sfn /opt/pd/mooncake-$v /opt/pd/mooncake
    echo "mooncake: using the $v build"
    break
  fi
done
[ -e /opt/pd/mooncake ] || { echo "stage.sh: neither mooncake build imports here: PD cannot run (see above)"; exit 1; }
PYTHONPATH=/opt/pd/router python3 -c "import sglang_router, importlib.metadata as m; print('sglang-router', m.version('sglang-router'))"
if ls "$S"/py_spy-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /opt/pyspy "$S"/py_spy-*.whl
  /opt/pyspy/bin/py-spy --version
fi
echo "$(readlink /opt/pd/mooncake)" > /opt/pd/staged
echo "staged in $((SECONDS - t0)) s; next call within 30 s: bash bench/gpu/pd.sh"
