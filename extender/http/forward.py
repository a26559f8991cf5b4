"""A follower's bind goes to the Lease holder's pod, and nowhere else.

Why not the URL on the Lease: anyone who can write that Lease (or a bug that writes it) would choose
where kube-scheduler's binds go, over any scheme a URL opener speaks, through proxies and redirects.
Here the Lease only *names* the holder: `holderIdentity` must be a pod in the extender's own
namespace that runs under the extender's own ServiceAccount with the extender's labels, is not
being deleted, and is Ready; the bind goes to that pod's `status.podIP` on the verbs port every
replica listens on, over plain HTTP or HTTPS (verifying the holder's server certificate against
the CA, for the Service DNS name that certificate carries), with no proxy and no redirect. Anything
else is refused in words (kube-scheduler retries the bind) and nothing is sent.
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

FORWARDED_HEADER = "X-Tessera-Forwarded"  # a forwarded call is never forwarded again
FORWARDED_VERBS = ("bind", "filter")
MAX_ANSWER_BYTES = 1 << 20  # a bind answer is {"Error": "..."}: a holder cannot make a follower buffer more
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# labels every controller adds per revision: they differ between replicas of one Deployment mid-rollout
REVISION_LABELS = frozenset({"pod-template-hash", "controller-revision-hash", "statefulset.kubernetes.io/pod-name"})

PodReader = Callable[[str, str], "dict | None"]  # (namespace, name) -> the pod as JSON, None when absent


class Holder(Protocol):
    """What the forwarder asks the Lease elector (kube/lease.py)."""

    def holder(self) -> str: ...


class ForwardRefused(Exception):
    """The Lease's holder is not somewhere a bind may go; the message says why, in words."""


@dataclass(frozen=True, slots=True)
class Peers:
    """Who counts as another replica of this extender, and how to reach its verbs."""

    namespace: str
    service_account: str
    labels: Mapping[str, str]  # the holder pod must carry every one of these
    port: int  # the verbs port (every replica listens on the same one)
    prefix: str = "/tessera"
    context: ssl.SSLContext | None = None  # HTTPS with this context when set, else plain HTTP
    server_hostname: str = ""  # the name the holder's server certificate carries (the Service DNS name)
    self_name: str = ""  # this replica's pod name

    def __post_init__(self) -> None:
        if not self.namespace or not self.service_account or not self.labels:
            raise ValueError("bind forwarding needs the extender's namespace, ServiceAccount and labels")
        if not 0 < self.port < 65536:
            raise ValueError(f"bind forwarding: verbs port {self.port} out of range")
        if self.context is not None and not self.server_hostname:
            raise ValueError("bind forwarding over HTTPS needs the name the holder's server certificate carries")


def peer_identity(own_pod: dict) -> tuple[str, dict[str, str]]:
    """(ServiceAccount, labels) a holder must share with this replica, read from our own pod."""
    sa = ((own_pod.get("spec") or {}).get("serviceAccountName") or "").strip()
    labels = {k: v for k, v in ((own_pod.get("metadata") or {}).get("labels") or {}).items() if k not in REVISION_LABELS}
    if not sa or not labels:
        name = (own_pod.get("metadata") or {}).get("name")
        raise ValueError(f"this replica's pod {name!r} has no ServiceAccount or no labels: "
                         "other replicas could not be told apart from any pod")
    return sa, labels


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


class HolderForwarder:
    """Sends a follower's bind to the Lease holder's pod (see the module docstring for the checks)."""

    def __init__(self, lease: Holder, peers: Peers, read_pod: PodReader) -> None:
        self.lease, self.peers, self.read_pod = lease, peers, read_pod

    def target(self) -> str:
        """The holder pod's IP, or ForwardRefused saying why not."""
        p = self.peers
        holder = self.lease.holder()
        if not holder:
            raise ForwardRefused("no replica holds the bind lease yet")
        if holder == p.self_name:
            raise ForwardRefused("the lease names this replica, which does not bind yet or any more: just elected, it is "
                                 "still rebuilding its view of bound pods, or its term lapsed")
        if not _POD_NAME.match(holder):
            raise ForwardRefused(f"the lease holder {holder[:80]!r} is not a pod name")
        pod = self.read_pod(p.namespace, holder)
        if not isinstance(pod, dict):
            raise ForwardRefused(f"the lease holder {holder} is not a pod in {p.namespace}")
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("deletionTimestamp"):
            raise ForwardRefused(f"the lease holder {p.namespace}/{holder} is being deleted")
        if spec.get("serviceAccountName") != p.service_account:
            raise ForwardRefused(f"the lease holder {p.namespace}/{holder} does not run as ServiceAccount "
                                 f"{p.service_account}: not an extender replica")
        labels = meta.get("labels") or {}
        missing = sorted(k for k, v in p.labels.items() if labels.get(k) != v)
        if missing:
            raise ForwardRefused(f"the lease holder {p.namespace}/{holder} lacks the extender's labels "
                                 f"({', '.join(missing)}): not an extender replica")
        if not _ready(pod):
            raise ForwardRefused(f"the lease holder {p.namespace}/{holder} is not Ready")
        raw_ip = (pod.get("status") or {}).get("podIP") or ""
        try:
            return str(ipaddress.ip_address(raw_ip))
        except ValueError:
            raise ForwardRefused(f"the lease holder {p.namespace}/{holder} has no pod IP ({str(raw_ip)[:60]!r})") from None

    def forward(self, raw: bytes, timeout_s: float, verb: str = "bind") -> tuple[int, bytes]:
        """(status, body) to hand back to kube-scheduler: the holder's answer to `verb` (bind, or filter for a gang
        member: its gang is admitted by the replica that binds), or why there is none."""
        if verb not in FORWARDED_VERBS:
            raise ValueError(f"only {', '.join(FORWARDED_VERBS)} are forwarded, not {verb!r}")
        try:
            ip = self.target()
        except ForwardRefused as e:
            return 200, orjson.dumps({"Error": f"tessera: not forwarding the {verb}: {e}; kube-scheduler will retry"})
        except Exception as e:  # the API did not answer: say so, the scheduler retries
            return 200, orjson.dumps({"Error": f"tessera: cannot look up the lease holder to forward the {verb}: {e}"})
        p = self.peers
        where = f"{'https' if p.context else 'http'}://{ip}:{p.port}{p.prefix}/{verb}"
        try:
            sock = socket.create_connection((ip, p.port), timeout=timeout_s)
            if p.context is not None:
                try:
                    sock = p.context.wrap_socket(sock, server_hostname=p.server_hostname)
                except BaseException:
                    sock.close()
                    raise
            conn = http.client.HTTPConnection(ip, p.port, timeout=timeout_s)
            conn.sock = sock  # our socket: http.client neither resolves, proxies nor redirects
            # the socket timeout bounds each read, not the whole answer: a holder sending a byte every 0.8 s held a
            # serving thread 9.6 s on a 1-s timeout; at the deadline the socket is shut, and the read fails
            late = threading.Event()
            deadline = threading.Timer(timeout_s, _shut, args=(sock, late))
            deadline.start()
            try:
                conn.request("POST", f"{p.prefix}/{verb}", body=raw,
                             headers={"Content-Type": "application/json", FORWARDED_HEADER: "1"})
                resp = conn.getresponse()
                body = resp.read(MAX_ANSWER_BYTES + 1)
            finally:
                deadline.cancel()
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            return 200, orjson.dumps({"Error": f"tessera: cannot reach the leader at {where}: {e}"})
        if late.is_set():  # what came before the shut is a cut answer, not the holder's
            return 200, orjson.dumps({"Error": f"tessera: the leader at {where} did not answer within {timeout_s:g} s"})
        if len(body) > MAX_ANSWER_BYTES:
            return 200, orjson.dumps({"Error": f"tessera: the leader at {where} answered over {MAX_ANSWER_BYTES} bytes"})
        return resp.status, body


def _shut(sock: socket.socket, late: threading.Event) -> None:
    late.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def api_pod_reader(core) -> PodReader:
    """Reads one pod from the API (a kubernetes CoreV1Api); None when it does not exist."""
    from kubernetes.client.exceptions import ApiException

    def read(namespace: str, name: str) -> dict | None:
        try:
            return orjson.loads(core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=5).data)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    return read
