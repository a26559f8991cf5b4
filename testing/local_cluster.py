"""Start a real control plane (scripts/controlplane.sh) with the shipped scheduler config (mutual
TLS, certificates from `tessera certs`) and `tessera serve` beside it. Used by the end-to-end tests
(tests/e2e/harness.py holds what only they need) and by bench/kube_openb.py, kube_timeline.py and watch_fuzz.py."""

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

ROOT = Path(__file__).resolve().parents[1]
KUBE_BIN = Path(os.environ.get("TESSERA_KUBE_BIN", Path.home() / ".cache/tessera/kube-v1.20.2-r4/bin"))
SHIPPED_CONFIG = ROOT / "manifests/scheduler/kube-scheduler-config.v1beta1.yaml"
CONTROLPLANE = ROOT / "scripts/controlplane.sh"


def binaries_missing(controllers: bool = False) -> str:
    """Why the control plane cannot start, or '' when it can; kube-controller-manager (recipe r3 or
    later) is asked for only by `controllers=True`, so the tests that do not run it keep running on
    r2 binaries."""
    names = ("kube-apiserver", "kube-scheduler") + (("kube-controller-manager",) if controllers else ())
    for name in names:
        if not (KUBE_BIN / name).is_file():
            return f"{name} 1.20.2 not built in {KUBE_BIN} (run scripts/kube-build.sh)"
    return ""


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


def make_pki(d: Path) -> Path:
    """The certificates, made by the documented step (`tessera certs`), as an admin would."""
    out = d / "pki"
    if not (out / "ca.crt").exists():
        subprocess.run([sys.executable, "-m", "extender.cli", "certs", "--out", str(out), "--days", "2"],
                       cwd=ROOT, check=True, capture_output=True)
    return out


def scheduler_context(pki: Path) -> ssl.SSLContext:
    """A client holding kube-scheduler's certificate (what the tests use to call the verbs themselves)."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(pki / "scheduler.crt", pki / "scheduler.key")
    return ctx


class ExtenderProcess:
    """`tessera serve` as a child process, restartable (the crash tests kill it).

    The verbs on `host:port` over mutual TLS with the certificates in `pki` (the shipped setup);
    the admin port (health, inspect) on plain HTTP at 127.0.0.1:`admin_port`."""

    def __init__(self, kubeconfig: Path, port: int, log: Path, args: tuple[str, ...] = (), env: dict | None = None,
                 pki: Path | None = None, host: str = "127.0.0.1", admin_port: int | None = None) -> None:
        self.kubeconfig, self.port, self.log, self.args, self.env = kubeconfig, port, log, args, env or {}
        # by default the certificates of the LocalCluster beside this kubeconfig (the ones kube-scheduler
        # holds); the control plane's own pki/ folder is the apiserver's, not Tessera's
        self.pki = pki or make_pki(kubeconfig.parent.parent / f"{kubeconfig.parent.name}-certs")
        self.host = host
        self.admin_port = admin_port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The verbs' base URL (mutual TLS: call it with `self.context`)."""
        return f"https://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def context(self) -> ssl.SSLContext:
        return scheduler_context(self.pki)

    @property
    def key_file(self) -> Path:
        """The assignment key every replica of one cluster shares (the shipped Deployment mounts a Secret)."""
        path = self.kubeconfig.parent / "assignment.key"
        if not path.exists():
            path.write_text(os.urandom(32).hex())
        return path

    def start(self, ready_within: float = 60.0) -> None:
        out = open(self.log, "ab")
        tls = ("--tls-cert", str(self.pki / "server.crt"), "--tls-key", str(self.pki / "server.key"),
               "--client-ca", str(self.pki / "ca.crt"))
        if "--leader-elect" in self.args:  # the name followers check when forwarding binds: leader election only
            tls += ("--tls-server-name", "tessera-extender.tessera-system.svc")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(self.kubeconfig),
             "--listen", f"{self.host}:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin_port}", *tls,
             "--assignment-key-file", str(self.key_file), *self.args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ, **self.env),
        )
        wait_http(f"{self.admin_url}/readyz", ready_within)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(10)

    def inspect(self, pod: str | None = None) -> dict:
        q = f"?pod={pod}" if pod else ""
        with urllib.request.urlopen(f"{self.admin_url}/inspect{q}", timeout=30) as r:
            return json.loads(r.read())


class LocalCluster:
    """etcd + kube-apiserver + kube-scheduler + `tessera serve`, all on loopback under `work`.

    kube-scheduler runs the shipped v1beta1 config (mutual TLS on) with only the URL, the kubeconfig
    and the certificate paths changed; the certificates come from `tessera certs`, so every e2e
    scenario schedules through mutual TLS as a real installation does.

    `controllers` (kube-controller-manager's --controllers, e.g. "job,garbagecollector") also runs
    kube-controller-manager (CP_CONTROLLERS of controlplane.sh). Without it none runs, even when
    CP_CONTROLLERS is in the environment: the fake Nodes have no kubelet, and controllers such as
    nodelifecycle would taint them and evict their pods.
    """

    def __init__(self, work: Path, extender_args: tuple[str, ...] = (), controllers: str = "") -> None:
        self.work = work
        self.controllers = controllers
        self.port = free_port()
        self.extender = ExtenderProcess(work / "kubeconfig", self.port, work / "tessera.log", args=extender_args)
        self.pki = self.extender.pki

    def scheduler_config(self) -> dict:
        shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
        for extender in shipped["extenders"]:  # the only changes: the URL, the kubeconfig and the certificates' paths
            assert extender["enableHTTPS"] is True
            extender["urlPrefix"] = f"https://127.0.0.1:{self.port}/tessera"
            extender["tlsConfig"] = {k: str(self.pki / Path(v).name) for k, v in extender["tlsConfig"].items()}
        shipped["clientConnection"]["kubeconfig"] = "__KUBECONFIG__"
        return shipped

    def start(self, before_extender=None) -> None:
        """The control plane, then `before_extender(kubeconfig path)` if given (CRDs the extender should find at
        start), then `tessera serve`."""
        cfg = self.work.parent / f"{self.work.name}-scheduler-config.yaml"  # controlplane.sh renders into work
        cfg.write_text(yaml.safe_dump(self.scheduler_config()))
        env = dict(os.environ, TESSERA_PYTHON=sys.executable)
        env.pop("CP_CONTROLLERS", None)
        if self.controllers:
            env["CP_CONTROLLERS"] = self.controllers
        subprocess.run([str(CONTROLPLANE), "start", str(self.work), str(cfg)], check=True, env=env)
        if before_extender is not None:
            before_extender(self.work / "kubeconfig")
        self.extender.start()

    def stop(self) -> None:
        self.extender.kill(signal.SIGTERM)
        subprocess.run([str(CONTROLPLANE), "stop", str(self.work)], check=False)
