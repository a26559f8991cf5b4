"""Hostile pods and nodes through the real watch against the real API server: the extender stays synced.

Starts etcd + kube-apiserver + kube-scheduler 1.20.2 and `tessera serve` (testing/local_cluster.py),
then sends N generated hostile object states (pods with hostile annotations, some bound at
creation; nodes with hostile inventories, labels and capacities; hostile updates of them and of
legitimate pods and nodes; deletions) interleaved with legitimate pods whose GPU accounting is
known, from a pool of 4 threads. Then checks through /inspect, /metrics and /readyz: synced and
ready, every legitimate pod counted on exactly its GPUs, deleted ones released, no GPU over 1000
milli, and prints the figures. With --outage it also kills the apiserver for STALL_S + 10 s and
shows /readyz turning 503 with a reason and back to 200 once the watch resumes.

    python bench/watch_fuzz.py [--objects 10000] [--seed 1] [--threads 4] [--outage]

tests/e2e/test_watch_hostile_e2e.py runs `run()` with a few hundred objects on the shared e2e cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from extender.cli.args import number_arg
from extender.core.model import Assignment
from extender.translate.objects import (
    ASSIGNMENT_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    INVENTORY_ANNOTATION,
    MAC_ANNOTATION,
    MEMORY_LABEL,
    MODEL_LABEL,
    AssignmentSigner,
    assignment_annotations,
)

GPUS_PER_NODE = 8
TAINT = {"key": "tessera.dev/watch-fuzz", "value": "only", "effect": "NoSchedule"}  # keep other tests' pods off
NOBODY = "watch-fuzz-nobody"  # a schedulerName no scheduler serves: hostile pending pods stay pending, untouched
DEEP = "[" * 5000 + "]" * 5000

# Values a tenant or a compromised node may write; some the apiserver refuses (counted), the rest reach the watch.
HOSTILE_TEXT = ["é" * 64, "\u0660" * 64, "\U0001f600" * 20, "\ufeff", "1e400", "-1", "NaN", "Infinity", str(2**80),
                "9" * 5000, "", " ", "²", "\x00", DEEP, '{"a":' * 3000 + "1" + "}" * 3000, "null", "[]", "{}", "true"]
BAD_ASSIGNMENTS = ['{"node":"%s","gpus":[1e400],"milli":5}', '{"node":"%s","gpus":[0,0],"milli":1000}',
                   '{"node":"%s","gpus":"01","milli":5}', '{"node":"%s","gpus":[-1],"milli":5}',
                   '{"node":"%s","gpus":[1180591620717411303424],"milli":5}', '{"node":"%s","gpus":[0],"milli":1e400}',
                   '{"node":["%s"],"gpus":[0],"milli":5}', '{"node":"%s","gpus":[0],"milli":"NaN"}', "{%s", DEEP]
BAD_INVENTORIES = ['{"gpus":[{"index":0,"memory_mib":1e400}]}', '{"gpus":[{"index":0},{"index":0}]}',
                   '{"gpus":[{"index":0,"healthy":"false"}]}', '{"gpus":[{"index":0,"oob_memory_mib":-1}]}',
                   json.dumps({"gpus": [{"index": i} for i in range(1000)]}), '{"gpus":[{"index":1e400}]}',
                   '{"gpus":[{"index":0,"uuid":"' + "u" * 5000 + '"}]}', '{"gpus":{"index":0}}', DEEP, "not json",
                   '{"gpus":[{"index":0,"memory_mib":' + "9" * 5000 + "}]}", '{"gpus":[{"index":true}]}']
GOOD_INVENTORIES = ['{"gpus":[{"index":0,"uuid":"GPU-h0","memory_mib":16000},{"index":1,"memory_mib":16000,"healthy":false}]}',
                    '{"gpus":[]}']
BAD_CAPACITIES = ["9223372036854775807", "1e400", "-1", "NaN", "1Ei", "9" * 40, "0.5", "1e18"]


@dataclass
class Figures:
    sent: int = 0
    accepted: int = 0
    refused: Counter = field(default_factory=Counter)  # HTTP status -> how many the apiserver refused
    errors: Counter = field(default_factory=Counter)
    deletes: int = 0
    legit_pods: int = 0
    legit_deleted: int = 0
    readyz: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    problems: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, status: int, what: str = "") -> None:
        with self.lock:
            self.sent += 1
            if status < 300:
                self.accepted += 1
            elif status < 500:
                self.refused[status] += 1
            else:
                self.errors[f"{status} {what}"] += 1


def _status(fn) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
        return 200
    except ApiException as e:
        return e.status or 599
    except Exception as e:  # urllib3 errors: a body the client could not send
        return 600 + (hash(type(e).__name__) % 10)


class Fuzzer:
    def __init__(self, api, extender, seed: int, namespace: str, prefix: str) -> None:
        self.api, self.extender, self.rng = api, extender, random.Random(seed)
        self.ns, self.prefix = namespace, prefix
        self.signer = AssignmentSigner(Path(extender.key_file).read_bytes().strip())
        self.figures = Figures()
        self.legit_nodes = [f"{prefix}gpu-{i}" for i in range(16)]
        self.free = {n: [1000] * GPUS_PER_NODE for n in self.legit_nodes}
        self.expected: dict[str, tuple[str, tuple[int, ...], int]] = {}  # legit pod -> (node, gpus, milli)
        self.legit_lock = threading.Lock()
        self.hostile_pods: list[str] = []
        self.hostile_nodes: list[str] = []
        self.n = 0

    # -- bodies ----------------------------------------------------------------------------------

    def text(self) -> str:
        r = self.rng
        pick = r.random()
        if pick < 0.5:
            return r.choice(HOSTILE_TEXT)
        if pick < 0.8:
            return "".join(chr(r.choice([r.randint(32, 0xD7FF), r.randint(0xE000, 0x10FFFF)])) for _ in range(r.randint(1, 80)))
        return "x" * r.choice([300, 70_000, 300_000])  # the last is over the apiserver's 256 KiB annotation limit

    def annotations(self, node: str = "n") -> dict:
        r = self.rng
        ann = {}
        if r.random() < 0.6:
            ann[ASSIGNMENT_ANNOTATION] = r.choice(BAD_ASSIGNMENTS).replace("%s", node) if r.random() < 0.7 else self.text()
        if r.random() < 0.5:
            ann[MAC_ANNOTATION] = r.choice(["é" * 64, "\u0660" * 64, "0" * 64, self.text()])
        if r.random() < 0.3:
            ann[GANG_NAME_ANNOTATION] = self.text()
            ann[GANG_SIZE_ANNOTATION] = r.choice(["1e400", "-1", "NaN", str(2**80), "٣", "0", "99999999", self.text()])
        if r.random() < 0.3:
            ann[INVENTORY_ANNOTATION] = r.choice(BAD_INVENTORIES)
        if r.random() < 0.2:
            ann[self.text()[:60] or "k"] = self.text()  # a hostile key: mostly refused by the apiserver
        return ann

    def labels(self) -> dict:
        r = self.rng
        out = {}
        if r.random() < 0.3:
            out[MODEL_LABEL] = r.choice(["T4", "A100", self.text()[:80]])
        if r.random() < 0.3:
            out[MEMORY_LABEL] = r.choice(["²", "16000", "9" * 70, "-1", "1e400"])
        return out

    def quantity(self) -> str:
        return self.rng.choice(["1", "2", "1e400", "-1", "NaN", "0.5", "9" * 40, "1Ei", "100m", "9223372036854775807"])

    def hostile_pod_body(self) -> dict:
        r = self.rng
        self.n += 1
        name = f"{self.prefix}h-{self.n}"
        limits = {"cpu": r.choice(["100m", "1", self.quantity()]), "memory": r.choice(["64Mi", self.quantity()])}
        kind = r.random()
        if kind < 0.4:
            limits["nvidia.com/gpu"] = r.choice(["1", "2", self.quantity()])
        elif kind < 0.8:
            limits["tessera.dev/gpu-milli"] = r.choice(["300", "5000", "0", self.quantity()])
            if r.random() < 0.2:
                limits["nvidia.com/gpu"] = "1"  # both: the apiserver accepts it, tessera refuses it in words
        spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": limits, "requests": limits}}],
                "schedulerName": NOBODY, "terminationGracePeriodSeconds": 0, "tolerations": [{"operator": "Exists"}]}
        if r.random() < 0.4:  # bound at creation (no kubelet here): to a hostile node or to one that does not exist
            spec["nodeName"] = r.choice(self.hostile_nodes or ["nowhere"]) if r.random() < 0.7 else f"{self.prefix}nowhere"
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": {"name": name, "annotations": self.annotations(spec.get("nodeName", "n")), "labels": self.labels()}}

    def hostile_node_body(self) -> dict:
        r = self.rng
        self.n += 1
        name = f"{self.prefix}hostile-{self.n}"
        cap = {"cpu": r.choice(["8", self.quantity()]), "memory": r.choice(["64Gi", self.quantity()]), "pods": "110",
               "nvidia.com/gpu": r.choice(["4", "0"] + BAD_CAPACITIES)}
        ann = {INVENTORY_ANNOTATION: r.choice(BAD_INVENTORIES + GOOD_INVENTORIES + [self.text()])} if r.random() < 0.8 else {}
        return {"apiVersion": "v1", "kind": "Node", "spec": {"taints": [TAINT]},
                "metadata": {"name": name, "annotations": ann, "labels": self.labels()},
                "status": {"capacity": cap, "allocatable": cap}}

    # -- operations (each one API call, counted) -------------------------------------------------

    def op_hostile_pod(self) -> None:
        body = self.hostile_pod_body()
        s = _status(lambda: self.api.create_namespaced_pod(self.ns, body, _preload_content=False))
        self.figures.count(s, "create pod")
        if s < 300:
            with self.legit_lock:
                self.hostile_pods.append(body["metadata"]["name"])

    def op_hostile_node(self) -> None:
        body = self.hostile_node_body()
        s = _status(lambda: self.api.create_node(body, _preload_content=False))
        self.figures.count(s, "create node")
        if s < 300:
            with self.legit_lock:
                self.hostile_nodes.append(body["metadata"]["name"])

    def op_update_hostile(self) -> None:
        with self.legit_lock:
            pods, nodes = list(self.hostile_pods), list(self.hostile_nodes)
        if pods and (not nodes or self.rng.random() < 0.6):
            name = self.rng.choice(pods)
            patch = {"metadata": {"annotations": self.annotations(), "labels": self.labels()}}
            s = _status(lambda: self.api.patch_namespaced_pod(name, self.ns, patch, _preload_content=False))
            self.figures.count(s, "patch pod")
        elif nodes:
            name = self.rng.choice(nodes)
            if self.rng.random() < 0.5:
                patch = {"metadata": {"annotations": {INVENTORY_ANNOTATION: self.rng.choice(BAD_INVENTORIES + [self.text()])}}}
                s = _status(lambda: self.api.patch_node(name, patch, _preload_content=False))
            else:
                cap = {"nvidia.com/gpu": self.rng.choice(BAD_CAPACITIES), "cpu": self.quantity()}
                s = _status(lambda: self.api.patch_node_status(name, {"status": {"capacity": cap, "allocatable": cap}},
                                                               _preload_content=False))
            self.figures.count(s, "patch node")
        else:
            self.op_hostile_node()

    def op_update_legit(self) -> None:
        """A tenant's hostile edit of a counted pod, or a node's hostile report: never a GPU moved."""
        r = self.rng
        with self.legit_lock:
            pods = sorted(self.expected)
        if pods and r.random() < 0.6:
            name = r.choice(pods)
            ann = {ASSIGNMENT_ANNOTATION: r.choice(BAD_ASSIGNMENTS).replace("%s", self.expected_node(name))}
            if r.random() < 0.5:
                ann = {MAC_ANNOTATION: r.choice(["é" * 64, "\u0660" * 64, self.text()])}
            elif r.random() < 0.3:
                ann = {GANG_NAME_ANNOTATION: "g", GANG_SIZE_ANNOTATION: r.choice(["1e400", "x", str(2**80)])}
            s = _status(lambda: self.api.patch_namespaced_pod(name, self.ns, {"metadata": {"annotations": ann}},
                                                              _preload_content=False))
            self.figures.count(s, "patch legit pod")
        else:
            name = r.choice(self.legit_nodes)
            if r.random() < 0.6:
                patch = {"metadata": {"annotations": {INVENTORY_ANNOTATION: r.choice(BAD_INVENTORIES)}}}
                s = _status(lambda: self.api.patch_node(name, patch, _preload_content=False))
            else:
                cap = {"nvidia.com/gpu": r.choice(["9223372036854775807", "1e18", "1Ei"])}
                s = _status(lambda: self.api.patch_node_status(name, {"status": {"capacity": cap, "allocatable": cap}},
                                                               _preload_content=False))
            self.figures.count(s, "patch legit node")

    def expected_node(self, name: str) -> str:
        with self.legit_lock:
            return self.expected.get(name, ("n",))[0]

    def op_delete(self) -> None:
        r = self.rng
        with self.legit_lock:
            if r.random() < 0.3 and self.expected:
                name = r.choice(sorted(self.expected))
                held = self.expected.pop(name)  # its GPUs are free again once the delete is done, not before
                which = "legit"
            elif self.hostile_pods and r.random() < 0.7:
                name = self.hostile_pods.pop(r.randrange(len(self.hostile_pods)))
                which = "pod"
            elif self.hostile_nodes:
                name = self.hostile_nodes.pop(r.randrange(len(self.hostile_nodes)))
                which = "node"
            else:
                return
        if which == "node":
            s = _status(lambda: self.api.delete_node(name, _preload_content=False))
        else:
            s = _status(lambda: self.api.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False))
        if which == "legit" and s < 300:
            node, gpus, milli = held
            with self.legit_lock:
                for g in gpus:
                    self.free[node][g] += milli
        with self.figures.lock:
            self.figures.deletes += 1
            self.figures.legit_deleted += which == "legit"
        if s >= 300:
            self.figures.problems.append(f"delete {which} {name}: HTTP {s}")

    def op_legit_pod(self) -> str:
        """A pod Tessera would have bound: created pending, then bound with its signed assignment (one Binding).

        Expected only once bound, so a concurrent delete or edit never picks a pod that does not exist yet.
        """
        r = self.rng
        with self.legit_lock:
            whole = r.random() < 0.4
            need = 1000 if whole else r.choice([100, 250, 300, 500, 700])
            count = r.choice([1, 2]) if whole else 1
            spots = [(n, [g for g, f in enumerate(free) if f >= need]) for n, free in self.free.items()]
            spots = [(n, gs) for n, gs in spots if len(gs) >= count]
            if not spots:
                return ""
            node, fitting = r.choice(spots)
            gpus = tuple(sorted(r.sample(fitting, count)))
            for g in gpus:
                self.free[node][g] -= need
            self.n += 1
            name = f"{self.prefix}legit-{self.n}"
        gpu = {"nvidia.com/gpu": str(count)} if whole else {"tessera.dev/gpu-milli": str(need)}
        limits = {"cpu": "100m", "memory": "64Mi", **gpu}
        try:
            body = self.pending_body(name, limits)
            uid = json.loads(self.api.create_namespaced_pod(self.ns, body, _preload_content=False).data)["metadata"]["uid"]
            a = Assignment(f"{self.ns}/{name}", node, gpus, need, 100, 64, None)
            meta = {"name": name, "namespace": self.ns, "annotations": assignment_annotations(a, (), self.signer, uid)}
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
            self.api.create_namespaced_binding(self.ns, binding, _preload_content=False)
        except Exception:
            with self.legit_lock:  # never created, or created and not bound: it holds nothing
                for g in gpus:
                    self.free[node][g] += need
            _status(lambda: self.api.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False))
            raise
        with self.legit_lock:
            self.expected[name] = (node, gpus, need)
        with self.figures.lock:
            self.figures.legit_pods += 1
        return name

    def pending_body(self, name: str, limits: dict) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "none", "resources": {"limits": limits, "requests": limits}}],
                         "schedulerName": NOBODY, "terminationGracePeriodSeconds": 0, "tolerations": [{"operator": "Exists"}]}}

    # -- the run ---------------------------------------------------------------------------------

    def setup(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespace({"metadata": {"name": self.ns}}, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
        for name in self.legit_nodes:
            cap = {"cpu": "64", "memory": "512Gi", "pods": "1000", "nvidia.com/gpu": str(GPUS_PER_NODE)}
            self.api.create_node({"apiVersion": "v1", "kind": "Node", "spec": {"taints": [TAINT]},
                                  "metadata": {"name": name, "labels": {MODEL_LABEL: "A100"}},
                                  "status": {"capacity": cap, "allocatable": cap}}, _preload_content=False)

    def run(self, objects: int, threads: int) -> Figures:
        """`objects` hostile object states (creates and updates), with deletions and legit pods between them."""
        f = self.figures
        stop = threading.Event()

        def poll_readyz():
            while not stop.wait(0.5):
                f.readyz[readyz(self.extender)[0]] += 1

        poller = threading.Thread(target=poll_readyz, daemon=True)
        poller.start()
        plan = []
        hostile = 0
        while hostile < objects:
            x = self.rng.random()
            if x < 0.05:
                plan.append(self.op_legit_pod)
            elif x < 0.12:
                plan.append(self.op_delete)
            else:
                plan.append(self.rng.choices([self.op_hostile_pod, self.op_hostile_node, self.op_update_hostile,
                                              self.op_update_legit], weights=[45, 15, 25, 15])[0])
                hostile += 1
        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            for fut in [pool.submit(op) for op in plan]:
                try:
                    fut.result()
                except Exception as e:
                    f.problems.append(f"{type(e).__name__}: {str(e)[:200]}")
        f.extra["send_s"] = time.monotonic() - t0
        # sentinels: once the watch shows both, every event before them has been applied (each watch is in order)
        sentinel = f"{self.prefix}sentinel"
        self.api.create_namespaced_pod(self.ns, self.pending_body(sentinel, {"cpu": "10m"}), _preload_content=False)
        node = f"{self.prefix}sentinel-node"
        cap = {"cpu": "1", "memory": "1Gi", "pods": "1", "nvidia.com/gpu": "1"}
        self.api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": {"taints": [TAINT]},
                              "status": {"capacity": cap, "allocatable": cap}}, _preload_content=False)
        self.hostile_nodes.append(node)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                self.extender.inspect(f"{self.ns}/{sentinel}")  # 404 until the watch brought it
                if any(n["name"] == node for n in self.extender.inspect()["nodes"]):
                    break
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    f.problems.append(f"/inspect answered {e.code}: {e.read()[:200]!r}")
                    break
            time.sleep(0.5)
        else:
            f.problems.append("the extender did not catch up with the sentinels within 300 s")
        f.seconds = time.monotonic() - t0
        stop.set()
        try:
            self.check(self.extender.inspect())
        except urllib.error.HTTPError as e:
            f.problems.append(f"/inspect answered {e.code} at the end")
        return f

    def check(self, m: dict) -> None:
        """Synced, every legit pod counted exactly on its GPUs, deleted ones gone, no GPU over 1000 milli."""
        f = self.figures
        status, body = readyz(self.extender)
        if status != 200 or not m["synced"]:
            f.problems.append(f"not ready at the end: {status} {body}")
        holders: dict[str, list] = {}
        for n in m["nodes"]:
            for g in n["gpus"]:
                if g["free_milli"] < 0 or g["free_milli"] > 1000:
                    f.problems.append(f"{n['name']} GPU {g['index']}: free {g['free_milli']} milli")
                for h in g["holders"]:
                    holders.setdefault(h["pod"], []).append((n["name"], g["index"], h["milli"]))
        with self.legit_lock:
            expected = dict(self.expected)
        for name, (node, gpus, milli) in expected.items():
            got = sorted(holders.get(f"{self.ns}/{name}", []))
            if got != [(node, g, milli) for g in gpus]:
                f.problems.append(f"legit pod {name}: expected {node} {gpus} {milli}, counted as {got}")
        for n in m["nodes"]:
            if n["name"] in self.free:
                free = [g["free_milli"] for g in n["gpus"]]
                if free != self.free[n["name"]]:
                    f.problems.append(f"legit node {n['name']}: free {free}, expected {self.free[n['name']]}")
        for pod in holders:
            if pod.startswith(f"{self.ns}/{self.prefix}legit-") and pod.split("/", 1)[1] not in expected:
                f.problems.append(f"deleted legit pod {pod} still holds GPUs")
        legit_seen = {n["name"] for n in m["nodes"]} & set(self.legit_nodes)
        if legit_seen != set(self.legit_nodes):
            f.problems.append(f"legit nodes missing from the cache: {sorted(set(self.legit_nodes) - legit_seen)}")
        not_counted = [k for k in m.get("not_counted", {}) if k]
        f.extra.update(bad_listed=Counter(b["kind"] for b in m.get("bad_objects", [])), not_counted=len(not_counted),
                       forged=len(m.get("forged", {})), bad_total=bad_totals(self.extender), events=self.events())

    def events(self) -> int:
        """Events tessera wrote on bad objects (pods: their namespace; nodes: default), rate-limited by design."""
        n = 0
        for ns in (self.ns, "default"):
            try:
                listed = json.loads(self.api.list_namespaced_event(
                    ns, field_selector="reason=TesseraIgnoredObject", _preload_content=False).data)
                n += len(listed.get("items") or [])
            except Exception:
                pass
        return n

    def cleanup(self) -> None:
        for name in self.legit_nodes + self.hostile_nodes:
            _status(lambda name=name: self.api.delete_node(name, _preload_content=False))
        _status(lambda: self.api.delete_namespace(self.ns, _preload_content=False))


def readyz(extender) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{extender.admin_url}/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError as e:
        return 0, {"error": str(e)}


def bad_totals(extender) -> dict:
    with urllib.request.urlopen(f"{extender.admin_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tessera_bad_objects_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = int(float(line.rsplit(" ", 1)[1]))
    return out


def outage(work: Path, extender, down_s: float) -> dict:
    """Kill the apiserver, watch /readyz turn 503 with a reason, start it again, watch /readyz come back."""
    pids = [line.split() for line in (work / "pids").read_text().splitlines() if line.strip()]
    pid = int([p for name, p in pids if name == "kube-apiserver"][-1])
    cmdline = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    went_down = None
    while time.monotonic() - t0 < down_s:
        status, body = readyz(extender)
        if status == 503 and went_down is None:
            went_down = (time.monotonic() - t0, body.get("reason", ""))
        time.sleep(0.5)
    log = open(work / "logs" / "kube-apiserver.log", "ab")
    proc = subprocess.Popen(cmdline, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with open(work / "pids", "a") as f:
        f.write(f"kube-apiserver {proc.pid}\n")  # controlplane.sh stop kills the newest
    t1 = time.monotonic()
    back = None
    while time.monotonic() - t1 < 120:
        if readyz(extender)[0] == 200:
            back = time.monotonic() - t1
            break
        time.sleep(0.5)
    return {"503_after_s": went_down[0] if went_down else None, "reason": went_down[1] if went_down else "",
            "200_again_after_restart_s": back}


def report(f: Figures, objects: int) -> str:
    lines = [
        f"hostile object states generated: {objects} (+ {f.deletes} deletions, {f.legit_pods} legit pods bound)",
        f"API calls counted: {f.sent}; accepted by the apiserver: {f.accepted}; refused by its validation: "
        f"{sum(f.refused.values())} {dict(f.refused)}; other errors: {dict(f.errors)}",
        f"bad object states recorded by tessera (tessera_bad_objects_total): {f.extra.get('bad_total')}; "
        f"listed now: {dict(f.extra.get('bad_listed', {}))}; forged assignments: {f.extra.get('forged')}; "
        f"Events written on them: {f.extra.get('events')}",
        f"sent in {f.extra.get('send_s', 0):.1f} s; caught up (sentinels seen) after {f.seconds:.1f} s in all",
        f"/readyz while sending: {dict(f.readyz)}",
        f"legit pods alive {f.legit_pods - f.legit_deleted}, deleted {f.legit_deleted}; problems: {len(f.problems)}",
    ]
    lines += [f"  PROBLEM {p}" for p in f.problems[:20]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=number_arg(int, 1), default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=number_arg(int, 1), default=4)
    ap.add_argument("--outage", action="store_true", help="also kill the apiserver for a while and watch /readyz")
    args = ap.parse_args()
    from kubernetes import client, config

    from extender.watch_health import STALL_S
    from testing.local_cluster import LocalCluster, binaries_missing

    missing = binaries_missing()
    if missing:
        print(missing)
        return 2
    work = Path(tempfile.mkdtemp(prefix="watch-fuzz-")) / "cp"
    cluster = LocalCluster(work)
    cluster.start()
    try:
        config.load_kube_config(config_file=str(work / "kubeconfig"))
        fz = Fuzzer(client.CoreV1Api(), cluster.extender, args.seed, "watch-fuzz", "wf-")
        fz.setup()
        f = fz.run(args.objects, args.threads)
        print(report(f, args.objects), flush=True)
        if args.outage:
            o = outage(work, cluster.extender, STALL_S + 10)
            print(f"apiserver killed: /readyz 503 after {o['503_after_s']} s ({o['reason']!r}); "
                  f"restarted: 200 again after {o['200_again_after_restart_s']} s", flush=True)
            if o["503_after_s"] is None or o["200_again_after_restart_s"] is None:
                f.problems.append("readiness did not track the outage")
            fz.check(cluster.extender.inspect())
        ok = not f.problems
        print("OK" if ok else f"FAILED: {len(f.problems)} problems")
        return 0 if ok else 1
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
