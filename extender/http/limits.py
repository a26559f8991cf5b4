"""How much a request may send and how long a connection may sit idle: one place, for the app, waitress and cheroot.

Body size: kube-scheduler with `nodeCacheCapable: false` sends every candidate Node object in
full. bench/body_size.py measures a production-sized GPU node (50 images, 60 labels, managedFields,
Tessera's inventory) at 21.5 KiB: 5000 nodes make a 105 MiB filter body. The limit leaves room for
nodes twice that size; with the shipped `nodeCacheCapable: true` a 5000-node body is ~100 KiB.
waitress refuses a larger body from its Content-Length (or while counting a chunked one) before
buffering it, so a huge body costs neither memory nor parsing; Flask's MAX_CONTENT_LENGTH says the
same again in JSON for any other WSGI server.

Time: a handler cannot be interrupted in Python, so the verbs bound their own time (gang waits stop
at GANG_WAIT_S, below kube-scheduler's httpTimeout); waitress closes connections idle (a client that
sends half a request and stalls) after CHANNEL_TIMEOUT_S, checked every CLEANUP_INTERVAL_S, and caps
open connections so a flood of them cannot take every file descriptor.
"""

from __future__ import annotations

MAX_BODY_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
CHANNEL_TIMEOUT_S = 60  # kube-scheduler's shipped httpTimeout is 30 s; an idle keep-alive reconnects for free
CLEANUP_INTERVAL_S = 10
CONNECTION_LIMIT = 256


def waitress_options(**overrides) -> dict:
    """Keyword arguments for waitress.serve/create_server that apply the limits above."""
    options = {"max_request_body_size": MAX_BODY_BYTES, "max_request_header_size": MAX_HEADER_BYTES,
               "channel_timeout": CHANNEL_TIMEOUT_S, "cleanup_interval": CLEANUP_INTERVAL_S,
               "connection_limit": CONNECTION_LIMIT}
    options.update(overrides)
    return options


def apply_to_cheroot(server) -> None:
    """The same size limits on cheroot's server (the HTTPS path: waitress has no TLS).

    Its own `timeout` (10 s per socket read, stricter than waitress' idle limit) is kept.
    """
    server.max_request_body_size = MAX_BODY_BYTES
    server.max_request_header_size = MAX_HEADER_BYTES
