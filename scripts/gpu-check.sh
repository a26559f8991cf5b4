#!/usr/bin/env bash
# The one check to run on a machine with an NVIDIA GPU (see gpu_sharing/selfcheck.py):
# NVML inventory vs nvidia-smi, then a 250-milli slice launched by tessera-launch must not
# allocate more than a quarter of GPU 0's memory, while the whole GPU can. Prints a short report;
# exit 0 all passed (or skipped), 1 a failure, 2 no driver. Also runs the NVML backend's tests.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,5s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # --help ran the checks too
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv
"$PY" -m gpu_sharing.selfcheck "$@"
rc=$?
"$PY" -m pytest -q -rs tests/test_nvml.py || rc=1
exit $rc
