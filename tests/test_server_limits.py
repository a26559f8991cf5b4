"""The limits `tessera serve` gives waitress, on a real server over loopback: a too-large body is
refused from its headers, a client that stalls mid-request is disconnected, others are served meanwhile."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest
import waitress

from extender.http.limits import MAX_BODY_BYTES, waitress_options
from testing.fuzzkit import P, live


@pytest.fixture
def server():
    world = live(max_body_bytes=MAX_BODY_BYTES)
    srv = waitress.create_server(world.app, host="127.0.0.1", port=0, threads=4,
                                 **waitress_options(channel_timeout=1, cleanup_interval=1))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    yield world, srv.effective_port
    srv.close()


def test_a_body_over_the_limit_is_refused_before_it_is_sent(server):
    world, port = server
    before = world.extender.snapshot()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"POST {P}/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(4096):  # no body sent at all: the answer comes from the headers, then waitress closes
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "exceeds" in answer
    assert world.extender.snapshot() == before


def test_a_stalled_client_is_disconnected_and_others_are_served_meanwhile(server):
    world, port = server
    stalled = socket.create_connection(("127.0.0.1", port), timeout=15)
    stalled.sendall(f"POST {P}/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"Pod\":".encode())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    started = time.monotonic()
    closed = stalled.recv(4096)  # blocks until waitress gives up on the stalled request
    assert closed == b"" or closed.startswith(b"HTTP/1.1 4"), closed
    assert time.monotonic() - started < 14
    stalled.close()
    before = world.extender.snapshot()
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # the first one sat idle too: closed as well
    conn.request("POST", f"{P}/filter", body=b"{}", headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 400
    conn.close()
    assert world.extender.snapshot() == before
