#!/usr/bin/env bash
# Real nodes, end to end: runs tests/e2e/test_nodes_e2e.py (two kubelets with their own containerd, the
# Tessera image, the agent and device plugin DaemonSets, GPU pods placed by kube-scheduler and Tessera, forged
# pods, restarts) and tests/e2e/test_install_e2e.py (the admin guide's install on such nodes: the extender's
# Deployment, its Lease, failover, CPU pods without Tessera), tests/e2e/test_ray_job_e2e.py (the Ray training
# example in containers of the ray image on that install: members killed and replaced by the bridge, next to a
# DDP-style restart) and tests/e2e/test_second_install_e2e.py (second-scheduler mode: Tessera's kube-scheduler and
# extender as pods) and prints what they measured.
#
#   node-e2e.sh           # the tests, with their own output
#   node-e2e.sh --json    # one JSON object on stdout: what the run measured and showed, "passed", and
#                         # "not_measured_yet": the keys of the whole install's summary that no test records yet
#
# Needs what the tests need (root, scripts/kube-build.sh's binaries and packages); ./scripts/test builds them.
# Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_PREFIX=node-e2e
# shellcheck source=scripts/common.sh
source scripts/common.sh
usage() { usage_from "$0" 2,11; }

json=0
case ${1:-} in
    "") ;;
    --json) json=1 ;;
    *) usage ;;
esac
[[ $# -le 1 ]] || usage
[[ -x .venv/bin/python ]] || die "no .venv: run ./scripts/test once (it makes the venv and builds what the tests need)"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
if (( json )); then
    TESSERA_NODE_E2E_JSON=$out .venv/bin/python -m pytest -q -p no:cacheprovider tests/e2e/test_nodes_e2e.py tests/e2e/test_install_e2e.py tests/e2e/test_ray_job_e2e.py tests/e2e/test_second_install_e2e.py >&2 || rc=$?
    .venv/bin/python - "$out" "$rc" <<'PY'
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
try:
    got = json.load(open(path))
except (OSError, ValueError):
    got = {}
wanted = ("kubelet_nodes", "image_tessera_mib", "image_ray_mib", "extender_ready", "lease_failover_s", "agents_reporting",
          "devices_match_assignment", "forged_sees_none", "ray_job_recovered", "recovery_ms_median",
          "ddp_restart_ms_median", "node_stop_recovered", "second_scheduler_placed", "cpu_pods_start_without_tessera", "double_bound")
got["passed"] = rc == 0
got["not_measured_yet"] = [k for k in wanted if k not in got]
print(json.dumps(got, sort_keys=True))
PY
else
    .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/e2e/test_nodes_e2e.py tests/e2e/test_install_e2e.py tests/e2e/test_ray_job_e2e.py tests/e2e/test_second_install_e2e.py || rc=$?
fi
exit "$rc"
