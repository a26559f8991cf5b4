"""`tessera serve` as a process: HTTPS with client certificates, clean shutdown, option checks.

The API server here is unreachable on purpose: the extender keeps retrying its first list (and
answers filter with NotReady), while health, TLS and signals work regardless.
"""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from extender.kube.lease import LeaseConfig
from testing.local_cluster import ROOT, free_port

from .pki import make_pki

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def start(tmp_path: Path, *args: str, admin: list | None = None) -> tuple[subprocess.Popen, int]:
    """`tessera serve` with the verbs on a free loopback port (returned); the admin port goes into `admin`."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    port, admin_port = free_port(), free_port()
    if admin is not None:
        admin.append(admin_port)
    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                             "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def get(url: str, context: ssl.SSLContext | None = None, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
        return r.status, r.read()


def wait_up(url: str, context: ssl.SSLContext | None, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            get(url, context, 1)
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def client_context(pki: Path, cert: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return ctx


FILTER = b'{"Pod":{"metadata":{"name":"p","uid":"u"}},"NodeNames":["n"]}'
VERBS = ("filter", "prioritize", "bind", "preempt")


def post(port: int, verb: str, context: ssl.SSLContext | None, timeout: float = 10):
    req = urllib.request.Request(f"https://127.0.0.1:{port}/tessera/{verb}", method="POST", data=FILTER,
                                 headers={"Content-Type": "application/json"})
    try:
        return get(req, context, timeout)
    except urllib.error.HTTPError as e:  # an HTTP answer all the same (503: not synced)
        return e.code, e.read()


def no_http_answer(port: int, context: ssl.SSLContext) -> bool:
    """True when a TLS client gets no HTTP bytes back at all: the handshake (or first read) fails."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"POST /tessera/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                return tls.recv(4096) == b""
    except (ssl.SSLError, ConnectionError, OSError):
        return True


def test_https_requires_a_client_certificate_from_the_ca(pki, tmp_path):
    admin: list[int] = []
    proc, port = start(tmp_path, "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
                       "--client-ca", str(pki / "ca.crt"), admin=admin)
    try:
        wait_up(f"http://127.0.0.1:{admin[0]}/healthz", None, proc)  # probes: the plain admin port
        assert get(f"http://127.0.0.1:{admin[0]}/healthz") == (200, b'{"ok":true}')
        status, body = post(port, "filter", client_context(pki, "scheduler"))
        assert status == 200 and b"not synced" in body  # API unreachable: filter says so in words
        for verb in VERBS:
            for who in (None, "rogue"):  # no certificate, or one the CA did not sign: no HTTP answer at all
                with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                    post(port, verb, client_context(pki, who))
                assert no_http_answer(port, client_context(pki, who))
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(f"http://127.0.0.1:{port}/tessera/filter")  # no plain HTTP beside HTTPS
        with pytest.raises(urllib.error.HTTPError):  # health and inspect are not on the verbs port
            get(f"https://127.0.0.1:{port}/healthz", client_context(pki, "scheduler"))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_silent_and_half_sent_connections_do_not_stall_the_scheduler(pki, tmp_path):
    """On main (cheroot) the TLS handshake ran in the accept loop: one silent TCP connection held
    every other client for the socket timeout. Now handshakes run off the request threads."""
    admin: list[int] = []
    proc, port = start(tmp_path, "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
                       "--client-ca", str(pki / "ca.crt"), admin=admin)
    hogs: list[socket.socket] = []
    try:
        wait_up(f"http://127.0.0.1:{admin[0]}/healthz", None, proc)
        for _ in range(20):  # TCP connections that never start a handshake
            hogs.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        half = socket.create_connection(("127.0.0.1", port), timeout=30)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the first bytes of a ClientHello, then silence
        hogs.append(half)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:  # a scheduler that sends half a request
            tls = client_context(pki, "scheduler").wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"POST /tessera/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            started = time.monotonic()
            for verb in ("filter", "prioritize", "preempt"):  # a real mTLS client is still answered
                status, body = post(port, verb, client_context(pki, "scheduler"), timeout=30)
                assert status in (200, 400, 503) and body
            assert time.monotonic() - started < 25  # generous: cheroot held each call for its 10 s per hog
            tls.close()
        for hog in hogs[:5]:  # the silent ones are closed by the server after its handshake deadline
            hog.settimeout(30)
            assert hog.recv(1) == b""
    finally:
        for hog in hogs:
            hog.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_sigterm_stops_the_plain_server_cleanly(tmp_path):
    admin: list[int] = []
    proc, _ = start(tmp_path, admin=admin)
    wait_up(f"http://127.0.0.1:{admin[0]}/healthz", None, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_the_probe_listener_answers_beside_the_admin_port_and_stops_with_the_process(tmp_path):
    admin: list[int] = []
    probes = free_port()
    proc, _ = start(tmp_path, "--probe-listen", f"127.0.0.1:{probes}", admin=admin)
    wait_up(f"http://127.0.0.1:{probes}/healthz", None, proc)
    assert get(f"http://127.0.0.1:{probes}/healthz") == get(f"http://127.0.0.1:{admin[0]}/healthz") == (200, b'{"ok":true}')
    with pytest.raises(urllib.error.HTTPError) as not_ready:  # the API is unreachable: not synced, in the same words
        get(f"http://127.0.0.1:{probes}/readyz")
    assert not_ready.value.code == 503 and b"first sync" in not_ready.value.read()
    with pytest.raises(urllib.error.HTTPError) as elsewhere:
        get(f"http://127.0.0.1:{probes}/metrics")
    assert elsewhere.value.code == 404
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert b"probes on http://127.0.0.1:" in proc.stdout.read()


@pytest.mark.parametrize("args, message", [
    (["--tls-cert", "setup.cfg"], "go together"),
    (["--listen", "nowhere"], "HOST:PORT"),
    (["--admin-listen", "nowhere"], "--admin-listen wants HOST:PORT"),
    # plain HTTP where anyone on the network could call the verbs: refused unless --insecure-listen
    (["--listen", "0.0.0.0:18888"], "refusing plain HTTP on 0.0.0.0:18888"),
    (["--listen", "10.1.2.3:18888"], "refusing plain HTTP"),
    (["--listen", "[::]:18888"], "refusing plain HTTP"),
    (["--listen", "localhost:18888"], "refusing plain HTTP"),  # a name could resolve anywhere
    (["--listen", "0.0.0.0:18888", "--tls-cert", "PKI/server.crt", "--tls-key", "PKI/server.key"],
     "refusing HTTPS without client certificates"),
    (["--listen", "0.0.0.0:18888", "--tls-cert", "setup.cfg", "--tls-key", "setup.cfg"],
     "--tls-cert setup.cfg: not a PEM certificate"),
    (["--listen", "0.0.0.0:18888", "--tls-cert", "PKI/server.crt", "--tls-key", "PKI/rogue.key"],
     "do not load as a pair"),
    (["--listen", "127.0.0.1:18888", "--admin-listen", "127.0.0.1:18888"], "need two ports"),
    (["--probe-listen", "nowhere"], "--probe-listen wants HOST:PORT"),
    (["--listen", "127.0.0.1:18888", "--probe-listen", "127.0.0.1:18888"],
     "--listen and --probe-listen are both 127.0.0.1:18888: they need two ports"),
    (["--listen", "127.0.0.1:18888", "--probe-listen", "127.0.0.1:8889"],  # the admin port's default, on 0.0.0.0
     "--admin-listen 0.0.0.0:8889 and --probe-listen 127.0.0.1:8889 overlap: they need two ports"),
    (["--listen", "127.0.0.1:18888", "--max-body-bytes", "10"], "too small"),
    # a reservation setting without --reservations on would be taken and do nothing
    (["--listen", "127.0.0.1:18888", "--drain-pool-run", "2h"], "--drain-pool-run shapes reservations, which are off"),
])
def test_bad_serve_options_are_refused_in_words(tmp_path, args, message):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    if any(a.startswith("PKI/") for a in args):
        from tests.pki import make_pki

        pki = make_pki(tmp_path)
        args = [str(pki / a.removeprefix("PKI/")) if a.startswith("PKI/") else a for a in args]
    out = subprocess.run([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr


def test_insecure_listen_is_an_explicit_choice(tmp_path):
    """With --insecure-listen the same plain non-loopback listener starts (and says what it is)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    port, admin_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                             "--listen", f"0.0.0.0:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
                             "--insecure-listen"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_up(f"http://127.0.0.1:{admin_port}/healthz", None, proc)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/tessera/filter", method="POST", data=FILTER)
        status, body = get(req)
        assert status == 200 and b"not synced" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_a_malformed_lease_timing_is_refused():
    with pytest.raises(ValueError, match="retry < renew deadline < duration"):
        LeaseConfig("ns", "l", "me", "http://x", duration_s=5, renew_deadline_s=6, retry_s=1)


def test_one_thread_is_refused_so_a_bind_never_keeps_the_next_filter_waiting():
    from extender.serve import ServeOptions

    with pytest.raises(ValueError, match="at least 2"):
        ServeOptions("127.0.0.1", 8888, threads=1).check()
    ServeOptions("127.0.0.1", 8888, threads=2).check()


def test_each_listener_needs_a_port_of_its_own():
    from extender.serve import ServeOptions

    ServeOptions("127.0.0.1", 8888, admin_host="0.0.0.0", admin_port=8889, probe_host="0.0.0.0", probe_port=8890).check()
    ServeOptions("127.0.0.1", 8888, admin_host="::", admin_port=8889, probe_host="0.0.0.0", probe_port=8889).check()
    for probe in (("127.0.0.1", 8888), ("0.0.0.0", 8888), ("0.0.0.0", 8889)):
        with pytest.raises(ValueError, match="they need two ports"):
            ServeOptions("127.0.0.1", 8888, admin_host="0.0.0.0", admin_port=8889, probe_host=probe[0],
                         probe_port=probe[1]).check()


def test_a_busy_port_is_refused_in_words_before_serving_is_claimed(tmp_path):
    """Before: the log said where it served, then waitress died on the bind with a traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                              "--listen", "127.0.0.1:18891", "--admin-listen", f"127.0.0.1:{port}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"--admin-listen 127.0.0.1:{port}: cannot listen: the port is in use" in out.stderr
    assert "verbs on" not in out.stderr and "Traceback" not in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                              "--listen", "127.0.0.1:18891", "--admin-listen", "127.0.0.1:18892",
                              "--probe-listen", f"127.0.0.1:{port}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"--probe-listen 127.0.0.1:{port}: cannot listen: the port is in use" in out.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_missing_kubeconfig_is_one_line_not_a_traceback(tmp_path, how):
    missing = str(tmp_path / "nope.yaml")
    args = ["--kubeconfig", missing] if how == "flag" else []
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": missing}
    out = subprocess.run([sys.executable, "-m", "extender.cli", "serve", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    said = "--kubeconfig: no such file" if how == "flag" else "KUBECONFIG names no such file"
    assert out.stderr.strip().splitlines() == [f"tessera: {said}: {missing}"]


def test_serve_starts_its_extender_from_openbs_task_mix_and_the_service_imports_no_simulator():
    """The prior used to be read by the service from the simulator's package (an upward import);
    now it lives in the core (extender/core/openb_stats.py) and serve.py passes it in."""
    from extender.core.openb_stats import default_workload as task_mix
    from extender.core.workload import TargetWorkload, TaskType
    from extender.serve import ServeOptions, make_extender
    from extender.service import Extender

    ext = make_extender(ServeOptions("127.0.0.1", 8888, policy="fgd", threads=8), None)
    mix = task_mix()
    assert ext.policy.ctx.workload == mix and ext.policy_name == "fgd"
    commonest = max(mix.types, key=lambda tp: tp[1])[0]
    assert len(mix.types) == 35 and (commonest.cpu_milli, commonest.gpu_milli, commonest.gpu_count) == (3152, 810, 1)
    assert Extender(prior=TargetWorkload(((TaskType(0, 1000, 1), 1.0),))).policy.ctx.workload != mix
    code = "import sys, extender.service; print(sorted(m for m in sys.modules if m.startswith('extender.sim')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
