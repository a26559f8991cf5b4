"""The job's rendezvous store answers only clients that hold the job's secret; gloo forms groups on it.

Before (torch's TCPStore): any process that reached the port could list the job's keys, read them,
overwrite them and delete them (a hostile neighbour breaking or joining the job's groups).
"""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest

from raybridge.secure import MAX_FRAME, MAX_VALUE, AuthStoreServer, StoreRefused, connect_store, new_secret


def test_a_client_without_the_secret_gets_no_answer():
    secret = new_secret()
    server = AuthStoreServer(secret)
    try:
        good = connect_store("127.0.0.1", server.port, secret, timeout_s=2)
        good.set("job/g1/key", b"value")
        with pytest.raises(StoreRefused):
            connect_store("127.0.0.1", server.port, new_secret(), timeout_s=2)
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # no handshake at all: a request
        raw.recv(16)
        raw.sendall(b"\x00\x00\x00\x09" + b"\x00\x00\x00\x01N" + b"\x00" * 32)
        try:
            answer = raw.recv(64)
        except ConnectionResetError:
            answer = b""
        assert answer == b"", "a request without the proof must be closed unanswered"
        assert good.get("job/g1/key") == b"value" and server.refused == 2
        assert good.num_keys() == 1 and good.add("n", 3) == 3 and good.check(["n"]) and good.delete_key("n")
        with pytest.raises(TimeoutError):
            good.wait(["missing"], datetime.timedelta(seconds=0.2))
    finally:
        server.close()


def test_limits_are_refused_in_words_and_change_nothing():
    secret = new_secret()
    server = AuthStoreServer(secret)
    try:
        store = connect_store("127.0.0.1", server.port, secret, timeout_s=2)
        with pytest.raises(RuntimeError, match="limits"):
            store.set("big", b"x" * (MAX_VALUE + 1))
        assert store.num_keys() == 0
        with pytest.raises(StoreRefused):  # a frame over the limit: the server hangs up before reading it
            store.set("bigger", b"x" * (MAX_FRAME + 1))
        assert server._data == {}
    finally:
        server.close()


def test_gloo_forms_a_group_and_allreduces_through_it():
    import torch
    import torch.distributed as dist

    secret = new_secret()
    server = AuthStoreServer(secret)
    out = {}

    def member(rank):
        store = connect_store("127.0.0.1", server.port, secret, timeout_s=10, prefix="job/g1/")
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=10)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(store, rank, 2, opts)
        t = torch.full((4,), float(rank + 1))
        pg.allreduce([t]).wait()
        out[rank] = t.tolist()

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    assert out == {0: [3.0] * 4, 1: [3.0] * 4}


def test_strangers_cannot_make_the_store_hold_unbounded_connections(monkeypatch):
    import raybridge.secure as sec

    monkeypatch.setattr(sec, "MAX_CONNECTIONS", 3)
    secret = new_secret()
    server = AuthStoreServer(secret)
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            got = extra.recv(16)
        except ConnectionResetError:
            got = b""
        assert got == b"", "over the connection limit: closed at once, no nonce"
        for s in idle:
            s.close()
        time.sleep(0.3)
        store = connect_store("127.0.0.1", server.port, secret, timeout_s=2)  # the job's own still get in
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        server.close()
