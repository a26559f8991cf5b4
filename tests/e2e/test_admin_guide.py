"""docs/admin-guide.md's "Try it locally", run exactly as written, in both install modes.
Control-plane mode: the certificates from `tessera certs`, the shipped v1beta1 scheduler config
(mutual TLS) with only its URL, kubeconfig and certificate paths changed, a real control plane,
`tessera serve`, and manifests/examples/fractional-pod.yaml bound with a quarter of a GPU.
Second-scheduler mode: a stock kube-scheduler, a second one from the shipped tessera-scheduler
profile with `tessera serve` on loopback, and manifests/examples/second-scheduler-slice.yaml."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing.local_cluster import KUBE_BIN, binaries_missing, free_port

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs/admin-guide.md"


def block(name: str) -> str:
    text = GUIDE.read_text()
    m = re.search(rf"<!-- {name}:begin -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert m, f"no {name} block in {GUIDE}"
    return m.group(1)


def skip_without_tools() -> None:
    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    for tool in ("etcd", "curl"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed")
    if not (KUBE_BIN / "kubectl").is_file():
        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN} (scripts/kube-build.sh without SKIP_KUBECTL)")
    if not (ROOT / ".venv/bin/tessera").is_file():
        pytest.skip("the guide runs .venv/bin/tessera, which is not installed")


def test_a_newcomer_following_the_admin_guide_gets_a_fractional_pod_bound(tmp_path):
    skip_without_tools()
    env = dict(os.environ, CP=str(tmp_path / "cp"), PORT=str(free_port()), ADMIN=str(free_port()), TESSERA_PYTHON=sys.executable,
               HOME=os.environ.get("HOME", str(Path.home())))
    env.pop("KUBECONFIG", None)
    try:
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", block("quickstart")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["bash", "-c", block("quickstart-stop")], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith('{"node"'))
    a = json.loads(line)
    assert a["node"] == "local-a100-0" and a["milli"] == 250 and len(a["gpus"]) == 1
    assert "default/notebook-slice=250" in out.stdout  # tessera inspect's map
    assert "condition met" in out.stdout


def test_the_second_scheduler_walkthrough_binds_a_slice_through_tesseras_own_kube_scheduler(tmp_path):
    skip_without_tools()
    env = dict(os.environ, CP=str(tmp_path / "cp"), PORT=str(free_port()), ADMIN=str(free_port()), SPORT=str(free_port()),
               SHEALTH=str(free_port()), TESSERA_PYTHON=sys.executable, HOME=os.environ.get("HOME", str(Path.home())))
    env.pop("KUBECONFIG", None)
    env.pop("POD_NAME", None)
    try:
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", block("quickstart-second")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        who = "{range .items[*]}{.source.component}{.reportingComponent} {.message}{\"\\n\"}{end}"
        events = subprocess.run([str(KUBE_BIN / "kubectl"), "--kubeconfig", str(tmp_path / "cp/kubeconfig"), "get", "events",
                                 "-o", f"jsonpath={who}"], capture_output=True, text=True, timeout=60).stdout
    finally:
        subprocess.run(["bash", "-c", block("quickstart-second-stop")], cwd=ROOT, env=env, capture_output=True, timeout=60)
    logs = "".join(f"\n--- {name}\n" + (tmp_path / "cp" / name).read_text(errors="replace")[-3000:]
                   for name in ("tessera.log", "tessera-scheduler.log") if (tmp_path / "cp" / name).is_file())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:] + events + logs
    line = next(x for x in out.stdout.splitlines() if x.startswith('{"node"'))
    a = json.loads(line)
    assert a["node"] == "local-a100-0" and a["milli"] == 250 and len(a["gpus"]) == 1
    assert "default/notebook-slice-ts=250" in out.stdout  # tessera inspect's map
    assert "tessera-scheduler Successfully assigned default/notebook-slice-ts to local-a100-0" in events, events
