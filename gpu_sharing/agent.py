"""`tessera agent`: the DaemonSet that measures the node's GPUs and serves what it saw.

Every interval: ask the backend (NVML, or a static file) for the GPUs and their processes, add
up the memory per pod UID (cgroups) and of processes in no pod, and keep the result as the
report served at GET /report beside /metrics on the same port.

The agent makes no Kubernetes API call and mounts no token. The extender's Lease holder pulls
the report from the agent pod the scheduler placed on each node and writes that node's Node
(extender/kube/agents.py). Why pull, not push: RBAC cannot limit a DaemonSet's one
ServiceAccount to "its own Node" (resourceNames are static; NodeRestriction covers only kubelet
identities; node-bound token claims with ValidatingAdmissionPolicy need Kubernetes 1.30+), so a
node agent allowed to patch Nodes could patch every Node. A pod's spec.nodeName, in contrast,
is set by the scheduler and immutable: attributing a report to the node its pod runs on works on
every Kubernetes version Tessera supports, and a compromised node can speak only for itself.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessera_contract.report import REPORT_PATH

from .devices import GpuBackend
from .metrics import AgentCollector, registry_for
from .usage import GpuReport, gpu_reports, report_document

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tick:
    reports: tuple[GpuReport, ...]
    document: bytes


class Agent:
    def __init__(self, backend: GpuBackend, node_name: str, collector: AgentCollector | None = None) -> None:
        self.backend, self.node_name = backend, node_name
        self.collector = collector or AgentCollector(node_name)
        self._warned: set[str] = set()  # UUIDs already reported unhealthy
        self._lock = threading.Lock()
        self._document = b""  # the last good report; b"" until the first tick succeeded

    def report(self) -> bytes:
        with self._lock:
            return self._document

    def tick(self) -> Tick:
        devices, samples = self.backend.inventory(), self.backend.sample()
        reports = gpu_reports(devices, samples)
        document = report_document(self.node_name, reports)
        with self._lock:
            self._document = document
        self.collector.update(reports)
        for r in reports:
            d = r.device
            if not d.healthy and d.uuid not in self._warned:
                self._warned.add(d.uuid)
                log.warning("GPU %d (%s) unhealthy: %s; the extender withdraws it from placement", d.index, d.uuid,
                            d.health_reason or "reported by the backend")
        return Tick(reports, document)

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Tick until `stop`; a failed tick (backend hiccup) is logged and retried next interval.
        The last good report stays served meanwhile; /metrics flags it stale."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception as e:
                log.warning("tick failed (%s); retrying in %.0f s", e, interval_s)
                self.collector.failed()
            stop.wait(interval_s)


# Who reads :9400 is the extender (one pull per interval) and a scraper or two; a pod on the node where NetworkPolicy
# is not enforced opened connections and sent a byte every 9 s, each holding a thread for good (the per-read timeout
# never fired). Now each connection has one deadline for the whole exchange, and past MAX_CONNECTIONS at once a new
# one is closed unread.
MAX_CONNECTIONS = 16
REQUEST_DEADLINE_S = 5.0


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed unread, no thread
            return
        try:
            threading.Thread(target=self._serve_one, args=(request, client_address), daemon=True).start()
        except RuntimeError:  # no thread to be had: the slot and the connection go back at once
            self.slots.release()
            self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client cut at its deadline or gone mid-answer: one debug line, not a traceback per connection."""
        log.debug("request from %s ended early: %s", client_address[0], sys.exc_info()[1])

    def _serve_one(self, request, client_address) -> None:
        cutoff = threading.Timer(REQUEST_DEADLINE_S, _cut, (request,))
        cutoff.daemon = True
        cutoff.start()
        try:
            self.process_request_thread(request, client_address)  # handles the request, then closes it
        finally:
            cutoff.cancel()
            self.slots.release()


def _cut(request: socket.socket) -> None:
    try:
        request.shutdown(socket.SHUT_RDWR)  # the handler's read or write ends at once
    except OSError:
        pass


def make_server(agent: Agent, host: str, port: int) -> ThreadingHTTPServer:
    """GET /report (JSON) and GET /metrics (Prometheus) on one port; nothing else, no request body read."""
    registry = registry_for(agent.collector)

    class Handler(BaseHTTPRequestHandler):
        server_version = "tessera-agent"
        sys_version = ""
        timeout = 10  # a client that stops mid-request frees its thread

        def do_GET(self):  # noqa: N802 (BaseHTTPRequestHandler's name)
            path = self.path.split("?", 1)[0]
            if path == REPORT_PATH:
                body, ctype = agent.report(), "application/json"
                if not body:
                    return self._send(503, b"no sample yet\n", "text/plain")
            elif path == "/metrics":
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            else:
                return self._send(404, b"not found\n", "text/plain")
            self._send(200, body, ctype)

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # one line per scrape would drown the agent's own log
            pass

    return BoundedServer((host, port), Handler)
