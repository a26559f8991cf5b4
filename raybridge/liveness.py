"""Process liveness without waiting for Ray: each trainer holds one TCP connection to its controller.

Why: when a trainer's process dies (its node or pod is killed), its kernel closes the connection at
once and the controller reads EOF within milliseconds, while Ray names the dead actor only after
its node health check fails (about 0.4 s with the fast settings of raycluster.py, 12-14 s with the
defaults). A live process keeps its connection however slow it is under load, so a closed
connection is proof of death, never a guess from a timeout. A frozen process (SIGSTOP) or a machine
that vanished without a reset keeps the connection open too: the controller finds those with a ping
that goes unanswered (controller.py), not here.

Only the job's trainers may speak here: a connection that could claim a trainer's name and then
close would have that healthy trainer declared dead. So the server sends each connection a fresh
nonce and accepts the name only with its HMAC under the job's secret (secure.py); anything else
is closed unheard and counted in `refused`.
"""

from __future__ import annotations

import hmac
import os
import selectors
import socket
import threading
import time

from .secure import NONCE_BYTES, proof

PURPOSE = b"tessera-liveness"
MAX_LINE = 512
PROVE_WITHIN_S = 5.0  # an unproven connection is closed after this long
MAX_UNPROVEN = 256  # unproven connections held at once; more are closed at accept


class LivenessServer:
    """Accepts one connection per trainer (the trainer sends its name and a newline) and notes when
    each closes. Owns its sockets and its table; `gone()` is the only way in from other threads."""

    def __init__(self, secret: bytes, host: str = "127.0.0.1") -> None:
        self.secret = secret
        self.refused = 0  # connections closed for a missing or wrong proof
        self._nonces: dict[socket.socket, bytes] = {}
        self._accepted: dict[socket.socket, float] = {}  # unproven connections: when accepted
        self._listen = socket.create_server((host, 0))
        self._listen.setblocking(False)
        self.host, self.port = host, self._listen.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._gone: dict[str, float] = {}  # name -> monotonic time its connection closed
        self._names: dict[socket.socket, str] = {}
        self._partial: dict[socket.socket, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="liveness")
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def gone(self) -> dict[str, float]:
        """Trainers whose process closed its connection, with when it was seen."""
        with self._lock:
            return dict(self._gone)

    def connected(self) -> set[str]:
        with self._lock:
            return set(self._names.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=0.05):
                    if key.fileobj is self._listen:
                        self._accept()
                    else:
                        self._read(key.fileobj)
                self._expire(time.monotonic())
        finally:
            for sock in [self._listen, *self._names, *self._partial]:  # _accepted is a subset of _partial
                sock.close()
            self._sel.close()

    def _expire(self, now: float) -> None:
        """Strangers cannot hold sockets here: a connection that has not proven itself in time is closed."""
        for conn in [c for c, at in self._accepted.items() if now - at > PROVE_WITHIN_S]:
            self.refused += 1
            self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        self._partial.pop(conn, None)
        self._nonces.pop(conn, None)
        self._accepted.pop(conn, None)
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listen.accept()
        except BlockingIOError:
            return
        if len(self._accepted) >= MAX_UNPROVEN:
            self.refused += 1
            conn.close()
            return
        nonce = os.urandom(NONCE_BYTES)
        try:
            conn.sendall(nonce)
        except OSError:
            conn.close()
            return
        self._accepted[conn] = time.monotonic()
        conn.setblocking(False)
        self._partial[conn] = b""
        self._nonces[conn] = nonce
        self._sel.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and conn in self._partial:  # still reading the name line
            buf = self._partial[conn] + data
            if b"\n" in buf:
                line = buf.split(b"\n", 1)[0]
                del self._partial[conn]
                self._accepted.pop(conn, None)
                nonce = self._nonces.pop(conn, b"")
                raw, _, mac = line.rpartition(b" ")
                try:
                    good = hmac.compare_digest(bytes.fromhex(mac.decode("ascii")), proof(self.secret, PURPOSE, nonce, raw))
                except (ValueError, UnicodeDecodeError):
                    good = False
                if not good:  # not one of the job's trainers: closed unheard, nobody is declared dead
                    self.refused += 1
                    self._sel.unregister(conn)
                    conn.close()
                    return
                name = raw.decode(errors="replace")
                with self._lock:
                    self._names[conn] = name
                    self._gone.pop(name, None)  # a reconnect (the trainer was adopted again)
            elif len(buf) > MAX_LINE:
                self.refused += 1
                self._forget(conn)
            else:
                self._partial[conn] = buf
            return
        if data:
            return  # trainers send nothing after their name
        self._forget(conn)
        with self._lock:  # connected() reads _names from the controller's thread
            name = self._names.pop(conn, None)
            if name is not None:
                if name not in self._names.values():
                    self._gone[name] = time.monotonic()


def hold(host: str, port: int, name: str, secret: bytes, timeout_s: float = 10.0) -> socket.socket:
    """The trainer's side: connect, prove it holds the job's secret, say who it is; the caller keeps
    the socket for its lifetime."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    nonce = b""
    while len(nonce) < NONCE_BYTES:
        chunk = sock.recv(NONCE_BYTES - len(nonce))
        if not chunk:
            sock.close()
            raise ConnectionError(f"liveness server {host}:{port} closed the connection")
        nonce += chunk
    raw = name.encode()
    sock.sendall(raw + b" " + proof(secret, PURPOSE, nonce, raw).hex().encode() + b"\n")
    return sock
