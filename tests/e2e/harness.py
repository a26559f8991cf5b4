"""Start a real control plane (scripts/controlplane.sh) with the shipped scheduler config and
`tessera serve` beside it. Used by the end-to-end tests and by bench/kube_openb.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE_BIN = Path(os.environ.get("TESSERA_KUBE_BIN", Path.home() / ".cache/tessera/kube-v1.20.2-r2/bin"))
SHIPPED_CONFIG = ROOT / "manifests/scheduler/kube-scheduler-config.v1beta1.yaml"
CONTROLPLANE = ROOT / "scripts/controlplane.sh"


def binaries_missing() -> str:
    for name in ("kube-apiserver", "kube-scheduler"):
        if not (KUBE_BIN / name).is_file():
            return f"{name} 1.20.2 not built in {KUBE_BIN} (run scripts/kube-build.sh)"
    return ""


def skip_without_control_plane() -> None:
    """Skip the calling test (with the reason) when the Kubernetes binaries or etcd are missing."""
    import shutil

    import pytest

    missing = binaries_missing()
    if missing:
        pytest.skip(missing)
    if not shutil.which("etcd"):
        pytest.skip("etcd not installed (scripts/kube-build.sh installs Debian's etcd-server)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, context: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s")


class ExtenderProcess:
    """`tessera serve` as a child process, restartable (the crash tests kill it)."""

    def __init__(self, kubeconfig: Path, port: int, log: Path, args: tuple[str, ...] = (), env: dict | None = None,
                 context: ssl.SSLContext | None = None) -> None:
        self.kubeconfig, self.port, self.log, self.args, self.env = kubeconfig, port, log, args, env or {}
        self.context = context  # a client TLS context when the extender serves HTTPS
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://127.0.0.1:{self.port}"

    @property
    def key_file(self) -> Path:
        """The assignment key every replica of one cluster shares (the shipped Deployment mounts a Secret)."""
        path = self.kubeconfig.parent / "assignment.key"
        if not path.exists():
            path.write_text(os.urandom(32).hex())
        return path

    def start(self) -> None:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(self.kubeconfig),
             "--listen", f"127.0.0.1:{self.port}", "--assignment-key-file", str(self.key_file), *self.args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ, **self.env),
        )
        wait_http(f"{self.url}/readyz", 60, self.context)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(10)

    def inspect(self, pod: str | None = None) -> dict:
        q = f"?pod={pod}" if pod else ""
        with urllib.request.urlopen(f"{self.url}/inspect{q}", timeout=30, context=self.context) as r:
            return json.loads(r.read())


class LocalCluster:
    """etcd + kube-apiserver + kube-scheduler (shipped v1beta1 config, only URL and kubeconfig
    changed) + `tessera serve`, all on loopback under `work`.

    `tls` (certFile, keyFile, caFile of the scheduler's client certificate and the CA) turns on the
    config's enableHTTPS, as docs/admin-guide.md describes, with `tessera serve` given `tls_args`.
    """

    def __init__(self, work: Path, tls: dict | None = None, tls_args: tuple[str, ...] = (),
                 client_context: ssl.SSLContext | None = None) -> None:
        self.work, self.tls = work, tls
        self.port = free_port()
        self.extender = ExtenderProcess(work / "kubeconfig", self.port, work / "tessera.log", args=tls_args,
                                        context=client_context)

    def start(self) -> None:
        shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
        for extender in shipped["extenders"]:  # the only changes: the URL and the kubeconfig (and TLS if asked)
            extender["urlPrefix"] = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/tessera"
            if self.tls:
                extender["enableHTTPS"] = True
                extender["tlsConfig"] = dict(self.tls)
        shipped["clientConnection"]["kubeconfig"] = "__KUBECONFIG__"
        cfg = self.work.parent / f"{self.work.name}-scheduler-config.yaml"  # controlplane.sh renders into work
        cfg.write_text(yaml.safe_dump(shipped))
        env = dict(os.environ, TESSERA_PYTHON=sys.executable)
        subprocess.run([str(CONTROLPLANE), "start", str(self.work), str(cfg)], check=True, env=env)
        self.extender.start()

    def stop(self) -> None:
        self.extender.kill(signal.SIGTERM)
        subprocess.run([str(CONTROLPLANE), "stop", str(self.work)], check=False)
