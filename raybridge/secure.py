"""The job's own secret, and the rendezvous store that refuses anyone without it.

Why: the job's rendezvous store (where each generation's gloo/NCCL group finds its peers) and its
liveness channel listen on the network. torch's TCPStore takes anyone who connects, and its
clients can list, read, overwrite and delete every key (`list_keys`, `delete_key`): whoever
reaches the port could join or break the job's groups. Here every connection first proves it
holds the job's secret (HMAC-SHA256 over a fresh nonce the server sends: the secret itself never
crosses the wire), and the server closes connections that do not, before reading any request.

The secret is made by the job's controller (`new_secret`) and handed to its trainers through the
job's own Ray cluster (which has its own token: docs/raybridge.md). Requests are length-prefixed
binary frames, never pickle; sizes are bounded so one client cannot grow the server without limit.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time

NONCE_BYTES = 16
MAX_KEY = 1024
MAX_VALUE = 1 << 20  # gloo and NCCL store addresses and ids: bytes to kilobytes
MAX_KEYS = 100_000
MAX_FRAME = MAX_VALUE + MAX_KEY + 64
HANDSHAKE_S = 5.0
MAX_CONNECTIONS = 512  # a job has a few trainers; strangers cannot make the server hold more sockets or threads


class StoreRefused(ConnectionError):
    """The server closed the connection: the secret was wrong, or a limit was broken."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def proof(secret: bytes, purpose: bytes, nonce: bytes, extra: bytes = b"") -> bytes:
    """What a client sends back for `nonce`: the purpose keeps a store proof from serving as a liveness one."""
    return hmac.new(secret, purpose + b"|" + nonce + b"|" + extra, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise StoreRefused("connection closed")
        buf += chunk
    return bytes(buf)


def _pack(*fields: bytes) -> bytes:
    body = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    return struct.pack(">I", len(body)) + body


def _read_frame(sock: socket.socket) -> list[bytes]:
    (size,) = struct.unpack(">I", _recv_exact(sock, 4))
    if size > MAX_FRAME:
        raise StoreRefused(f"frame of {size} bytes is over the limit of {MAX_FRAME}")
    body, fields, at = _recv_exact(sock, size), [], 0
    while at < len(body):
        if at + 4 > len(body):
            raise StoreRefused("truncated field")
        (n,) = struct.unpack(">I", body[at:at + 4])
        fields.append(body[at + 4:at + 4 + n])
        at += 4 + n
    return fields


class AuthStoreServer:
    """The controller's rendezvous store: a key-value map with blocking reads, for proven clients only."""

    PURPOSE = b"tessera-store"

    def __init__(self, secret: bytes, host: str = "127.0.0.1") -> None:
        self.secret = secret
        self._listen = socket.create_server((host, 0))
        self.host, self.port = host, self._listen.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._open = 0  # connections being served (each has a thread)
        self._cancelled: set[bytes] = set()  # key prefixes of abandoned generations: their waits fail at once
        self.refused = 0  # connections closed for a wrong or missing proof
        threading.Thread(target=self._accept_loop, daemon=True, name="rendezvous-store").start()

    def cancel(self, prefix: str) -> None:
        """A generation being formed lost a member: its members' waits for that member fail now
        instead of at the group timeout, so the controller can form the next one at once."""
        with self._cond:
            self._cancelled.add(prefix.encode())
            if len(self._cancelled) > 256:
                self._cancelled.pop()
            self._cond.notify_all()

    def close(self) -> None:
        self._stop.set()
        try:
            self._listen.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listen.accept()
            except OSError:
                return
            with self._cond:
                if self._open >= MAX_CONNECTIONS:
                    self.refused += 1
                    conn.close()
                    continue
                self._open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="rendezvous-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_one(conn)
        finally:
            with self._cond:
                self._open -= 1

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(HANDSHAKE_S)
                nonce = os.urandom(NONCE_BYTES)
                conn.sendall(nonce)
                got = _recv_exact(conn, 32)
                if not hmac.compare_digest(got, proof(self.secret, self.PURPOSE, nonce)):
                    self.refused += 1
                    return
                conn.sendall(b"K")
                conn.settimeout(None)
                while not self._stop.is_set():
                    fields = _read_frame(conn)
                    conn.sendall(self._handle(fields))
            except (OSError, StoreRefused, struct.error):
                return

    def _handle(self, f: list[bytes]) -> bytes:
        if not f or any(len(k) > MAX_KEY for k in f[1:2]):
            return _pack(b"E", b"bad request")
        op, args = f[0], f[1:]
        with self._cond:
            if op == b"S" and len(args) == 2:
                if len(args[1]) > MAX_VALUE or (args[0] not in self._data and len(self._data) >= MAX_KEYS):
                    return _pack(b"E", b"over the store's limits")
                self._data[args[0]] = args[1]
                self._cond.notify_all()
                return _pack(b"O")
            if op == b"G" and len(args) == 2:
                deadline = time.monotonic() + min(float(args[1] or b"0"), 3600.0)
                while args[0] not in self._data:
                    if any(args[0].startswith(p) for p in self._cancelled):
                        return _pack(b"E", b"this generation was abandoned: a member is gone")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return _pack(b"T", b"timed out waiting for " + args[0][:200])
                    self._cond.wait(left)
                return _pack(b"O", self._data[args[0]])
            if op == b"A" and len(args) == 2:
                try:
                    value = int(self._data.get(args[0], b"0")) + int(args[1])
                except ValueError:
                    return _pack(b"E", b"not a number")
                if args[0] not in self._data and len(self._data) >= MAX_KEYS:
                    return _pack(b"E", b"over the store's limits")
                self._data[args[0]] = str(value).encode()
                self._cond.notify_all()
                return _pack(b"O", str(value).encode())
            if op == b"C":
                return _pack(b"O", b"1" if all(k in self._data for k in args) else b"0")
            if op == b"X" and len(args) == 3:
                current = self._data.get(args[0])
                if (current is None and not args[1]) or current == args[1]:
                    if len(args[2]) > MAX_VALUE or (current is None and len(self._data) >= MAX_KEYS):
                        return _pack(b"E", b"over the store's limits")
                    self._data[args[0]] = args[2]
                    self._cond.notify_all()
                    return _pack(b"O", args[2])
                return _pack(b"O", current if current is not None else args[1])
            if op == b"D" and len(args) == 1:
                return _pack(b"O", b"1" if self._data.pop(args[0], None) is not None else b"0")
            if op == b"N":
                return _pack(b"O", str(len(self._data)).encode())
        return _pack(b"E", b"unknown operation")


def _bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def connect_store(host: str, port: int, secret: bytes, timeout_s: float = 30.0, prefix: str = ""):
    """A `torch.distributed.Store` on the controller's AuthStoreServer (gloo and NCCL take any Store).

    `prefix` is put before every key (one generation's namespace): torch's PrefixStore cannot wrap a
    Store written in Python (it calls methods a Python store cannot provide)."""
    pre = prefix.encode()
    import torch.distributed as dist

    class AuthStore(dist.Store):
        def __init__(self) -> None:
            super().__init__()
            self._wait_s = timeout_s
            self._lock = threading.Lock()
            self._sock = socket.create_connection((host, port), timeout=HANDSHAKE_S)
            try:
                nonce = _recv_exact(self._sock, NONCE_BYTES)
                self._sock.sendall(proof(secret, AuthStoreServer.PURPOSE, nonce))
                if _recv_exact(self._sock, 1) != b"K":
                    raise StoreRefused("the rendezvous store refused this job secret")
            except (OSError, StoreRefused) as e:
                self._sock.close()
                raise StoreRefused(f"rendezvous store {host}:{port}: {e}") from None
            self._sock.settimeout(None)

        def _call(self, *fields: bytes) -> bytes:
            with self._lock:
                try:
                    self._sock.sendall(_pack(*fields))
                    reply = _read_frame(self._sock)
                except OSError as e:
                    raise StoreRefused(f"rendezvous store {host}:{port}: {e}") from None
            if reply[0] == b"O":
                return reply[1] if len(reply) > 1 else b""
            msg = reply[1].decode(errors="replace") if len(reply) > 1 else "error"
            raise (TimeoutError if reply[0] == b"T" else RuntimeError)(f"rendezvous store: {msg}")

        def set(self, key, value):
            self._call(b"S", pre + _bytes(key), _bytes(value))

        def get(self, key):
            return self._call(b"G", pre + _bytes(key), str(self._wait_s).encode())

        def add(self, key, amount):
            return int(self._call(b"A", pre + _bytes(key), str(int(amount)).encode()))

        def check(self, keys):
            return self._call(b"C", *[pre + _bytes(k) for k in keys]) == b"1"

        def wait(self, keys, timeout=None):
            for k in keys:
                self._call(b"G", pre + _bytes(k), str(timeout.total_seconds() if timeout else self._wait_s).encode())

        def compare_set(self, key, expected, desired):
            return self._call(b"X", pre + _bytes(key), _bytes(expected), _bytes(desired))

        def delete_key(self, key):
            return self._call(b"D", pre + _bytes(key)) == b"1"

        def num_keys(self):
            return int(self._call(b"N"))

    return AuthStore()
