"""A real control plane for end-to-end tests: etcd, kube-apiserver and kube-scheduler 1.20.2
(scripts/kube-build.sh, scripts/controlplane.sh) with the shipped v1beta1 scheduler
configuration, and `tessera serve` as the extender over HTTP.

Skipped with a reason when the Kubernetes binaries are not built; .ci/run builds them first
(cached under ~/.cache/tessera), so CI always runs these.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE_BIN = Path(os.environ.get("TESSERA_KUBE_BIN", Path.home() / ".cache/tessera/kube-v1.20.2/bin"))
SHIPPED_CONFIG = ROOT / "manifests/scheduler/kube-scheduler-config.v1beta1.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s")


class Extender:
    """`tessera serve` as a child process, restartable (the crash tests kill it)."""

    def __init__(self, kubeconfig: Path, port: int, log: Path) -> None:
        self.kubeconfig, self.port, self.log = kubeconfig, port, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(self.kubeconfig),
             "--listen", f"127.0.0.1:{self.port}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_http(f"{self.url}/readyz", 60)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(10)

    def inspect(self, pod: str | None = None) -> dict:
        q = f"?pod={pod}" if pod else ""
        with urllib.request.urlopen(f"{self.url}/inspect{q}", timeout=5) as r:
            return json.loads(r.read())


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if not (KUBE_BIN / "kube-apiserver").is_file() or not (KUBE_BIN / "kube-scheduler").is_file():
        pytest.skip(f"kube-apiserver/kube-scheduler 1.20.2 not built in {KUBE_BIN} (run scripts/kube-build.sh)")
    if not shutil.which("etcd") and not os.environ.get("ETCD_BIN"):
        pytest.skip("etcd not installed (scripts/kube-build.sh installs Debian's etcd-server)")
    from kubernetes import client, config

    work = tmp_path_factory.mktemp("cp")
    port = free_port()
    shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
    shipped["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}/tessera"  # the only changes:
    shipped["clientConnection"]["kubeconfig"] = "__KUBECONFIG__"  # URL and kubeconfig
    cfg = tmp_path_factory.mktemp("cfg") / "shipped-config.yaml"  # controlplane.sh renders its copy into DIR
    cfg.write_text(yaml.safe_dump(shipped))
    env = dict(os.environ, TESSERA_PYTHON=sys.executable)
    subprocess.run([str(ROOT / "scripts/controlplane.sh"), "start", str(work), str(cfg)], check=True, env=env)
    try:
        kubeconfig = work / "kubeconfig"
        config.load_kube_config(config_file=str(kubeconfig))
        ext = Extender(kubeconfig, port, work / "logs" / "tessera.log")
        ext.start()
        yield {"api": client.CoreV1Api(), "extender": ext, "dir": work}
        ext.kill(signal.SIGTERM)
    finally:
        subprocess.run([str(ROOT / "scripts/controlplane.sh"), "stop", str(work)], check=False, env=env)
