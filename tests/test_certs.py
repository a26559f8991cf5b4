"""`tessera certs`: the CA and certificates mutual TLS needs, checked by real TLS handshakes."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from extender.certs import FILES, make_certs
from testing.local_cluster import ROOT


def handshake(pki: Path, server: str, client: str | None, name: str) -> str:
    """'' when a TLS handshake between the two succeeds (server requires a client certificate), else why not."""
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(pki / f"{server}.crt", pki / f"{server}.key")
    sctx.verify_mode = ssl.CERT_REQUIRED
    sctx.load_verify_locations(pki / "ca.crt")
    cctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        cctx.load_cert_chain(pki / f"{client}.crt", pki / f"{client}.key")
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    errors: list[str] = []

    def serve():
        try:
            with sctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            errors.append(f"server: {e}")

    t = threading.Thread(target=serve)
    t.start()
    try:
        with cctx.wrap_socket(b, server_hostname=name) as c:
            c.sendall(b"x")
            c.recv(1)  # the server's verdict on our certificate arrives after the client's handshake (TLS 1.3)
    except (ssl.SSLError, OSError) as e:
        errors.append(f"client: {e}")
    t.join(5)
    return "; ".join(errors)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs") / "pki"
    done = subprocess.run([sys.executable, "-m", "extender.cli", "certs", "--out", str(out), "--dns", "tessera.example.org",
                           "--ip", "10.96.0.50", "--days", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "create secret generic tessera-extender-tls" in done.stdout and "/etc/kubernetes/tessera" in done.stdout
    # second-scheduler mode: the Secret its kube-scheduler pods mount, keyed as its config's tlsConfig reads the files
    assert (f"create secret generic tessera-scheduler-tls \\\n       --from-file={out}/scheduler.crt "
            f"--from-file={out}/scheduler.key --from-file={out}/ca.crt") in done.stdout
    return out


def test_the_files_and_their_modes(pki):
    assert sorted(p.name for p in pki.iterdir()) == sorted(FILES)
    for f in FILES:
        assert (pki / f).stat().st_mode & 0o777 == (0o600 if f.endswith(".key") else 0o644)


@pytest.mark.parametrize("name", ["tessera-extender.tessera-system.svc", "tessera-extender.tessera-system",
                                  "tessera-extender.tessera-system.svc.cluster.local", "tessera.example.org",
                                  "127.0.0.1", "10.96.0.50"])
def test_the_scheduler_reaches_the_extender_by_each_name(pki, name):
    assert handshake(pki, "server", "scheduler", name) == ""


def test_a_replica_presents_its_server_certificate_as_a_client(pki):
    assert handshake(pki, "server", "server", "tessera-extender.tessera-system.svc") == ""


@pytest.mark.parametrize("client, name, why", [
    (None, "tessera-extender.tessera-system.svc", "server:"),  # no client certificate: refused by the extender
    ("scheduler", "elsewhere.example.org", "Hostname mismatch"),  # a name the server certificate does not carry
])
def test_what_is_refused(pki, client, name, why):
    assert why in handshake(pki, "server", client, name)


def test_a_certificate_from_another_ca_is_refused(pki, tmp_path):
    other = make_certs(tmp_path / "other")["scheduler.crt"].parent
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in FILES:
        (mixed / f).write_bytes((pki / f).read_bytes())
    (mixed / "rogue.crt").write_bytes((other / "scheduler.crt").read_bytes())
    (mixed / "rogue.key").write_bytes((other / "scheduler.key").read_bytes())
    assert "server:" in handshake(mixed, "server", "rogue", "tessera-extender.tessera-system.svc")


@pytest.mark.parametrize("args, message", [
    (["--days", "0"], "between 1 and 3650"),
    (["--dns", "bad name/x"], "is not a DNS name"),
    (["--ip", "not-an-ip"], "does not appear to be an IPv4 or IPv6 address"),
])
def test_bad_arguments_are_refused_in_words(tmp_path, args, message):
    done = subprocess.run([sys.executable, "-m", "extender.cli", "certs", "--out", str(tmp_path / "x"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_an_existing_ca_is_never_overwritten(pki):
    before = (pki / "ca.key").read_bytes()
    with pytest.raises(ValueError, match="already holds ca.crt, ca.key"):
        make_certs(pki)
    assert (pki / "ca.key").read_bytes() == before
