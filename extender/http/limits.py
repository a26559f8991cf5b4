"""How much a request may send and how long a connection may sit idle: one place, for the app, waitress and cheroot.

Body size: every byte accepted is parsed into Python objects (several times its size in memory),
per concurrent request, so the limit is the largest body kube-scheduler legitimately sends for the
cluster, not a round number. `max_body_bytes(nodes, node_cache_capable)` computes it:
  * one Pod: the API server stores at most 1.5 MiB per object (etcd's request limit); its JSON
    can be larger than the stored protobuf, so POD_BYTES allows 3 MiB;
  * with the shipped `nodeCacheCapable: true`, filter and prioritize carry node NAMES: at most
    253 characters each (a DNS subdomain) plus quotes and a comma, NODE_NAME_BYTES (names like
    bench's make a 5000-node body ~100 KiB; this allows 1.2 MiB);
  * preempt then carries victims by UID for the candidate nodes: kube-scheduler 1.20's default
    preemption dry-runs max(10% of nodes, 100) candidates and may return that many of each kind
    (with and without PDB violations), each with at most MAX_PODS_PER_NODE victims (kubelet's
    default maxPods) of VICTIM_BYTES;
  * with `nodeCacheCapable: false`, every Node object comes in full: bench/body_size.py measures a
    production-sized GPU node (50 images, 60 labels, managedFields, Tessera's inventory) at
    21.5 KiB; FULL_NODE_BYTES allows twice that. (Preemption then sends the victims as full Pods,
    which no fixed limit covers: run with nodeCacheCapable, as shipped.)
MAX_BODY_BYTES, the default, is `max_body_bytes(DEFAULT_NODES)`: 10 MiB for 5000 nodes (the old
fixed limit was 256 MiB). A larger cluster, more pods per node, or nodeCacheCapable false needs
`create_app(max_body_bytes=max_body_bytes(n, ...))`. waitress refuses a larger body from its
Content-Length (or while counting a chunked one) before buffering it, so a huge body costs neither
memory nor parsing; Flask's MAX_CONTENT_LENGTH says the same again in JSON for any other WSGI server.

Time: a handler cannot be interrupted in Python, so the verbs bound their own time (no verb waits for
another pod: a gang is admitted whole before any member binds, gangs.py; a bind waits at most
reservations.WATCH_WAIT_S for the watch to deliver its pod); waitress closes connections idle (a client that
sends half a request and stalls) after CHANNEL_TIMEOUT_S, checked every CLEANUP_INTERVAL_S, and caps
open connections so a flood of them cannot take every file descriptor.

Per peer (the admin port, `cap_per_peer`): at CONNECTION_LIMIT waitress stops accepting, and where NetworkPolicy
is not enforced one pod's 300 half-sent requests held the admin port for everyone until they idled out. A peer
past ADMIN_PER_PEER open connections now loses its oldest idle one, so one pod holds that many, not all; pods
enough together still can, which is why the kubelet's probes have a listener of their own (http/probes.py).
"""

from __future__ import annotations

MIB = 1024 * 1024
POD_BYTES = 3 * MIB
NODE_NAME_BYTES = 256
FULL_NODE_BYTES = 44 * 1024
MAX_PODS_PER_NODE = 110
VICTIM_BYTES = 64  # {"UID":"<36 characters>"} and a comma
DEFAULT_NODES = 5000  # the scale Tessera is benchmarked at (bench/extender_latency.py)


def max_body_bytes(nodes: int, node_cache_capable: bool = True) -> int:
    """The largest body kube-scheduler sends to an extender for a cluster of `nodes`, rounded up to a MiB."""
    nodes = max(1, nodes)
    if node_cache_capable:
        candidates = min(nodes, 2 * max(nodes // 10, 100))
        preempt = candidates * (NODE_NAME_BYTES + 32 + MAX_PODS_PER_NODE * VICTIM_BYTES)
        largest = max(nodes * NODE_NAME_BYTES, preempt)
    else:
        largest = nodes * FULL_NODE_BYTES
    return -(-(POD_BYTES + largest) // MIB) * MIB


MAX_BODY_BYTES = max_body_bytes(DEFAULT_NODES)
MAX_HEADER_BYTES = 64 * 1024
CHANNEL_TIMEOUT_S = 60  # kube-scheduler's shipped httpTimeout is 30 s; an idle keep-alive reconnects for free
CLEANUP_INTERVAL_S = 10
CONNECTION_LIMIT = 256
ADMIN_PER_PEER = 16  # a Prometheus keeps one per scrape job; a browser through kubectl port-forward opens ~6


def waitress_options(**overrides) -> dict:
    """Keyword arguments for waitress.serve/create_server that apply the limits above."""
    options = {"max_request_body_size": MAX_BODY_BYTES, "max_request_header_size": MAX_HEADER_BYTES,
               "channel_timeout": CHANNEL_TIMEOUT_S, "cleanup_interval": CLEANUP_INTERVAL_S,
               "connection_limit": CONNECTION_LIMIT,
               # poll, not select: select's loop dies on a descriptor of 1024 or more, which enough idle
               # connections from any pod make every new one
               "asyncore_use_poll": True}
    options.update(overrides)
    return options


def cap_per_peer(server, per_peer: int = ADMIN_PER_PEER):
    """Make a waitress server (create_server's) close a peer's oldest idle connections past `per_peer`: each new
    connection marks for closing those of the same address that have no request being served, oldest first, the
    way waitress's own idle cleanup does (`will_close`, acted on by its loop). Returns the server."""
    servers = [server] if hasattr(server, "channel_class") else [s for s in server.map.values()
                                                                  if hasattr(s, "channel_class")]
    for srv in servers:

        class PeerCapped(srv.channel_class):
            def __init__(self, owner, sock, addr, adj, map=None):
                super().__init__(owner, sock, addr, adj, map=map)
                peer = addr[0] if isinstance(addr, tuple) and addr else None  # a unix socket names no peer
                if peer is None:
                    return
                theirs = sorted((c for c in owner.active_channels.values() if c is not self and not c.will_close
                                 and not c.requests and isinstance(c.addr, tuple) and c.addr[:1] == (peer,)),
                                key=lambda c: c.creation_time)
                for old in theirs[:max(0, len(theirs) + 1 - per_peer)]:
                    old.will_close = True

        srv.channel_class = PeerCapped
    return server
