"""The extender pulls each node's GPU report from the agent pod on that node and writes the Node.

Why the extender writes and the agent does not: RBAC cannot limit a DaemonSet's one
ServiceAccount to "its own Node" (resourceNames are static; NodeRestriction covers only kubelet
identities; node-bound token claims with ValidatingAdmissionPolicy need Kubernetes 1.30+, and
Tessera supports 1.20 on). Here the agent has no API rights at all; the extender, which binds
any pod anyway, gets nodes patch + nodes/status patch, and trusts a report only as far as this:

  * Which pods speak: in the extender's own namespace, controlled by the `tessera-agent`
    DaemonSet, running as the `tessera-agent` ServiceAccount, not a mirror pod, Running, with a
    pod IP. Labels are not trusted (anyone who edits the pod sets them).
  * For which node: the pod's spec.nodeName, set by the scheduler and immutable. The name a
    report gives is ignored, so a compromised node (its kubelet, or its agent) speaks for itself
    only. Its kubelet may write its agent pod's podIP: at worst the extender fetches another
    address and attributes that answer to the same, compromised, node.
  * What it may say: parsed per report, within fixed bounds (size, time, counts, lengths); a bad
    report is recorded (`tessera_agent_reports_total{result}`, `problems`) and changes nothing.
  * What is out-of-band: the agent reports GPU memory per pod UID. Memory of a pod counts as
    in-band only when the extender's own view of that pod (its watch; the assignment's MAC
    checked with the key only the extender holds) places it on this node and this GPU. Every
    other MiB (unsigned or forged assignments, other GPUs, host processes) is out-of-band, and
    its share is withheld from placement (GpuInfo.reserved_milli, tessera_contract/annotations.py).

Only the Lease holder (or a replica not electing) pulls and writes, and only once its cache is
synced: before that every pod would look unknown, and all memory out-of-band.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tessera_contract import TERMINAL_PHASES
from tessera_contract.report import MAX_MIB, MAX_REPORT_BYTES, MAX_TEXT, REPORT_PATH, BadReport, GpuUse, decode_report

from ..state import PodInfo
from .node_writer import GpuVerdict, NodePublisher

log = logging.getLogger(__name__)

AGENT_NAME = "tessera-agent"  # the DaemonSet and its ServiceAccount
PORT_NAME = "metrics"  # the agent container's port serving /report (and /metrics)
DEFAULT_PORT = 9400
FETCH_TIMEOUT_S = 3.0  # whole request, connect to last byte: a slow drip is cut off too
PULL_WORKERS = 64  # unreachable agents cost FETCH_TIMEOUT_S each: 5000 of them delay one round by ~4 min, not ~16
RESULTS = ("ok", "untrusted", "unreachable", "bad_status", "too_large", "invalid", "write_failed")  # the metric's fixed label set


@dataclass(frozen=True, slots=True)
class AgentPod:
    name: str
    node: str  # spec.nodeName: the only node this pod's report is ever applied to
    ip: str
    port: int
    created: str = ""


def trusted_agent(pod: dict, namespace: str) -> AgentPod:
    """The agent pod as far as it is trusted; BadReport('untrusted', why) when it is not one."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name = str(meta.get("name", ""))[:MAX_TEXT]

    def no(why: str) -> BadReport:
        return BadReport("untrusted", f"pod {namespace}/{name}: {why}")

    if meta.get("namespace") != namespace:
        raise no(f"not in the extender's namespace {namespace}")
    if spec.get("serviceAccountName") != AGENT_NAME:
        raise no(f"does not run as ServiceAccount {AGENT_NAME}")
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("controller") is True]
    if not any(o.get("kind") == "DaemonSet" and o.get("name") == AGENT_NAME and str(o.get("apiVersion", "")).startswith("apps/")
               for o in owners):
        raise no(f"not controlled by DaemonSet {AGENT_NAME}")
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        raise no("a mirror pod (its node's kubelet wrote it)")
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        raise no("not scheduled")
    if status.get("phase") != "Running":
        raise no(f"not Running ({status.get('phase')!r})")
    try:
        ip = str(ipaddress.ip_address(str(status.get("podIP", ""))))
    except ValueError:
        raise no(f"no usable pod IP ({str(status.get('podIP'))[:64]!r})") from None
    port = DEFAULT_PORT
    for c in spec.get("containers") or []:
        for p in (c or {}).get("ports") or []:
            if (p or {}).get("name") == PORT_NAME and isinstance(p.get("containerPort"), int) and 0 < p["containerPort"] < 65536:
                port = p["containerPort"]
    return AgentPod(name, node, ip, port, str(meta.get("creationTimestamp", "")))


def agents_by_node(pods: list[dict], namespace: str, problems: dict[str, str] | None = None) -> dict[str, AgentPod]:
    """One trusted agent pod per node (the newest, during a rolling update); the rest recorded and skipped."""
    out: dict[str, AgentPod] = {}
    for pod in pods:
        try:
            a = trusted_agent(pod, namespace)
        except BadReport as e:
            if problems is not None:
                problems[str((pod.get("metadata") or {}).get("name") or "?")[:MAX_TEXT]] = str(e)
            continue
        if a.node not in out or (a.created, a.name) > (out[a.node].created, out[a.node].name):
            out[a.node] = a
    return out


def fetch_report(agent: AgentPod, timeout_s: float = FETCH_TIMEOUT_S, limit: int = MAX_REPORT_BYTES) -> bytes:
    """GET the report: plain HTTP to the pod IP, no proxy, no redirect, at most `limit` bytes in `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    conn = http.client.HTTPConnection(agent.ip, agent.port, timeout=timeout_s)
    try:
        try:
            conn.request("GET", REPORT_PATH, headers={"Accept": "application/json"})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            raise BadReport("unreachable", f"{agent.ip}:{agent.port}: {e}") from None
        if resp.status != 200:
            raise BadReport("bad_status", f"{agent.ip}:{agent.port} answered {resp.status}")
        declared = resp.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise BadReport("too_large", f"report of {declared} bytes, more than {limit}")
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BadReport("unreachable", f"{agent.ip}:{agent.port}: report not sent within {timeout_s} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            try:
                chunk = resp.read1(65536)
            except (OSError, http.client.HTTPException) as e:
                raise BadReport("unreachable", f"{agent.ip}:{agent.port}: {e}") from None
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise BadReport("too_large", f"report longer than {limit} bytes")
            chunks.append(chunk)
    finally:
        conn.close()


def in_band(info: PodInfo | None, node: str, gpu: int) -> bool:
    """Does this pod's memory on `node`'s GPU `gpu` belong to a Tessera assignment?

    `info` is the extender's own view: with a key, `assignment` is None unless its MAC is valid
    (a pod without a key believes annotations everywhere, so it does here too: else the same
    share would be withheld twice, once as the assignment and once as out-of-band memory).
    """
    if info is None or info.forged or info.assignment is None or info.phase in TERMINAL_PHASES:
        return False
    a = info.assignment
    return info.node == node and a.node == node and gpu in a.gpus and a.milli > 0


def judge(node: str, gpus: tuple[GpuUse, ...], pod_of: Callable[[str], PodInfo | None]) -> tuple[GpuVerdict, ...]:
    """Each GPU with its out-of-band memory: whatever no valid assignment on that GPU explains."""
    out = []
    for g in gpus:
        oob = g.unattributed_mib + sum(mib for uid, mib in g.pods if not in_band(pod_of(uid), node, g.device.index))
        out.append(GpuVerdict(g.device, min(oob, MAX_MIB)))
    return tuple(out)


class AgentPuller:
    """Every `interval_s`: list the agent pods, pull each trusted one's report, judge, write its Node on change."""

    def __init__(self, core, namespace: str, pod_of: Callable[[str], PodInfo | None], may_write: Callable[[], bool],
                 interval_s: float = 10.0, fetch: Callable[[AgentPod], bytes] = fetch_report) -> None:
        self.core, self.namespace, self.pod_of, self.may_write = core, namespace, pod_of, may_write
        self.interval_s, self.fetch = interval_s, fetch
        self._publishers: dict[str, NodePublisher] = {}
        self._lock = threading.Lock()
        self.results = dict.fromkeys(RESULTS, 0)  # reports by outcome since start
        self.problems: dict[str, str] = {}  # "node/NAME" or "pod/NAME" -> why its last report was not used
        self.verdicts: dict[str, tuple[GpuVerdict, ...]] = {}  # node -> what was last published

    def _agent_pods(self) -> list[dict]:
        # the label only narrows the list; trust comes from trusted_agent's checks alone
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=f"app.kubernetes.io/name={AGENT_NAME}",
                                             resource_version="0", _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def _one(self, agent: AgentPod) -> str:
        try:
            gpus = decode_report(self.fetch(agent))
            verdicts = judge(agent.node, gpus, self.pod_of)
        except BadReport as e:
            self._record(f"node/{agent.node}", e.result, f"agent pod {agent.name}: {e}")
            return e.result
        if not self.may_write():  # the Lease moved during this round: the new holder writes
            return "not_leader"
        try:
            publisher = self._publishers.setdefault(agent.node, NodePublisher(self.core, agent.node))
            publisher.publish(verdicts)
        except Exception as e:  # the API refused or is away: try again next round
            self._record(f"node/{agent.node}", "write_failed", f"node {agent.node}: {str(e)[:200]}")
            return "write_failed"
        self._record(f"node/{agent.node}", "ok", "")
        with self._lock:
            self.verdicts[agent.node] = verdicts
        return "ok"

    def _record(self, key: str, result: str, why: str) -> None:
        with self._lock:
            self.results[result] += 1
            if why:
                if self.problems.get(key) != why:
                    log.warning("agent report not used: %s", why)
                self.problems[key] = why
            else:
                self.problems.pop(key, None)

    def pull_once(self) -> dict[str, str]:
        """One round; node -> outcome. Nothing is pulled or written unless `may_write()`."""
        if not self.may_write():
            # a follower publishes nothing, its metrics do not repeat a past term's verdicts, and when it
            # holds the Lease again it compares with the Node afresh (another holder wrote meanwhile)
            with self._lock:
                self.verdicts.clear()
                self._publishers.clear()
            return {}
        untrusted: dict[str, str] = {}
        agents = agents_by_node(self._agent_pods(), self.namespace, untrusted)
        with self._lock:
            for key in [k for k in self.problems if k.startswith("pod/") and k[4:] not in untrusted]:
                del self.problems[key]
            for pod, why in untrusted.items():
                if self.problems.get(f"pod/{pod}") != why:
                    log.warning("agent pod ignored: %s", why)
                self.problems[f"pod/{pod}"] = why
                self.results["untrusted"] += 1
        with ThreadPoolExecutor(max_workers=max(1, min(PULL_WORKERS, len(agents))), thread_name_prefix="agent-pull") as pool:
            outcomes = dict(zip(agents, pool.map(self._one, agents.values()), strict=True))
        with self._lock:  # nodes whose agent went away: forget them (their Node keeps what was last written)
            for gone in set(self._publishers) - set(agents):
                self._publishers.pop(gone, None)
                self.verdicts.pop(gone, None)
                self.problems.pop(f"node/{gone}", None)
        return outcomes

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.pull_once()
            except Exception as e:  # listing the agent pods failed: the next round retries
                log.warning("pulling agent reports: %s", str(e)[:200])

    def collect(self):
        """Prometheus: reports by outcome, and the out-of-band memory last published per GPU."""
        with self._lock:
            results, verdicts = dict(self.results), dict(self.verdicts)
        c = CounterMetricFamily("tessera_agent_reports", "Agent reports pulled, by outcome", labels=["result"])
        for r in RESULTS:
            c.add_metric([r], results[r])
        yield c
        g = GaugeMetricFamily("tessera_gpu_out_of_band_memory_bytes",
                              "GPU memory held outside any valid Tessera assignment, as the extender judged it",
                              labels=["node", "gpu", "uuid"])
        for node, vs in sorted(verdicts.items()):
            for v in vs:
                g.add_metric([node, str(v.device.index), v.device.uuid], v.oob_memory_mib * 1024 * 1024)
        yield g


def start_agent_puller(core, extender, namespace: str, elector, stop: threading.Event, interval_s: float) -> AgentPuller | None:
    """The puller thread `tessera serve` starts (interval 0: none). Writes only while this replica may bind."""
    if interval_s <= 0:
        return None

    def may_write() -> bool:
        return extender.synced and (elector is None or elector.is_leader())

    puller = AgentPuller(core, namespace, extender.pods.get, may_write, interval_s)  # a dict read: atomic, no lock
    threading.Thread(target=puller.run, args=(stop,), daemon=True, name="agent-pull").start()
    return puller
