#!/usr/bin/env bash
# What tracebench's report side needs on the GPU machine (its image has no polars and nothing can be downloaded):
# `tracebench sweep` summarises every point through the report, and bench/gpu/check_telemetry.py reads run folders.
# Carried in: .stage-report/ (ignored; 34.7 MB): polars-2.1.0.tar.xz, the polars 2.1.0 package and its
# polars_runtime_32 (abi3) as installed in a Linux x86_64 venv:
#   (cd .venv/lib/python3.*/site-packages && tar -cf - polars polars-2.1.0.dist-info _polars_runtime_32 \
#      polars_runtime_32-2.1.0.dist-info | xz -T2 -6) > .stage-report/polars-2.1.0.tar.xz   (from the repository root)
# Unpacks it into /opt/report, which bench/gpu/common.sh puts on PYTHONPATH. /opt/report lasts while the machine is
# warm (30 s after a call): the next call must follow at once.
#   run(command="bash bench/gpu/stage_report.sh", carry=[".stage-report"], kind=...)
set -euo pipefail
S=${STAGE_DIR:-.stage-report}
[ -f "$S/polars-2.1.0.tar.xz" ] || { echo "stage_report.sh: $S/polars-2.1.0.tar.xz missing (see this file's header)"; exit 1; }
t0=$SECONDS
rm -rf /opt/report && mkdir -p /opt/report
tar -xJf "$S/polars-2.1.0.tar.xz" -C /opt/report
PYTHONPATH=/opt/report python3 -c "import polars; print('polars', polars.__version__)"
echo "staged in $((SECONDS - t0)) s"
