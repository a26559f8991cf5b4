"""The liveness server names a trainer dead when its process dies, never while it is merely stopped,
and never because someone without the job's secret connected under a trainer's name and hung up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from raybridge.liveness import LivenessServer, hold

SECRET = b"s" * 32
HOLDER = "import sys, time; from raybridge.liveness import hold; " \
         "s = hold('127.0.0.1', int(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3])); " \
         "print('up', flush=True); time.sleep(600)"


def holder(port: int, name: str, secret: bytes = SECRET) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), name, secret.hex()], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def wait_until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_killed_process_is_gone_in_milliseconds_a_stopped_one_is_not():
    server = LivenessServer(SECRET)
    a, b = holder(server.port, "ns/a"), holder(server.port, "ns/b")
    try:
        assert wait_until(lambda: server.connected() == {"ns/a", "ns/b"})
        os.kill(b.pid, signal.SIGSTOP)  # frozen: the connection stays open, so not dead (pings find it)
        t0 = time.monotonic()
        a.kill()
        assert wait_until(lambda: "ns/a" in server.gone())
        assert server.gone()["ns/a"] - t0 < 0.5
        time.sleep(0.3)
        assert "ns/b" not in server.gone()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        server.close()


def test_a_reconnect_under_the_same_name_clears_its_death():
    server = LivenessServer(SECRET)
    first = holder(server.port, "ns/x")
    first.kill()
    first.wait()
    assert wait_until(lambda: "ns/x" in server.gone())
    second = holder(server.port, "ns/x")  # the same trainer, adopted by a new controller
    try:
        assert wait_until(lambda: "ns/x" not in server.gone() and server.connected() == {"ns/x"})
    finally:
        second.kill()
        second.wait()
        server.close()


def test_a_connection_without_the_jobs_secret_cannot_declare_a_trainer_dead_or_hide_its_death():
    """Before: any client that reached the port could send a trainer's name; holding that connection
    open hid the trainer's death (seen on main: the dead trainer was never named gone), and a name
    sent first then closed declared a trainer dead. Now the name counts only with its proof."""
    server = LivenessServer(SECRET)
    victim = holder(server.port, "ns/victim")
    try:
        assert wait_until(lambda: server.connected() == {"ns/victim"})
        for line in (b"ns/victim\n", b"ns/victim " + b"00" * 32 + b"\n", b"x" * 4096):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(line)
            time.sleep(0.1)
            s.close()
        with pytest.raises(ConnectionError):  # a wrong secret: closed unheard (the read sees the close)
            s = hold("127.0.0.1", server.port, "ns/victim", b"w" * 32)
            time.sleep(0.2)
            s.sendall(b"x")
            if not s.recv(1):
                raise ConnectionError("closed")
        time.sleep(0.3)
        assert "ns/victim" not in server.gone() and server.connected() == {"ns/victim"}
        assert server.refused >= 3
        squatter = socket.create_connection(("127.0.0.1", server.port))  # holds the name open, no proof
        squatter.sendall(b"ns/victim\n")
        time.sleep(0.1)
        victim.kill()
        assert wait_until(lambda: "ns/victim" in server.gone(), 2.0), "a stranger hid the trainer's death"
        squatter.close()
    finally:
        victim.kill()
        victim.wait()
        server.close()


def test_strangers_cannot_hold_sockets_on_the_liveness_server(monkeypatch):
    import raybridge.liveness as lv

    monkeypatch.setattr(lv, "PROVE_WITHIN_S", 0.3)
    server = LivenessServer(SECRET)
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]  # never prove anything
        time.sleep(0.2)
        assert len(server._accepted) == 5
        assert wait_until(lambda: not server._accepted, 3.0), "unproven connections must be closed after a while"
        assert server.refused >= 5
        for s in idle:
            s.close()
        trainer = holder(server.port, "ns/t")  # the job's own trainers still get in
        assert wait_until(lambda: server.connected() == {"ns/t"})
        trainer.kill()
        trainer.wait()
    finally:
        server.close()
