"""`tessera serve` as a process: HTTPS with client certificates, clean shutdown, option checks.

The API server here is unreachable on purpose: the extender keeps retrying its first list (and
answers filter with NotReady), while health, TLS and signals work regardless.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from extender.kube.lease import LeaseConfig

from .e2e.harness import ROOT, free_port
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


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                             "--listen", f"127.0.0.1:{port}", *args],
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


def test_https_requires_a_client_certificate_from_the_ca(pki, tmp_path):
    proc, port = start(tmp_path, "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
                       "--client-ca", str(pki / "ca.crt"))
    url = f"https://127.0.0.1:{port}/healthz"
    try:
        wait_up(url, client_context(pki, "scheduler"), proc)
        assert get(url, client_context(pki, "scheduler")) == (200, b'{"ok":true}')
        for who in (None, "rogue"):  # no certificate, or one the CA did not sign
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                get(url, client_context(pki, who))
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(f"http://127.0.0.1:{port}/healthz")  # no plain HTTP beside HTTPS
        # the verbs are behind the same TLS: not synced (API unreachable), so filter says so in words
        req = urllib.request.Request(f"https://127.0.0.1:{port}/tessera/filter", method="POST",
                                     data=b'{"Pod":{"metadata":{"name":"p","uid":"u"}},"NodeNames":["n"]}')
        status, body = get(req, client_context(pki, "scheduler"))
        assert status == 200 and b"not synced" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_sigterm_stops_the_plain_server_cleanly(tmp_path):
    proc, port = start(tmp_path)
    wait_up(f"http://127.0.0.1:{port}/healthz", None, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


@pytest.mark.parametrize("args, message", [
    (["--tls-cert", "setup.cfg"], "go together"),
    (["--listen", "nowhere"], "HOST:PORT"),
])
def test_bad_serve_options_are_refused_in_words(tmp_path, args, message):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    out = subprocess.run([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr


def test_a_malformed_lease_timing_is_refused():
    with pytest.raises(ValueError, match="retry < renew deadline < duration"):
        LeaseConfig("ns", "l", "me", "http://x", duration_s=5, renew_deadline_s=6, retry_s=1)
