"""TLS in front of the verbs: handshakes off any thread a request needs, then a relay to waitress.

Why not cheroot (what `--tls-cert` ran on before): cheroot wraps each accepted socket in its accept
loop, and the TLS handshake happens right there, blocking, for up to its socket timeout: one TCP
connection that sends nothing stalls every client, kube-scheduler included, for that long.

Here one thread accepts and drives every handshake non-blocking in a selector, each with its own
deadline (`handshake_s`, counted from accept, however slowly the peer dribbles bytes); at most
`max_pending` handshakes wait at once (the oldest is dropped first). A peer without a client
certificate signed by the CA fails the handshake and gets no HTTP answer at all. Only a finished
handshake gets a relay thread (at most `max_connections`), which pipes bytes to the verbs' waitress
listening on a private unix socket; waitress then applies its own request limits (body size, a
stalled half-sent request closed after its channel timeout), and a relay idle for `idle_s` closes.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time

log = logging.getLogger(__name__)

HANDSHAKE_S = 5.0
MAX_PENDING_HANDSHAKES = 1024


class TlsFront:
    def __init__(self, host: str, port: int, context: ssl.SSLContext, upstream: str, handshake_s: float = HANDSHAKE_S,
                 idle_s: float = 60.0, max_connections: int = 256, max_pending: int = MAX_PENDING_HANDSHAKES) -> None:
        self.context, self.upstream = context, upstream
        self.handshake_s, self.idle_s, self.max_pending = handshake_s, idle_s, max_pending
        self._slots = threading.BoundedSemaphore(max_connections)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=1024)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._pending: dict[ssl.SSLSocket, float] = {}  # handshaking socket -> deadline (monotonic)

    # -- the accept and handshake loop (one thread) --------------------------------------------------

    def serve(self, stop: threading.Event) -> None:
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        try:
            while not stop.is_set():
                for key, _ in self._sel.select(0.25):
                    if key.data is None:
                        self._accept()
                    else:
                        self._handshake(key.fileobj)
                now = time.monotonic()
                for tls, deadline in list(self._pending.items()):
                    if now >= deadline:
                        self._drop(tls)
        finally:
            for tls in list(self._pending):
                self._drop(tls)
            self._sel.close()
            self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, say: refuse this one, keep serving
                log.warning("accept: %s", e)
                return
            if len(self._pending) >= self.max_pending:
                self._drop(min(self._pending, key=self._pending.__getitem__))
            try:
                # every answer goes out at once: the relay forwards waitress's header and body writes as two
                # segments, and with Nagle on the second waited for the client's delayed ACK (40 ms on Linux)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setblocking(False)
                tls = self.context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError):
                conn.close()
                continue
            self._pending[tls] = time.monotonic() + self.handshake_s
            self._sel.register(tls, selectors.EVENT_READ, "handshake")

    def _handshake(self, tls: ssl.SSLSocket) -> None:
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(tls, selectors.EVENT_READ, "handshake")
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(tls, selectors.EVENT_WRITE, "handshake")
            return
        except (ssl.SSLError, OSError):  # no client certificate, a wrong one, or not TLS at all
            self._drop(tls)
            return
        self._sel.unregister(tls)
        del self._pending[tls]
        if not self._slots.acquire(blocking=False):
            tls.close()  # every relay busy: the peer reconnects
            return
        threading.Thread(target=self._relay, args=(tls,), daemon=True, name="tls-relay").start()

    def _drop(self, tls: ssl.SSLSocket) -> None:
        self._pending.pop(tls, None)
        try:
            self._sel.unregister(tls)
        except (KeyError, ValueError):
            pass
        tls.close()

    # -- one relay per authenticated connection --------------------------------------------------------

    def _relay(self, tls: ssl.SSLSocket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # a selector, not select.select: that refuses descriptors from 1024 up, and 1020 silent connections from
        # any pod pushed every new one there, so every relay, kube-scheduler's too, ended at once
        sel = selectors.DefaultSelector()
        try:
            tls.setblocking(True)
            tls.settimeout(self.idle_s)
            up.settimeout(self.idle_s)
            up.connect(self.upstream)
            sel.register(tls, selectors.EVENT_READ)
            sel.register(up, selectors.EVENT_READ)
            while True:
                if tls.pending():
                    ready = [tls]
                else:
                    ready = [key.fileobj for key, _ in sel.select(self.idle_s)]
                    if not ready:
                        return  # idle: kube-scheduler reconnects when it next calls
                for s in ready:
                    if s is tls:
                        try:
                            data = tls.recv(65536)
                        except ssl.SSLWantReadError:
                            continue
                        if not data:
                            return
                        up.sendall(data)
                    else:
                        data = up.recv(65536)
                        if not data:
                            return
                        tls.sendall(data)
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            sel.close()
            up.close()
            tls.close()
            self._slots.release()
