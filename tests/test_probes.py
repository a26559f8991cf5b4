"""The probe listener (extender/http/probes.py) on a real socket: it answers GET and HEAD of /healthz and /readyz
only, closes what stalls at its deadline, and a flood of its own port, from one address or many, still leaves the
kubelet's request answered at once."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from extender.http.probes import MAX_REQUEST_BYTES, ProbeListener

KUBELET = b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.5:8890\r\nUser-Agent: kube-probe/1.20\r\nAccept: */*\r\n" \
          b"Connection: close\r\n\r\n"
STALL = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # half a request


def broken() -> tuple[dict, int]:
    raise RuntimeError("boom")


@pytest.fixture
def listener():
    answers = {"/healthz": lambda: ({"ok": True}, 200), "/readyz": lambda: ({"ready": False, "reason": "why"}, 503),
               "/broken": broken}
    probe = ProbeListener("127.0.0.1", 0, answers, deadline_s=1.0, per_peer=8, max_open=64)
    stop = threading.Event()
    thread = threading.Thread(target=probe.serve, args=(stop,), daemon=True)
    thread.start()
    yield probe
    stop.set()
    thread.join(5)


def ask(port: int, request: bytes = KUBELET, source: str = "127.0.0.1", timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer


def stalled(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    hogs = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        s.sendall(STALL)
        hogs.append(s)
    return hogs


def closed_by_server(s: socket.socket, within_s: float = 5) -> bool:
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def until(condition, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_it_answers_the_probes_and_nothing_else(listener):
    port = listener.port
    ok = ask(port)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b'\r\n\r\n{"ok":true}')
    assert b"Connection: close" in ok and b"Content-Type: application/json" in ok
    ready = ask(port, b"GET /readyz?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ready.startswith(b"HTTP/1.1 503 ") and ready.endswith(b'{"ready":false,"reason":"why"}')
    head = ask(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n") and b"Content-Length: 11" in head
    for request in (b"GET /metrics HTTP/1.1\r\n\r\n", b"GET /inspect HTTP/1.1\r\n\r\n",
                    b"POST /healthz HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"GET /healthz/../inspect HTTP/1.1\r\n\r\n"):
        assert ask(port, request).startswith(b"HTTP/1.1 404 "), request
    assert ask(port, b"\x16\x03\x01 hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert ask(port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_BYTES * 2).startswith(b"HTTP/1.1 431 ")
    failed = ask(port, b"GET /broken HTTP/1.1\r\n\r\n")
    assert failed.startswith(b"HTTP/1.1 500 ") and b"boom" not in failed
    assert ask(port).startswith(b"HTTP/1.1 200 ")  # and it goes on answering
    assert until(lambda: listener.open_connections() == 0)


def test_a_stalled_connection_is_closed_at_its_deadline_however_it_dribbles(listener):
    (hog,) = stalled(listener.port, 1)
    dribbler = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
    started = time.monotonic()
    for byte in b"GET /h":  # a byte every 0.2 s: still cut at the deadline, counted from the accept
        dribbler.sendall(bytes([byte]))
        time.sleep(0.2)
    assert closed_by_server(hog) and closed_by_server(dribbler)
    assert time.monotonic() - started < 2.5
    hog.close()
    dribbler.close()


def test_one_peer_holds_at_most_its_share_and_loses_its_oldest_first(listener):
    hogs = stalled(listener.port, 20, source="127.0.0.2")
    try:
        assert until(lambda: listener.open_connections() == 8)
        assert all(closed_by_server(h, 0.5) for h in hogs[:12])  # the oldest twelve, closed to make room
        assert not any(closed_by_server(h, 0.05) for h in hogs[12:])
        started = time.monotonic()
        assert ask(listener.port, timeout=1).startswith(b"HTTP/1.1 200 ")  # another peer: answered at once
        # the same peer too: its new connection is its newest, and a probe sends its request at once
        assert ask(listener.port, source="127.0.0.2", timeout=1).startswith(b"HTTP/1.1 200 ")
        assert time.monotonic() - started < 1.0
    finally:
        for h in hogs:
            h.close()


@pytest.mark.parametrize("peers", [1, 40])
def test_300_stalled_connections_on_the_probe_port_leave_the_kubelet_answered_within_1s(listener, peers):
    """From one address or from forty (40 x 8 = 320 > 64 open at most): the open count stays capped, the oldest go."""
    hogs = []
    try:
        for i in range(300):
            hogs += stalled(listener.port, 1, source=f"127.0.1.{i % peers + 1}")
        assert until(lambda: listener.open_connections() <= min(8 * peers, 64))
        started = time.monotonic()
        answer = ask(listener.port, timeout=1)
        took = time.monotonic() - started
        print(f"probe port, 300 stalled from {peers} address(es), {listener.open_connections()} open: {took:.4f} s")
        assert answer.startswith(b"HTTP/1.1 200 ") and took < 1.0, took
    finally:
        for h in hogs:
            h.close()
