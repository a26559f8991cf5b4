"""Filter + prioritize latency of `tessera serve` against a real kube-apiserver, with every pod really bound (issue 38).

bench/extender_latency.py feeds the extender in-process: no apiserver, no watch, and a bind that is a method call.
Here the bench plays kube-scheduler against a real control plane (etcd + kube-apiserver 1.20.2 from
scripts/kube-build.sh, no kube-scheduler):

  * N Node objects x 8 GPUs, as Tessera reads them: the model label, capacity and allocatable `nvidia.com/gpu`
    and `tessera.dev/gpu-milli`, the `tessera.dev/gpu-inventory` annotation (tessera_contract.encode_inventory);
  * `tessera serve` as its own process (plain HTTP on loopback, as beside a kube-scheduler static pod), its watch
    on the apiserver, with TESSERA_SERVER_TIMING=1 so every answer says where its time went (extender/http/timing.py);
  * per pod, as kube-scheduler does: create the pod through the API (one of 5 shapes: 250 and 500 milli slices,
    1, 2 and 8 whole GPUs), wait until the bench's own pod watch (its informer) delivers it, POST filter with the
    nodeCacheCapable body (the pod as the apiserver returned it, every node's name), prioritize with the
    survivors, then bind to the best-scored node (ties drawn at random, as kube-scheduler's selectHost) in a
    background thread, as kube-scheduler's binding goroutines: the extender's binder writes the Binding and the
    watch brings it back while the next pods are filtered;
  * the same sequence against a do-nothing Flask app (testing/load_cluster.py's null_app: parses the bodies
    with orjson, answers a constant) in its own waitress process with as many threads; its pods are bound by
    POSTing the Binding to the API directly, so the apiserver and the extender's watch carry the same load.

Reported: p50, p99, p99.9 and max of filter + prioritize (the round trip the goal is about: p99 at most twice the
null app's), of bind, and of bind -> the bench's watch seeing the pod bound; the ten slowest calls with what each
waited on (the extender's own breakdown from the Server-Timing header, the client's JSON, the binds in flight and
the watch events that arrived during the call); the extender's RSS at the end.

    python bench/bind_latency.py [--nodes 5000] [--pods 600] [--runs 1] [--warm 50] [--fill 0] [--bind inline]

--bind inline waits for each bind's answer before the next pod, so no bind overlaps a filter (the Binding's
watch event and its Event still may): run both ways to see what the overlap costs.

5000 nodes take a minute or two to create (16 at a time). --fill 0.6 first binds signed pods onto 60% of the GPUs
(two API calls per GPU: several minutes at 5000 nodes), so placement meets fragmented nodes; off by default.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from extender.cli.args import number_arg, share_arg
from extender.http import timing
from testing.load_cluster import null_app, pct
from testing.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[1]

NS = "bench"
SCHEDULER = "default-scheduler"  # the profile `tessera serve` serves by default
GPUS_PER_NODE = 8
MODELS = (("NVIDIA-A100-SXM4-80GB", 81920), ("Tesla-V100-SXM2-32GB", 32768), ("Tesla-T4", 15360))
# the five shapes: (label, the GPU limit)
SHAPES = (("250m", {"tessera.dev/gpu-milli": "250"}), ("500m", {"tessera.dev/gpu-milli": "500"}),
          ("1gpu", {"nvidia.com/gpu": "1"}), ("2gpu", {"nvidia.com/gpu": "2"}), ("8gpu", {"nvidia.com/gpu": "8"}))
FILL_SLICES = (250, 500, 1000)
PARTS = ("parse", "lock", "locked", "rest", "gc", "offcpu", "others", "before", "after")


# --- the cluster ---------------------------------------------------------------------------------------------

class ControlPlane:
    """etcd + kube-apiserver on loopback (scripts/controlplane.sh without a scheduler config: the bench is the
    scheduler), under `work`."""

    def __init__(self, work: Path) -> None:
        self.work = work

    @property
    def kubeconfig(self) -> Path:
        return self.work / "kubeconfig"

    def start(self) -> None:
        from testing.local_cluster import CONTROLPLANE

        subprocess.run([str(CONTROLPLANE), "start", str(self.work)], check=True, env=dict(os.environ, CP_VERBOSITY="1"))

    def stop(self) -> None:
        from testing.local_cluster import CONTROLPLANE

        subprocess.run([str(CONTROLPLANE), "stop", str(self.work)], check=False, capture_output=True)


def core_api(kubeconfig: Path, pool: int = 32):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool  # the node-creating threads and the binders each keep a connection
    return client.CoreV1Api(client.ApiClient(cfg))


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def node_body(i: int) -> dict:
    """Node i as Tessera counts its GPUs: inventory annotation, model label, nvidia.com/gpu and gpu-milli in status."""
    from tessera_contract import INVENTORY_ANNOTATION, MILLI_PER_GPU, MILLI_RESOURCE, MODEL_LABEL, encode_inventory

    name, (model, memory) = node_name(i), MODELS[i % len(MODELS)]
    gpus = [{"index": g, "uuid": f"GPU-{i:05d}-{g}", "model": model, "memory_mib": memory, "healthy": True,
             "oob_memory_mib": 0} for g in range(GPUS_PER_NODE)]
    capacity = {"cpu": "96", "memory": "768Gi", "pods": "250", "nvidia.com/gpu": str(GPUS_PER_NODE),
                MILLI_RESOURCE: str(GPUS_PER_NODE * MILLI_PER_GPU)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {MODEL_LABEL: model, "nvidia.com/gpu.memory": str(memory),
                                                  "kubernetes.io/hostname": name},
                         "annotations": {INVENTORY_ANNOTATION: encode_inventory(gpus)}},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


def create_nodes(api, n: int, threads: int = 16) -> float:
    """Create nodes 0..n-1, `threads` at a time; seconds taken. A Node's status may be written on create (the
    apiserver keeps it for Nodes); should it not stick, each is patched through the status subresource."""
    t0 = time.monotonic()
    first = orjson.loads(api.create_node(node_body(0), _preload_content=False).data)
    patch = "nvidia.com/gpu" not in ((first.get("status") or {}).get("allocatable") or {})

    def make(i: int) -> None:
        body = node_body(i)
        if i:
            api.create_node(body, _preload_content=False)
        if patch:
            api.patch_node_status(body["metadata"]["name"], {"status": body["status"]}, _preload_content=False)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(make, range(n) if patch else range(1, n)))
    return time.monotonic() - t0


def pod_body(name: str, gpu_limits: dict) -> dict:
    limits = {"cpu": "1", "memory": "2Gi", **gpu_limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "none", "resources": {"limits": limits, "requests": limits}}]}}


def binding_body(name: str, uid: str, node: str, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "annotations": annotations or {}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


def fill(api, n_nodes: int, share: float, key_file: Path, keep_empty: int, threads: int = 16) -> tuple[int, float]:
    """Bind a pod onto `share` of the GPUs (a seeded slice or whole GPU each), signed as Tessera's binder signs them,
    before `tessera serve` starts: it adopts them from its first list. `keep_empty` nodes are left whole (the 8-GPU
    pods need them: filled GPU by GPU, hardly any node would be). (pods, seconds)."""
    from extender.core.model import Assignment
    from extender.state import assignment_annotations
    from tessera_contract.keyring import load_path

    signer, rng = load_path(str(key_file)), random.Random(11)
    filled = n_nodes - min(n_nodes, keep_empty)  # nodes 0.. are filled, the last `keep_empty` stay whole for 8-GPU pods
    per_gpu = min(1.0, share * n_nodes / filled) if filled else 0.0
    held = [(i, g, rng.choice(FILL_SLICES)) for i in range(filled) for g in range(GPUS_PER_NODE) if rng.random() < per_gpu]

    def one(item) -> None:
        i, g, milli = item
        name = f"fill-{i:05d}-{g}"
        limits = {"tessera.dev/gpu-milli": str(milli)} if milli < 1000 else {"nvidia.com/gpu": "1"}
        pod = orjson.loads(api.create_namespaced_pod(NS, pod_body(name, limits), _preload_content=False).data)
        uid = pod["metadata"]["uid"]
        a = Assignment(f"{NS}/{name}", node_name(i), (g,), milli, 1000, 2048)
        uuids = tuple(f"GPU-{i:05d}-{x}" for x in range(GPUS_PER_NODE))
        api.create_namespaced_binding(NS, binding_body(name, uid, node_name(i), assignment_annotations(a, uuids, signer, uid)),
                                      _preload_content=False)

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, held))
    return len(held), time.monotonic() - t0


# --- the servers ---------------------------------------------------------------------------------------------

def wait_until(ready, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll `ready()` (False, or an OSError, while not yet) until it is true; fail at once if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[:4]} exited ({proc.returncode}) before {what}; see its log")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not {what} after {timeout:.0f} s")


def listening(port: int) -> bool:
    socket.create_connection(("127.0.0.1", port), 0.2).close()
    return True


def answers_200(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200


def start_tessera(kubeconfig: Path, work: Path, port: int, admin: int) -> subprocess.Popen:
    """`tessera serve` as production runs it beside kube-scheduler (plain HTTP on loopback), timing header on."""
    key = work / "assignment.key"  # bench() writes it (--fill signs with it)
    log = open(work / "tessera.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig),
                             "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                             "--assignment-key-file", str(key)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, **{timing.ENV: "1"}))
    try:
        wait_until(lambda: answers_200(f"http://127.0.0.1:{admin}/readyz"), proc, 900, "ready")
    except BaseException:
        stop(proc)
        raise
    return proc


def start_null(port: int, threads: int = 64) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-null", str(port), "--null-threads", str(threads)],
                            cwd=ROOT, start_new_session=True)
    try:
        wait_until(lambda: listening(port), proc, 60, f"listening on 127.0.0.1:{port}")
    except BaseException:
        stop(proc)
        raise
    return proc


def serve_null(port: int, threads: int) -> int:
    """The do-nothing app in this process, as `tessera serve` runs its verbs: waitress, the same limits and threads."""
    from flask import Response
    from waitress import serve

    from extender.http.limits import waitress_options

    app = null_app()
    app.post("/tessera/bind")(lambda: Response(b'{"Error":""}', mimetype="application/json"))
    serve(app, host="127.0.0.1", port=port, threads=threads, _quiet=True, **waitress_options())
    return 0


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of a process, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    kib = lambda k: float(fields.get(k, "0 kB").split()[0])  # noqa: E731
    return kib("VmRSS") / 1024, kib("VmHWM") / 1024


# --- the bench's informer --------------------------------------------------------------------------------------

class PodWatch:
    """The bench's pod informer on namespace `bench`: each pod as the apiserver last sent it, when it arrived and when
    it was seen bound, and a count of events (what arrived during a call)."""

    def __init__(self, api) -> None:
        self.api = api
        self.cv = threading.Condition()
        self.pods: dict[str, dict] = {}
        self.bound_at: dict[str, float] = {}
        self.events = 0
        self.closed = False  # the control plane is going: a broken stream is no news
        rv = orjson.loads(api.list_namespaced_pod(NS, limit=1, _preload_content=False).data)["metadata"]["resourceVersion"]
        threading.Thread(target=self._run, args=(rv,), daemon=True, name="pod-watch").start()

    def _run(self, rv: str) -> None:
        while True:
            try:
                rv = self._stream(rv)
            except Exception as e:  # a broken stream: resume from the last resourceVersion
                if self.closed:
                    return
                print(f"pod watch: {type(e).__name__}: {e}; resuming", file=sys.stderr)
                time.sleep(0.5)

    def _stream(self, rv: str) -> str:
        resp = self.api.list_namespaced_pod(NS, watch=True, resource_version=rv, timeout_seconds=3600,
                                            allow_watch_bookmarks=False, _preload_content=False)
        buf = b""
        for chunk in resp.stream(amt=None, decode_content=False):  # one chunk per event, as kubernetes' Watch reads
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    rv = self._apply(orjson.loads(line)) or rv
        return rv

    def _apply(self, event: dict) -> str:
        pod = event.get("object") or {}
        meta = pod.get("metadata") or {}
        if event.get("type") == "ERROR":
            raise RuntimeError(f"watch error: {pod.get('message')}")
        name, now = meta.get("name", ""), time.perf_counter()
        with self.cv:
            self.events += 1
            if event.get("type") == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
                if (pod.get("spec") or {}).get("nodeName") and name not in self.bound_at:
                    self.bound_at[name] = now
            self.cv.notify_all()
        return meta.get("resourceVersion", "")

    def wait_pod(self, name: str, timeout: float = 30.0) -> dict:
        with self.cv:
            if not self.cv.wait_for(lambda: name in self.pods, timeout):
                raise TimeoutError(f"pod {name} not seen by the watch within {timeout:.0f} s")
            return self.pods[name]

    def wait_bound(self, names: list[str], timeout: float) -> int:
        """How many of `names` the watch saw bound, waiting up to `timeout` for all."""
        with self.cv:
            self.cv.wait_for(lambda: all(n in self.bound_at for n in names), timeout)
            return sum(1 for n in names if n in self.bound_at)


# --- kube-scheduler's side -----------------------------------------------------------------------------------

@dataclass
class Call:
    """One pod's filter + prioritize, as the client saw it and as the server said (Server-Timing, summed)."""

    pod: str
    shape: str
    ms: float = 0.0  # filter + prioritize round trips, client JSON included (the figure the goal is about)
    filter_ms: float = 0.0
    prioritize_ms: float = 0.0
    json_ms: float = 0.0  # the client's own encoding and decoding
    server: dict[str, float] = field(default_factory=dict)  # summed over both verbs
    passed: int = 0
    binds_in_flight: int = 0
    watch_events: int = 0
    node: str = ""
    bind_ms: float = 0.0
    bind_sent: float = 0.0
    bind_error: str = ""



class Verbs:
    """kube-scheduler's HTTP client towards one extender: keep-alive connections, one per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()

    def post(self, verb: str, body: bytes) -> tuple[bytes, str]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", f"/tessera/{verb}", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.read(), resp.getheader(timing.HEADER) or ""
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise

    def exchange(self, verb: str, payload: dict) -> tuple[object, dict[str, float], float]:
        """One verb: its answer, the server's Server-Timing parts (ms) with where the rest of the round trip went
        (`before`: from sending to the handler's start, `after`: from its end to the answer read; the host's one
        monotonic clock), and the client's own JSON seconds."""
        j0 = time.perf_counter()
        body = orjson.dumps(payload)
        sent = time.perf_counter()
        raw, header = self.post(verb, body)
        got = time.perf_counter()
        answer = orjson.loads(raw)
        json_s = (sent - j0) + (time.perf_counter() - got)
        parts = timing.parse(header) if header else {}
        if parts:
            begin = parts.pop("begin")
            parts.update(before=begin - sent * 1000, after=got * 1000 - begin - parts["total"],
                         offcpu=parts["total"] - parts["cpu"])
        return answer, parts, json_s

    def decide(self, call: Call, pod: dict, names: list[str]) -> list[dict]:
        """filter, then prioritize with the survivors: the scores, and `call` filled in."""
        t0 = time.perf_counter()
        got, fparts, fjson = self.exchange("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        t1 = time.perf_counter()
        passed = got.get("NodeNames") or []
        if got.get("Error"):
            raise RuntimeError(f"filter of {call.pod}: {got['Error']}")
        if not passed:  # unschedulable: kube-scheduler asks no prioritize and binds nothing
            call.ms = call.filter_ms = (t1 - t0) * 1000
            call.json_ms, call.server = fjson * 1000, fparts
            return []
        scores, pparts, pjson = self.exchange("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        t2 = time.perf_counter()
        call.ms, call.filter_ms, call.prioritize_ms = (t2 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000
        call.json_ms, call.passed = (fjson + pjson) * 1000, len(passed)
        if fparts and pparts:
            call.server = {k: fparts[k] + pparts.get(k, 0.0) for k in fparts}
        return scores


def best(scores: list[dict], rng: random.Random) -> str:
    """The highest-scored host; ties drawn at random, as kube-scheduler's selectHost."""
    top = max(s["Score"] for s in scores)
    return rng.choice([s["Host"] for s in scores if s["Score"] == top])


class Binder:
    """kube-scheduler's binding goroutines: each bind in a background thread while the next pods are scheduled. With
    `verbs`, the extender's bind verb (its binder writes the Binding); without, the bench POSTs the Binding itself."""

    def __init__(self, api, verbs: Verbs | None, threads: int, inline: bool = False) -> None:
        self.api, self.verbs, self.inline = api, verbs, inline
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="bind")
        self.lock = threading.Lock()
        self.in_flight = 0
        self.futures = []

    def submit(self, call: Call, uid: str) -> None:
        with self.lock:
            self.in_flight += 1
        if self.inline:  # --bind inline: the next pod waits for this bind's answer (never overlaps its filter)
            self._bind(call, uid)
        else:
            self.futures.append(self.pool.submit(self._bind, call, uid))

    def _bind(self, call: Call, uid: str) -> None:
        call.bind_sent = t0 = time.perf_counter()
        try:
            if self.verbs is not None:
                body = {"PodName": call.pod, "PodNamespace": NS, "PodUID": uid, "Node": call.node}
                raw, _ = self.verbs.post("bind", orjson.dumps(body))
                call.bind_error = orjson.loads(raw).get("Error") or ""
            else:
                self.api.create_namespaced_binding(NS, binding_body(call.pod, uid, call.node), _preload_content=False)
        except Exception as e:
            call.bind_error = f"{type(e).__name__}: {e}"
        finally:
            call.bind_ms = (time.perf_counter() - t0) * 1000
            with self.lock:
                self.in_flight -= 1

    def drain(self) -> None:
        for f in self.futures:
            f.result()
        self.futures.clear()


@dataclass
class Phase:
    label: str
    calls: list[Call]
    bound_seen: int
    bind_to_watch_ms: list[float]
    create_ms: list[float]


def schedule(api, watch: PodWatch, verbs: Verbs, binder: Binder, names: list[str], prefix: str, shapes: list[int],
             seed: int) -> Phase:
    """Create, filter + prioritize and bind each pod in turn, as kube-scheduler's loop does."""
    rng, calls, create_ms = random.Random(seed), [], []
    for i, s in enumerate(shapes):
        label, limits = SHAPES[s]
        call = Call(f"{prefix}-{i:04d}-{label}", label)
        t0 = time.perf_counter()
        api.create_namespaced_pod(NS, pod_body(call.pod, limits), _preload_content=False)
        create_ms.append((time.perf_counter() - t0) * 1000)
        pod = watch.wait_pod(call.pod)
        call.binds_in_flight, events = binder.in_flight, watch.events
        scores = verbs.decide(call, pod, names)
        call.watch_events = watch.events - events
        calls.append(call)
        if scores:
            call.node = best(scores, rng)
            binder.submit(call, pod["metadata"]["uid"])
    binder.drain()
    binder.pool.shutdown()
    pods = [c.pod for c in calls if c.node]
    seen = watch.wait_bound(pods, 60)
    to_watch = [(watch.bound_at[c.pod] - c.bind_sent) * 1000 for c in calls if c.pod in watch.bound_at and c.bind_sent]
    return Phase(prefix, calls, seen, to_watch, create_ms)


# --- the report ------------------------------------------------------------------------------------------------

def quantiles(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7} {'-':>7}"
    return " ".join(f"{v:>7.2f}" for v in (pct(values, .5), pct(values, .99), pct(values, .999), max(values)))


def report_phase(p: Phase) -> None:
    fp = [c.ms for c in p.calls]
    binds = [c.bind_ms for c in p.calls]
    errors = [c for c in p.calls if c.bind_error]
    print(f"{p.label:<14} f+p {quantiles(fp)} | bind {quantiles(binds)} | bind->watch {quantiles(p.bind_to_watch_ms)}"
          f" | bound {p.bound_seen}/{len(p.calls)}" + (f", {len(errors)} bind errors" if errors else "")
          + "".join(f", {n} fit nowhere" for n in [sum(1 for c in p.calls if not c.passed)] if n)
          + f" | pod create p50 {pct(p.create_ms, .5):.1f} p99 {pct(p.create_ms, .99):.1f}")
    for c in errors[:3]:
        print(f"    {c.pod} -> {c.node}: {c.bind_error[:160]}")


def report_parts(calls: list[Call]) -> None:
    timed = [c for c in calls if c.server]
    if not timed:
        print("  (no Server-Timing header: the extender's breakdown is missing)")
        return
    print("  tessera's own breakdown over all pods, ms (filter + prioritize summed): p50 / p99")
    cols = [("server", lambda c: c.server["total"])] + [(k, lambda c, k=k: c.server[k]) for k in PARTS]
    cols += [("client json", lambda c: c.json_ms)]
    print("   " + "  ".join(f"{name} {pct([f(c) for c in timed], .5):.2f}/{pct([f(c) for c in timed], .99):.2f}"
                            for name, f in cols))


def report_slowest(calls: list[Call], n: int = 10) -> None:
    print(f"  the {n} slowest filter + prioritize calls, ms, both verbs summed. server: the handler (parse, lock: waiting "
          "for it, locked: under it, rest: encoding); offcpu: the handler off the CPU (GIL, other processes); others: "
          "CPU of the extender's other threads meanwhile; before/after: the round trip before and after the handler "
          "(sockets, waitress, the GIL); json: the client's; binds: in flight; events: pod watch events meanwhile")
    head = ["pod", "f+p", "filter", "prio", "server"] + list(PARTS) + ["json", "binds", "events"]
    print("   " + f"{head[0]:<22}" + "".join(f"{h:>8}" for h in head[1:]))
    for c in sorted(calls, key=lambda c: c.ms, reverse=True)[:n]:
        parts = [c.server.get(k, float("nan")) for k in ("total", *PARTS)]
        row = [c.ms, c.filter_ms, c.prioritize_ms, *parts, c.json_ms]
        print("   " + f"{c.pod:<22}" + "".join(f"{v:>8.2f}" for v in row) + f"{c.binds_in_flight:>8}{c.watch_events:>8}")


# --- the run -----------------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=number_arg(int, 1), default=5000, help="Node objects, 8 GPUs each (default 5000)")
    ap.add_argument("--pods", type=number_arg(int, 1), default=600, help="timed pods per target and run (default 600)")
    ap.add_argument("--runs", type=number_arg(int, 1), default=1, help="tessera then null, this many times (default 1)")
    ap.add_argument("--warm", type=number_arg(int, 0), default=50,
                    help="untimed pods through each target first, as in a running cluster (default 50)")
    ap.add_argument("--fill", type=share_arg, default=0.0,
                    help="share of GPUs bound before the extender starts (e.g. 0.6; default 0: empty nodes)")
    ap.add_argument("--bind-threads", type=number_arg(int, 1), default=16, help="binds in flight at most (default 16)")
    ap.add_argument("--bind", choices=("background", "inline"), default="background",
                    help="background (default): as kube-scheduler, each bind in its own thread while the next pods are "
                         "scheduled; inline: the next pod waits for the bind's answer, so no bind overlaps a filter"
                         " (its watch events still may)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="leave the control plane's folder (logs) behind")
    ap.add_argument("--serve-null", type=int, default=0, help=argparse.SUPPRESS)  # the null app's own process
    ap.add_argument("--null-threads", type=int, default=64, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve_null:
        return serve_null(args.serve_null, args.null_threads)
    from testing.local_cluster import binaries_missing

    missing = binaries_missing() or ("" if shutil.which("etcd") else "etcd not installed (Debian's etcd-server)")
    if missing:
        print(f"bind_latency: {missing}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="bind-latency-"))
    cp, procs = ControlPlane(work / "cp"), []
    try:
        cp.start()
        bench(args, cp, work, procs)
    finally:
        for proc in procs:
            stop(proc)
        cp.stop()
        if args.keep:
            print(f"control plane and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def bench(args: argparse.Namespace, cp: ControlPlane, work: Path, procs: list[subprocess.Popen]) -> None:
    """Nodes, the two servers (appended to `procs`, which the caller stops), warm-up, the runs and the report."""
    api = core_api(cp.kubeconfig, pool=max(32, args.bind_threads + 16))
    api.create_namespace({"metadata": {"name": NS}}, _preload_content=False)
    took = create_nodes(api, args.nodes)
    print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs created in {took:.1f} s ({args.nodes / took:.0f}/s)", flush=True)
    key = work / "assignment.key"
    key.write_text(os.urandom(32).hex())
    if args.fill:
        pods = (args.warm + args.pods * args.runs) * 2  # both targets; a fifth of them ask 8 GPUs: keep twice that
        count, took = fill(api, args.nodes, args.fill, key, keep_empty=-(-pods * 2 // len(SHAPES)))
        print(f"{count} pods bound onto {args.fill:.0%} of the GPUs in {took:.1f} s", flush=True)
    t0 = time.monotonic()
    port, null_port = free_port(), free_port()
    procs.append(start_tessera(cp.kubeconfig, work, port, free_port()))
    print(f"tessera serve ready (watch synced) {time.monotonic() - t0:.1f} s after start; log {work / 'tessera.log'}",
          flush=True)
    procs.append(start_null(null_port))
    watch = PodWatch(api)
    names = [node_name(i) for i in range(args.nodes)]
    targets = {"tessera": (Verbs(port), True), "null": (Verbs(null_port), False)}
    rng = random.Random(args.seed)
    for label, (verbs, own_bind) in targets.items():  # warm-up: the workload mix learned, caches and connections warm
        binder = Binder(api, verbs if own_bind else None, args.bind_threads, args.bind == "inline")
        schedule(api, watch, verbs, binder, names, f"warm-{label}", [rng.randrange(len(SHAPES)) for _ in range(args.warm)],
                 args.seed)
    print(f"\nfilter + prioritize round trips over loopback, ms, one pod at a time; {args.pods} pods per target and run,"
          f" {args.nodes} nodes; " + ("each bind before the next pod" if args.bind == "inline"
                                      else "binds in the background, as kube-scheduler's"))
    print("each figure: p50 p99 p99.9 max, ms; bind->watch: from sending the bind to the bench's watch seeing the pod bound")
    phases: dict[str, list[Phase]] = {"tessera": [], "null": []}
    for run in range(1, args.runs + 1):
        shapes = [rng.randrange(len(SHAPES)) for _ in range(args.pods)]
        for label, (verbs, own_bind) in targets.items():
            binder = Binder(api, verbs if own_bind else None, args.bind_threads, args.bind == "inline")
            phase = schedule(api, watch, verbs, binder, names, f"r{run}-{label}", shapes, args.seed + run)
            phases[label].append(phase)
            report_phase(phase)
    watch.closed = True
    summarise(phases, procs)


def summarise(phases: dict[str, list[Phase]], procs: list[subprocess.Popen]) -> None:
    t = [c for p in phases["tessera"] for c in p.calls]
    n = [c for p in phases["null"] for c in p.calls]
    tp99, np99 = pct([c.ms for c in t], .99), pct([c.ms for c in n], .99)
    tp50, np50 = pct([c.ms for c in t], .5), pct([c.ms for c in n], .5)
    print(f"\ntessera / null: p50 {tp50:.2f} / {np50:.2f} ms = {tp50 / np50:.2f}x, p99 {tp99:.2f} / {np99:.2f} ms = "
          f"{tp99 / np99:.2f}x (goal: p99 at most 2x)")
    report_parts(t)
    report_slowest(t)
    rss, peak = rss_mib(procs[0].pid)
    null_rss, _ = rss_mib(procs[1].pid)
    print(f"\ntessera serve RSS at the end {rss:.0f} MiB (peak {peak:.0f} MiB); the null app's {null_rss:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
