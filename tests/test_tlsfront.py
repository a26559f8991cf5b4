"""http/tlsfront.py in-process: handshakes never wait on each other, and what waits is bounded."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from extender.http.tlsfront import TlsFront
from tests.pki import make_pki


@pytest.fixture
def front(tmp_path):
    pki = make_pki(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(pki / "ca.crt")
    upstream = socket.socket(socket.AF_UNIX)  # an echo server standing in for waitress
    path = str(tmp_path / "up.sock")
    upstream.bind(path)
    upstream.listen()

    def echo():
        while True:
            try:
                c, _ = upstream.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=c: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")], daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    f = TlsFront("127.0.0.1", 0, ctx, path, handshake_s=1.0, max_pending=8)
    stop = threading.Event()
    threading.Thread(target=f.serve, args=(stop,), daemon=True).start()
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client.load_cert_chain(pki / "scheduler.crt", pki / "scheduler.key")
    yield f, client
    stop.set()
    upstream.close()


def echo_once(port: int, client: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"ping")
            return tls.recv(4)


def test_an_authenticated_client_is_relayed_past_a_crowd_of_silent_ones(front):
    f, client = front
    silent = [socket.create_connection(("127.0.0.1", f.port)) for _ in range(30)]  # more than max_pending
    try:
        time.sleep(0.3)
        assert len(f._pending) <= 8  # the oldest were dropped to keep the bound
        assert echo_once(f.port, client) == b"ping"
        time.sleep(1.5)  # past the handshake deadline: every silent one is closed
        assert not f._pending
        for s in silent:
            s.settimeout(5)
            assert s.recv(1) == b""
    finally:
        for s in silent:
            s.close()


def test_plain_http_and_garbage_get_nothing(front):
    f, _ = front
    with socket.create_connection(("127.0.0.1", f.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            got = s.recv(4096)
        except ConnectionResetError:
            got = b""
        assert not got.startswith(b"HTTP")  # at most a TLS alert record, never an HTTP answer


def test_answers_are_not_held_back_by_nagle(tmp_path):
    """Waitress writes an answer's headers and body separately and the relay forwards each as it comes:
    without TCP_NODELAY the body waited for the client's delayed ACK, about 40 ms per verb call
    (kube-scheduler's openb replay, bench/kube_openb.py, ran at 8 pods/s through the TLS front)."""
    pki = make_pki(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    f = TlsFront("127.0.0.1", 0, ctx, str(tmp_path / "none.sock"))
    with socket.create_connection(("127.0.0.1", f.port)):
        for _ in range(50):  # the kernel completes the connection before accept(); give it a moment
            f._accept()
            if f._pending:
                break
            time.sleep(0.02)
        (accepted,) = f._pending
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        f._drop(accepted)
    f.sock.close()


def test_a_relay_works_on_descriptors_past_1024(front):
    """select.select refuses descriptors from 1024 up; 1020 silent connections from any pod put every new one there,
    and every relay, kube-scheduler's too, ended at once. The relay waits on a selector (poll/epoll) instead."""
    import resource

    f, client = front
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the file limit here ({hard}) cannot reach descriptor 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = []
    try:
        while not filler or filler[-1].fileno() < 1030:  # the relay's sockets will be numbered above this
            filler.append(socket.socket())
        assert echo_once(f.port, client) == b"ping"
    finally:
        for s in filler:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
