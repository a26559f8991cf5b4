"""The probe listener (`tessera serve --probe-listen`): `/healthz` and `/readyz` for the kubelet, on a port and a
thread of their own.

Why: the admin port runs on waitress, which holds at most CONNECTION_LIMIT (256) connections and closes one that
sent half a request only after CHANNEL_TIMEOUT_S (http/limits.py). Where the CNI does not enforce NetworkPolicy any
pod can reach it, and 300 half-sent requests made `/healthz` there time out (from one pod then; from 16 or more
since the admin port keeps 16 per address, `cap_per_peer`): the kubelet's liveness probe restarted the extender,
again and again, and GPU pods waited (issue 35; tests/test_admin_flood.py). The shipped Deployments point both
probes here instead, and this port is built so that a flood of it cannot do the same:

  * one thread drives every connection non-blocking in a selector, so a stalled client holds no thread;
  * a request is its request line and headers only, at most MAX_REQUEST_BYTES, all of it within `deadline_s` of
    the accept however slowly it dribbles; no body is parsed, and the answer ends the connection (whatever the
    peer still sends is dropped until it closes, or the deadline does);
  * each peer address keeps at most `per_peer` connections open, and all peers `max_open`: a new connection past
    either cap closes that peer's (else everyone's) oldest one. A flood thus closes its own connections first, and
    the kubelet's, which sends its whole request the moment it connects, is answered ahead of any of them: a
    flood that still hid it would need more than `max_open / per_peer` addresses opening connections faster than
    this thread reads one.

Only GET and HEAD of the paths given are answered (`probe_answers` in http/admin.py: the same words as the admin
port's); anything else gets a 404 and nothing more. No Flask, no WSGI: nothing here parses what a peer sends
beyond the request line.
"""

from __future__ import annotations

import http
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

log = logging.getLogger(__name__)

DEADLINE_S = 2.0  # from accept to the last byte of the headers; the kubelet sends ~150 bytes at once
MAX_REQUEST_BYTES = 4096
PER_PEER = 8  # the kubelet runs two probes here, one connection each, one at a time
MAX_OPEN = 256
ACCEPTS_PER_ROUND = 64  # then read what the open connections sent, so a connect flood cannot starve the answers

Answer = Callable[[], tuple[dict, int]]  # the JSON body and the status


@dataclass(slots=True, eq=False)
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    out: bytes = b""
    answered: bool = False  # sent and shut for writing: what still comes is read and dropped until the peer closes


class ProbeListener:
    def __init__(self, host: str, port: int, answers: dict[str, Answer], deadline_s: float = DEADLINE_S,
                 per_peer: int = PER_PEER, max_open: int = MAX_OPEN) -> None:
        self.answers, self.deadline_s, self.per_peer, self.max_open = answers, deadline_s, per_peer, max_open
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=1024)  # bound now: run_servers binds first
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._open: dict[socket.socket, _Conn] = {}  # oldest first (insertion order), so also by deadline
        self._by_peer: dict[str, dict[socket.socket, None]] = {}  # each peer's, oldest first

    def serve(self, stop: threading.Event) -> None:
        """Until `stop` is set; then every connection and the listening socket are closed."""
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        try:
            while not stop.is_set():
                for key, events in self._sel.select(0.25):
                    if key.data is None:
                        self._accept()
                    elif key.data.sock in self._open:  # not closed by an accept earlier in this round
                        (self._read if events & selectors.EVENT_READ else self._write)(key.data)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._open.values()):
                self._close(conn)
            self._sel.close()
            self.sock.close()

    def open_connections(self) -> int:
        return len(self._open)

    # -- connections ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, say: free the oldest, keep serving
                log.warning("probe listener: accept: %s", e)
                if self._open:
                    self._close(next(iter(self._open.values())))
                return
            sock.setblocking(False)
            peer = str(addr[0])
            if len(theirs := self._by_peer.get(peer, {})) >= self.per_peer:
                self._close(self._open[next(iter(theirs))])
            if len(self._open) >= self.max_open:
                self._close(next(iter(self._open.values())))
            conn = _Conn(sock, peer, time.monotonic() + self.deadline_s)
            self._open[sock] = conn
            self._by_peer.setdefault(peer, {})[sock] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.answered:
            return
        conn.buf += data
        head, end, _ = conn.buf.partition(b"\r\n\r\n")
        if end:
            self._respond(conn, *self._answer(bytes(head)))
        elif len(conn.buf) > MAX_REQUEST_BYTES:
            self._respond(conn, {"error": f"tessera: request headers over {MAX_REQUEST_BYTES} bytes"}, 431)

    def _answer(self, head: bytes) -> tuple[dict, int, bool]:
        """The body, the status, and whether to send the body (not for HEAD)."""
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return {"error": "tessera: not an HTTP/1 request"}, 400, True
        method, path = parts[0], parts[1].split(b"?", 1)[0].decode("latin-1")
        answer = self.answers.get(path)
        if method not in (b"GET", b"HEAD") or answer is None:
            return {"error": f"tessera: the probe port answers GET {' and '.join(self.answers)} only"}, 404, True
        try:
            body, status = answer()
        except Exception:  # a probe that raises is an unhealthy answer, not a dead listener
            log.exception("probe listener: %s", path)
            body, status = {"error": f"tessera: {path} failed (see the extender's log)"}, 500
        return body, status, method == b"GET"

    def _respond(self, conn: _Conn, body: dict, status: int, with_body: bool = True) -> None:
        payload = orjson.dumps(body)
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")
        conn.out, conn.buf = head.encode("ascii") + (payload if with_body else b""), bytearray()
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            conn.out = conn.out[conn.sock.send(conn.out):]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn)
            return
        if conn.out:  # the peer's window is full: the rest when it drains (or the deadline closes it)
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        else:
            # not close() yet: with bytes of the request still unread here, Linux would send a reset, and the peer
            # could lose the answer; the peer closes once it has read it (or the deadline does)
            conn.answered = True
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._close(conn)
                return
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _expire(self, now: float) -> None:
        for conn in list(self._open.values()):
            if conn.deadline > now:
                return  # the rest came later
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._open.pop(conn.sock, None) is None:
            return
        theirs = self._by_peer[conn.peer]
        del theirs[conn.sock]
        if not theirs:
            del self._by_peer[conn.peer]
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
