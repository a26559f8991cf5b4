"""The extender pulls node agents' reports (extender/kube/agents.py): whom it trusts, for which node,
what it believes, and what a hostile report can do (nothing but be recorded)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from extender.core.model import Assignment
from extender.kube import agents
from extender.kube.agents import AgentPod, AgentPuller, BadReport, fetch_report, judge, trusted_agent
from extender.translate.objects import AssignmentSigner, assignment_annotations, pod_info
from gpu_sharing.agent import Agent, make_server
from gpu_sharing.static import StaticBackend
from tessera_contract.report import decode_report

NS = "tessera-system"
KEY = AssignmentSigner(b"k" * 32)
UIDS = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(8)]
MEMORY = 81920


def agent_pod(name="tessera-agent-abc", node="node-a", ip="10.0.0.5", ns=NS, sa="tessera-agent", owner="tessera-agent",
              kind="DaemonSet", phase="Running", port=9400, **extra):
    meta = {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/name": "tessera-agent"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "u", "controller": True}]}
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, "spec": {"nodeName": node, "serviceAccountName": sa, "containers": [
        {"name": "agent", "ports": [{"name": "metrics", "containerPort": port}]}]},
        "status": {"phase": phase, "podIP": ip}, **extra}


def report(gpus=2, pods=None, unattributed=None, node="whatever", **over):
    pods, unattributed = pods or {}, unattributed or {}
    doc = {"version": 1, "node": node, "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA A100", "memory_mib": MEMORY, "healthy": True, "health_reason": "",
         "mig_mode": False, "nvlink_peers": [], "memory_used_mib": 0, "pods": pods.get(i, {}),
         "unattributed_mib": unattributed.get(i, 0)} for i in range(gpus)]}
    doc.update(over)
    return json.dumps(doc).encode()


def tenant(uid, node, gpus, milli=500, signer=KEY, tamper=False, phase="Running"):
    """A pod as the extender's watch parses it (pod_info, the MAC checked with the extender's key)."""
    a = Assignment(pod=f"ml/p-{uid[:8]}", node=node, gpus=tuple(gpus), milli=milli, cpu_milli=0, memory_mib=0)
    ann = assignment_annotations(a, (), signer, uid) if signer else assignment_annotations(a, (), KEY, uid)
    if signer is None:
        ann.pop("tessera.dev/assignment-mac")
    if tamper:
        ann["tessera.dev/assignment-mac"] = "0" * 64
    pod = {"metadata": {"name": f"p-{uid[:8]}", "namespace": "ml", "uid": uid, "annotations": ann},
           "spec": {"nodeName": node,
                    "containers": [{"name": "c", "resources": {"limits": {"tessera.dev/gpu-milli": str(milli)}}}]},
           "status": {"phase": phase}}
    return pod_info(pod, KEY)


class FakeCore:
    """The CoreV1Api calls the puller makes, recorded."""

    def __init__(self, pods, nodes=("node-a", "node-b")):
        self.pods, self.writes = pods, []
        self.nodes = {n: {"metadata": {"name": n, "annotations": {}, "labels": {}}, "status": {"capacity": {}}} for n in nodes}

    def list_namespaced_pod(self, namespace, **kw):
        # every pod, whatever the namespace asked: the puller's own checks must hold without the API's
        return SimpleNamespace(data=json.dumps({"items": self.pods}))

    def read_node(self, name, **kw):
        if name not in self.nodes:
            raise RuntimeError(f"404 node {name}")
        return SimpleNamespace(data=json.dumps(self.nodes[name]))

    def patch_node(self, name, body):
        self.writes.append((name, "node", body))
        meta = self.nodes[name]["metadata"]
        for k in ("annotations", "labels"):
            meta[k].update(body["metadata"].get(k, {}))

    def patch_node_status(self, name, body):
        self.writes.append((name, "status", body))
        self.nodes[name]["status"]["capacity"].update(body["status"]["capacity"])


def puller(core, bodies, known=None, may_write=lambda: True):
    """A puller whose fetch answers from `bodies` (pod name -> bytes, or an exception); records whom it asked."""
    asked = []

    def fetch(agent: AgentPod):
        asked.append(agent)
        got = bodies[agent.name]
        if isinstance(got, Exception):
            raise got
        return got

    p = AgentPuller(core, NS, (known or {}).get, may_write, fetch=fetch)
    return p, asked


def inventory(core, node):
    raw = core.nodes[node]["metadata"]["annotations"].get("tessera.dev/gpu-inventory")
    return json.loads(raw)["gpus"] if raw else None


# -- the agent itself ---------------------------------------------------------------------------


def test_the_agent_serves_its_report_and_makes_no_api_call(tmp_path):
    from tests.test_manifests import code_api_calls

    assert code_api_calls("gpu_sharing/cli.py") == set()  # nothing in the agent's code can reach the API
    inv = tmp_path / "gpus.json"
    inv.write_text(json.dumps({"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": 15360, "processes": [
        {"pid": 1, "used_mib": 1024, "pod_uid": UIDS[0]}, {"pid": 2, "used_mib": 512}]}]}))
    agent = Agent(StaticBackend(inv), "node-a")
    server = make_server(agent, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        pod = AgentPod("a", "node-a", "127.0.0.1", port)
        with pytest.raises(BadReport, match="503"):  # nothing sampled yet: no report rather than an empty one
            fetch_report(pod)
        agent.tick()
        gpus = decode_report(fetch_report(pod))
        assert gpus[0].pods == ((UIDS[0], 1024),) and gpus[0].unattributed_mib == 512
        assert b"tessera_gpu_pod_memory_used_bytes" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
    finally:
        server.shutdown()


# -- whom the extender trusts, for which node ---------------------------------------------------------


def test_a_report_is_applied_to_the_node_its_pod_runs_on_never_the_one_it_names():
    core = FakeCore([agent_pod("agent-a", node="node-a")])
    p, asked = puller(core, {"agent-a": report(node="node-b", unattributed={0: 4096})})
    assert p.pull_once() == {"node-a": "ok"}
    assert {name for name, *_ in core.writes} == {"node-a"} and inventory(core, "node-b") is None
    assert [g["oob_memory_mib"] for g in inventory(core, "node-a")] == [4096, 0]
    assert core.nodes["node-a"]["status"]["capacity"]["tessera.dev/gpu-milli"] == "2000"


@pytest.mark.parametrize("why, pod", [
    ("other namespace", agent_pod(ns="ml")),
    ("other ServiceAccount", agent_pod(sa="default")),
    ("not the DaemonSet's", agent_pod(owner="tessera-agent-2")),
    ("a ReplicaSet's", agent_pod(kind="ReplicaSet")),
    ("no controller", agent_pod(meta={"ownerReferences": []})),
    ("a mirror pod", agent_pod(meta={"annotations": {"kubernetes.io/config.mirror": "x"}})),
    ("pending", agent_pod(phase="Pending")),
    ("a hostname, not an IP", agent_pod(ip="metadata.google.internal")),
    ("not scheduled", agent_pod(node="")),
])
def test_a_pod_that_is_not_the_agent_daemonsets_is_never_asked(why, pod):
    core = FakeCore([pod])
    p, asked = puller(core, {pod["metadata"]["name"]: report(unattributed={0: 4096})})
    assert p.pull_once() == {} and asked == [] and core.writes == [], why
    assert p.results["untrusted"] == 1 and any(k.startswith("pod/") for k in p.problems)
    with pytest.raises(BadReport):
        trusted_agent(pod, NS)


def test_two_nodes_each_get_their_own_report():
    core = FakeCore([agent_pod("agent-a", node="node-a", ip="10.0.0.1"), agent_pod("agent-b", node="node-b", ip="10.0.0.2")])
    p, asked = puller(core, {"agent-a": report(gpus=1), "agent-b": report(gpus=2, unattributed={1: 1000})})
    assert p.pull_once() == {"node-a": "ok", "node-b": "ok"}
    assert len(inventory(core, "node-a")) == 1 and [g["oob_memory_mib"] for g in inventory(core, "node-b")] == [0, 1024]


def test_nothing_is_pulled_or_written_by_a_follower_or_before_the_cache_synced():
    core = FakeCore([agent_pod()])
    p, asked = puller(core, {"tessera-agent-abc": report()}, may_write=lambda: False)
    assert p.pull_once() == {} and asked == [] and core.writes == []


def test_the_node_is_written_only_when_the_report_changes():
    core = FakeCore([agent_pod()])
    bodies = {"tessera-agent-abc": report(unattributed={0: 100})}
    p, _ = puller(core, bodies)
    p.pull_once()
    first = len(core.writes)
    assert first == 2  # annotation and label in one patch, capacity in the status
    p.pull_once()
    bodies["tessera-agent-abc"] = report(unattributed={0: 200})  # within the same 256 MiB step: nothing new to say
    p.pull_once()
    assert len(core.writes) == first
    bodies["tessera-agent-abc"] = report(unattributed={0: 300})
    p.pull_once()
    assert len(core.writes) == first + 1 and inventory(core, "node-a")[0]["oob_memory_mib"] == 512


# -- what is out-of-band: the extender's judgement, with its key ---------------------------------------


def test_memory_of_a_validly_signed_pod_is_in_band_and_of_unsigned_or_forged_pods_out_of_band():
    known = {
        UIDS[0]: tenant(UIDS[0], "node-a", [0]),                 # Tessera placed it here, on GPU 0
        UIDS[1]: tenant(UIDS[1], "node-a", [0], signer=None),    # wrote its own assignment, no MAC
        UIDS[2]: tenant(UIDS[2], "node-a", [0], tamper=True),    # a MAC that does not match
        UIDS[3]: tenant(UIDS[3], "node-a", [1]),                 # valid, but for GPU 1
        UIDS[4]: tenant(UIDS[4], "node-b", [0]),                 # valid, but on another node
        UIDS[5]: tenant(UIDS[5], "node-a", [0], phase="Succeeded"),  # finished: its assignment is over
    }
    assert not known[UIDS[0]].forged and known[UIDS[1]].forged and known[UIDS[2]].forged
    pods = {0: {UIDS[0]: 1000, UIDS[1]: 2000, UIDS[2]: 4000, UIDS[3]: 8000, UIDS[4]: 16000, UIDS[5]: 32000,
                UIDS[6]: 64},  # a pod the extender never saw
            1: {UIDS[3]: 500}}
    gpus = decode_report(report(pods=pods, unattributed={0: 100}))
    verdicts = judge("node-a", gpus, known.get)
    assert [v.oob_memory_mib for v in verdicts] == [2000 + 4000 + 8000 + 16000 + 32000 + 64 + 100, 0]
    # and through the puller, onto the Node, as the extender's contract reads it
    core = FakeCore([agent_pod()])
    p, _ = puller(core, {"tessera-agent-abc": report(pods=pods, unattributed={0: 100})}, known)
    p.pull_once()
    assert inventory(core, "node-a")[0]["oob_memory_mib"] == 62208  # 62164 MiB, up to the next 256 MiB step


def test_on_main_the_agent_counted_an_unsigned_assignment_as_in_band():
    """The agent used to believe any pod's assignment annotation; the extender checks the MAC."""
    unsigned = tenant(UIDS[1], "node-a", [0], signer=None)
    gpus = decode_report(report(pods={0: {UIDS[1]: 40000}}))
    assert judge("node-a", gpus, {UIDS[1]: unsigned}.get)[0].oob_memory_mib == 40000


# -- hostile reports: bounded, recorded, skipped -----------------------------------------------------


@pytest.mark.parametrize("body, result, words", [
    (b"\xff\xfe garbage", "invalid", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid", "not JSON"),
    (b"{}", "invalid", "no gpus"),
    (report(gpus=65), "invalid", "more than 64 GPUs"),
    (report(pods={0: {"not-a-uid": 1}}), "invalid", "not a pod UID"),
    (report(pods={0: {UIDS[0]: -5}}), "invalid", "pod memory"),
    (report(pods={0: {UIDS[0]: 1.5}}), "invalid", "pod memory"),
    (report(pods={0: {UIDS[0]: 10**30}}), "invalid", "pod memory"),
    (report(pods={0: {UIDS[0]: True}}), "invalid", "pod memory"),
    (report(unattributed={0: "7"}), "invalid", "unattributed"),
    (json.dumps({"gpus": [{"index": 1, "uuid": "u", "model": "m", "memory_mib": 1}]}).encode(), "invalid", "0..n-1"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u" * 300, "model": "m", "memory_mib": 1}]}).encode(), "invalid", "uuid"),
    # a lying node's words reach Events on other tenants' pods and admins' terminals: printable only
    (json.dumps({"gpus": [{"index": 0, "uuid": "GPU-\x1b]0;owned\x07", "model": "m", "memory_mib": 1}]}).encode(),
     "invalid", "uuid must be printable"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 1, "healthy": False,
                           "health_reason": "ok\nFAKE: all healthy"}]}).encode(), "invalid", "health_reason must be printable"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 1, "healthy": "false"}]}).encode(),
     "invalid", "healthy"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 0}]}).encode(), "invalid", "positive"),
    # over the inventory annotation's own bound: it was published, then refused by the extender's watch
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 2**24 + 1}]}).encode(), "invalid", "memory_mib"),
    (b" " * (agents.MAX_REPORT_BYTES + 1), "too_large", "longer than"),
])
def test_a_bad_report_is_recorded_and_changes_nothing(body, result, words):
    with pytest.raises(BadReport, match=words) as e:
        decode_report(body)
    assert e.value.result == result
    core = FakeCore([agent_pod()])
    p, _ = puller(core, {"tessera-agent-abc": body})
    assert p.pull_once() == {"node-a": result}
    assert core.writes == [] and p.results[result] == 1 and words.split()[0] in p.problems["node/node-a"]


def test_one_bad_agent_does_not_stop_the_others():
    core = FakeCore([agent_pod("agent-a", node="node-a"), agent_pod("agent-b", node="node-b")])
    p, _ = puller(core, {"agent-a": BadReport("unreachable", "connection refused"), "agent-b": report(unattributed={0: 256})})
    assert p.pull_once() == {"node-a": "unreachable", "node-b": "ok"}
    assert inventory(core, "node-b")[0]["oob_memory_mib"] == 256 and inventory(core, "node-a") is None


class Hostile(BaseHTTPRequestHandler):
    mode = "big"

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        if self.mode == "declared":
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            return
        self.end_headers()
        if self.mode == "big":  # no length, just more and more
            chunk = b"x" * 65536
            try:
                for _ in range(10_000):
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif self.mode == "drip":
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("mode, result", [("big", "too_large"), ("declared", "too_large"), ("drip", "unreachable")])
def test_fetching_is_bounded_in_bytes_and_time(mode, result):
    handler = type("H", (Hostile,), {"mode": mode, "protocol_version": "HTTP/1.0"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(BadReport) as e:
            fetch_report(AgentPod("a", "n", "127.0.0.1", server.server_address[1]), timeout_s=1.0)
        assert e.value.result == result and time.monotonic() - t0 < 3.0
    finally:
        server.shutdown()


def test_nobody_listening_is_unreachable_quickly():
    with pytest.raises(BadReport) as e:
        fetch_report(AgentPod("a", "n", "127.0.0.1", 1), timeout_s=1.0)
    assert e.value.result == "unreachable"


def test_only_the_synced_lease_holder_pulls_and_a_new_term_compares_with_the_node_afresh():
    ext = SimpleNamespace(synced=False, pods={})
    elector = SimpleNamespace(leader=True)
    elector.is_leader = lambda: elector.leader
    stop = threading.Event()
    stop.set()  # no thread rounds: the test drives them
    p = agents.start_agent_puller(FakeCore([]), ext, NS, elector, stop, 30.0)
    assert not p.may_write()  # not synced: every pod would look unknown, all memory out-of-band
    ext.synced = True
    assert p.may_write()
    elector.leader = False
    assert not p.may_write()
    assert agents.start_agent_puller(FakeCore([]), ext, NS, None, stop, 0) is None  # --agent-interval 0: off
    core = FakeCore([agent_pod()])
    bodies = {"tessera-agent-abc": report(unattributed={0: 1024})}
    p, _ = puller(core, bodies, may_write=lambda: elector.leader)
    elector.leader = True
    p.pull_once()
    writes = len(core.writes)
    elector.leader = False
    assert p.pull_once() == {} and p.verdicts == {}
    core.nodes["node-a"]["metadata"]["annotations"]["tessera.dev/gpu-inventory"] = "{}"  # another holder wrote meanwhile
    elector.leader = True
    p.pull_once()
    assert len(core.writes) == writes + 1 and inventory(core, "node-a")[0]["oob_memory_mib"] == 1024


def test_slow_clients_hold_the_agents_port_for_one_deadline_at_most(tmp_path, monkeypatch):
    """Connections that sent a byte every 9 s held a thread each for good (the per-read timeout never fired), so a
    pod could keep the extender's pull from ever being served. Past MAX_CONNECTIONS at once a new connection is
    closed unread, and each exchange has one deadline."""
    import socket

    from gpu_sharing import agent as agent_module

    inv = tmp_path / "gpus.json"
    inv.write_text(json.dumps({"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": 15360}]}))
    agent = Agent(StaticBackend(inv), "node-a")
    agent.tick()
    server = make_server(agent, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def dribble() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"G")  # and never the rest
        return s

    try:
        monkeypatch.setattr(agent_module, "REQUEST_DEADLINE_S", 60.0)
        slow = [dribble() for _ in range(agent_module.MAX_CONNECTIONS)]
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        extra.sendall(b"GET /report HTTP/1.0\r\n\r\n")
        assert extra.recv(100) == b"", "over the cap: closed unread"
        for s in [extra, *slow]:
            s.close()
        monkeypatch.setattr(agent_module, "REQUEST_DEADLINE_S", 0.5)
        assert wait_for_report(port).device.uuid == "GPU-0", "slots come back as connections end"
        one = dribble()
        assert one.recv(100) == b"", "cut at its deadline, not held for the client's 10 s"
        one.close()
    finally:
        server.shutdown()


def wait_for_report(port: int):
    for _ in range(100):
        try:
            return decode_report(fetch_report(AgentPod("a", "node-a", "127.0.0.1", port)))[0]
        except BadReport:
            threading.Event().wait(0.1)
    raise AssertionError("the agent never served its report again")
