"""Start a real control plane (scripts/controlplane.sh) with the shipped scheduler config (mutual
TLS, certificates from `tessera certs`) and `tessera serve` beside it. Used by the end-to-end tests
and by bench/kube_openb.py."""

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


def skip_without_control_plane(controllers: bool = False) -> None:
    """Skip the calling test (with the reason) when the Kubernetes binaries or etcd are missing
    (kube-controller-manager too with `controllers=True`)."""
    import shutil

    import pytest

    missing = binaries_missing(controllers)
    if missing:
        pytest.skip(missing)
    if not shutil.which("etcd"):
        pytest.skip("etcd not installed (scripts/kube-build.sh installs Debian's etcd-server)")


# What scripts/node-e2e.sh --json prints: each real-node test (test_nodes_e2e.py, test_install_e2e.py) records what it
# measured or showed here, and each module writes it out when it ends (a key is absent when its test did not get
# that far).
NODE_SUMMARY: dict = {}


def write_node_summary() -> None:
    """Merge NODE_SUMMARY into the JSON file $TESSERA_NODE_E2E_JSON names (several modules write one file)."""
    out = os.environ.get("TESSERA_NODE_E2E_JSON")
    if not out:
        return
    try:
        with open(out) as f:
            merged = json.load(f)
    except (OSError, ValueError):
        merged = {}
    merged.update(NODE_SUMMARY)
    with open(out, "w") as f:
        json.dump(merged, f, sort_keys=True)


def until(what: str, check, timeout: float = 60.0, describe=None, every: float = 0.3):
    """Poll `check` until it returns something truthy (and return that); after `timeout`, fail naming `what` and
    what `describe()` says of the state then."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}: {describe() if describe else value!r}")
        time.sleep(every)


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


def guide_block(name: str, doc: str = "docs/admin-guide.md") -> str:
    """The bash block between `<!-- name:begin -->` and `<!-- name:end -->` of a guide, as written."""
    import re

    m = re.search(rf"<!-- {name}:begin -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->", (ROOT / doc).read_text(), re.S)
    assert m, f"no {name} block in {doc}"
    return m.group(1)


def create_assignment_key(kubeconfig: Path, namespace: str, name: str) -> subprocess.CompletedProcess:
    """The install's step, as an admin runs it: docs/admin-guide.md's "Create the assignment key" block, as written,
    with kubectl 1.20.2, NS and SECRET set (the test skips without kubectl). The caller reads the return code: run
    twice, the block must fail and change nothing."""
    if not (KUBE_BIN / "kubectl").is_file():
        import pytest

        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN}: the guide's step runs kubectl")
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), NS=namespace, SECRET=name, PATH=f"{KUBE_BIN}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", guide_block("assignment-key")], env=env,
                          capture_output=True, text=True, timeout=60)


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


# --- acting as the shipped ServiceAccounts (the RBAC and raybridge e2e tests) ----------------------

def create_or_keep(fn, *args) -> None:
    """Create an object; one already there (409) is kept as it is."""
    from kubernetes.client.exceptions import ApiException

    try:
        fn(*args)
    except ApiException as e:
        if e.status != 409:
            raise


def impersonating(api, namespace: str, sa: str):
    """An ApiClient with `api`'s admin credentials that acts as ServiceAccount `namespace`/`sa`."""
    from kubernetes import client

    return client.ApiClient(api.api_client.configuration, header_name="Impersonate-User",
                            header_value=f"system:serviceaccount:{namespace}:{sa}")


def refused(call) -> bool:
    """True when the apiserver answers the call with 403 Forbidden."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        return e.status == 403
    return False

