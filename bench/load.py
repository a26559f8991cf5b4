"""Sustained load on `tessera serve`'s app over loopback, next to a do-nothing app, then 1000 concurrent binds.

The server is a separate process: `tessera serve`'s Flask app under waitress with the limits
`tessera serve` uses, over a synthetic cluster (bench/extender_latency.py's, testing/load_cluster.py: N nodes
x 8 GPUs, 60% held). Its binder stands in for the API server and loops every Binding back through the
extender's watch entry point (`upsert_pod` with the assignment annotation, as the API cache would), and each
bound pod finishes (`delete_pod`) after --lifetime seconds, so the cluster stays in a steady state.
The binder also keeps its own count of milli per GPU, from the cluster's initial holdings plus every
assignment it wrote minus every pod finished: a GPU over 1000 there is a double allocation, counted
independently of the extender's own books.

The load generator (this process) runs --clients threads, each with a keep-alive connection, each
doing kube-scheduler's cycle for a new pod: filter, prioritize the survivors, bind to the best. Each
pod is first created: POST /bench/create hands it to the server's watch entry point (`upsert_pod`),
since only the watch adds pods (the verbs remember nothing); it is not a verb and is not timed. An
error is any non-200, any failed connection, a filter or prioritize Error, or a bind Error other than
"no longer fits" (two clients racing for the last room on a node: the extender refusing the loser is
correct; they are counted apart, as conflicts). The server's RSS is sampled every second; "flat"
compares the mean of the first and the last 10 s. The baseline is a do-nothing app (constant answers)
under the same server and the same load, run first for --baseline-seconds.

Then 1000 concurrent binds: 1000 new pods are filtered, then 1000 threads, each on its own connection,
release their bind at once onto the same 4 nodes (far more than fits): every bind must be answered
(bound, or refused in words), no GPU over 1000 milli.

    python bench/load.py [--seconds 60] [--baseline-seconds 20] [--nodes 500] [--clients 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import replace
from pathlib import Path

from extender.cli.args import number_arg
from extender.http.app import create_app
from extender.http.limits import waitress_options
from extender.runtime import tune_gc
from extender.service import EXTENDER_MEMO_LIMIT
from extender.translate.objects import parse_assignment, pod_info
from testing.load_cluster import build_extender, null_app, pct, pod

P = "/tessera"
BURST = 1000


# --- the server process ---------------------------------------------------------------------------

class LoopbackApi:
    """The API server as far as bind and the watch go: records each Binding, confirms it, finishes the pod later."""

    def __init__(self, extender, lifetime_s: float) -> None:
        self.extender, self.lifetime_s = extender, lifetime_s
        self.lock = threading.Lock()
        self.used = Counter()  # (node, gpu) -> milli held, counted here independently of the extender
        for node in extender.cluster.nodes:
            for g, free in enumerate(node.gpu_free):
                self.used[(node.name, g)] = 1000 - free
        self.live: deque = deque()  # (finish at, uid, node, gpus, milli)
        self.binds = 0
        self.max_used = max(self.used.values(), default=0)
        threading.Thread(target=self._finisher, daemon=True).start()

    def bind(self, namespace, name, uid, node, annotations) -> None:
        info = self.extender.pods[uid]
        assignment = parse_assignment({"metadata": {"annotations": annotations}}, info.request)
        with self.lock:
            self.binds += 1
            for g in assignment.gpus:
                self.used[(node, g)] += assignment.milli
                self.max_used = max(self.max_used, self.used[(node, g)])
            self.live.append((time.monotonic() + self.lifetime_s, uid, node, assignment.gpus, assignment.milli))
        # the watch sees the pod bound with its annotation (here, before bind returns: the order the
        # extender must cope with either way)
        self.extender.upsert_pod(replace(info, node=node, assignment=assignment))

    def _finisher(self) -> None:
        while True:
            time.sleep(0.05)
            now, done = time.monotonic(), []
            with self.lock:
                while self.live and self.live[0][0] <= now:
                    done.append(self.live.popleft())
            for _, uid, node, gpus, milli in done:
                self.extender.delete_pod(uid)
                with self.lock:
                    for g in gpus:
                        self.used[(node, g)] -= milli

    def stats(self) -> dict:
        snapshot = self.extender.snapshot()  # one consistent view, taken under the extender's lock
        negative = sum(1 for *_, gpu_free in snapshot.nodes for free in gpu_free if free < 0)
        measure = getattr(self.extender.policy, "measure", None)
        memo = measure.memo_size if measure is not None else 0
        pods_known = len(snapshot.pods)
        with self.lock:
            return {"binds": self.binds, "max_used_milli": self.max_used, "gpus_over_1000_extender": negative,
                    "live": len(self.live), "pods_known": pods_known, "fragmentation_memo": memo}


def live_objects() -> dict:
    """After a full collection: objects the GC tracks (outside the frozen cache), memory blocks allocated, RSS."""
    import gc

    gc.collect()
    return {"objects": len(gc.get_objects()), "blocks": sys.getallocatedblocks(), "rss_mib": rss_mib(os.getpid())}


def serve(kind: str, nodes: int, lifetime_s: float, port_file: str, memo_limit: int) -> None:
    import logging

    import waitress
    from flask import jsonify

    logging.getLogger("waitress").setLevel(logging.ERROR)  # the burst queues 1000 connections on purpose

    if kind == "tessera":
        if memo_limit:  # to tell the fragmentation memo's (bounded) growth from anything else
            from extender import service
            service.EXTENDER_MEMO_LIMIT = memo_limit
        extender = build_extender(nodes, seed=nodes)
        api = LoopbackApi(extender, lifetime_s)
        app = create_app(extender, api, prefix=P)
        app.get("/bench/stats", endpoint="bench_stats")(lambda: jsonify(api.stats()))

        @app.post("/bench/create", endpoint="bench_create")
        def create():  # the API server creating the pod and the watch seeing it
            from flask import request

            extender.upsert_pod(pod_info(request.get_json()))
            return jsonify({})

        app.get("/bench/objects", endpoint="bench_objects")(lambda: jsonify(live_objects()))
        tune_gc()  # as `tessera serve` does once its cache has synced
    else:
        app = null_app()
        app.post(f"{P}/bind", endpoint="bind")(lambda: jsonify({"Error": ""}))
        app.post("/bench/create", endpoint="bench_create")(lambda: jsonify({}))
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=8, ident="tessera", **waitress_options())
    Path(port_file).write_text(str(server.effective_port))
    server.run()


# --- the load generator ---------------------------------------------------------------------------

def start_server(kind: str, args) -> tuple[subprocess.Popen, int]:
    port_file = f"/tmp/tessera-load-{os.getpid()}-{kind}.port"
    Path(port_file).unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--nodes", str(args.nodes),
                             "--lifetime", str(args.lifetime), "--port-file", port_file,
                             "--memo-limit", str(args.memo_limit)])
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        if Path(port_file).is_file() and Path(port_file).read_text():
            port = int(Path(port_file).read_text())
            Path(port_file).unlink()
            return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Load:
    def __init__(self, port: int, names: list[str], seed: int) -> None:
        self.port, self.names = port, names
        self.lock = threading.Lock()
        self.next = 0
        self.seed = seed
        self.times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": [], "cycle": []}
        self.errors: Counter = Counter()
        self.conflicts = 0
        self.unschedulable = 0
        self.requests = 0
        self.examples: list[str] = []

    def _error(self, kind: str, detail: str) -> None:
        with self.lock:
            self.errors[kind] += 1
            if len(self.examples) < 5:
                self.examples.append(f"{kind}: {detail[:200]}")

    def _call(self, conn, verb: str, body: dict):
        t0 = time.perf_counter()
        conn.request("POST", f"{P}/{verb}", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        with self.lock:
            self.requests += 1
        took = (time.perf_counter() - t0) * 1000
        if r.status != 200:
            raise RuntimeError(f"{verb} HTTP {r.status}: {data[:200]!r}")
        return json.loads(data), took

    def client(self, stop_at: float, prefix: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while time.monotonic() < stop_at:
            with self.lock:
                i = self.next
                self.next += 1
            p = pod(i, random.Random(self.seed * 1_000_003 + i))
            p["metadata"].update(name=f"{prefix}{i}", uid=f"{prefix}uid-{i}")
            try:
                create(conn, p)
            except Exception as e:
                self._error("transport", f"create: {type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                continue
            for _ in range(50):  # like kube-scheduler's queue: a pod that lost a race is scheduled again
                conn, done = self._cycle(conn, p)
                if done:
                    break
        conn.close()

    def _cycle(self, conn, p: dict):
        """One scheduling cycle for `p`: (connection to go on with, whether the pod is finished with)."""
        t0 = time.perf_counter()
        try:
            passed, tf = self._call(conn, "filter", {"Pod": p, "NodeNames": self.names})
            if passed.get("Error"):
                self._error("filter", passed["Error"])
                return conn, True
            survivors = passed.get("NodeNames") or []
            scores, tp = self._call(conn, "prioritize", {"Pod": p, "NodeNames": survivors})
            if not isinstance(scores, list):
                self._error("prioritize", str(scores))
                return conn, True
            if not survivors:
                with self.lock:
                    self.unschedulable += 1
                return conn, False
            best = max(scores, key=lambda s: s["Score"])["Host"]
            meta = p["metadata"]
            bound, tb = self._call(conn, "bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                  "PodUID": meta["uid"], "Node": best})
        except Exception as e:  # a dropped connection, a timeout, a 5xx: all errors
            self._error("transport", f"{type(e).__name__}: {e}")
            conn.close()
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60), True
        if bound.get("Error"):
            if "no longer fits" in bound["Error"]:
                with self.lock:
                    self.conflicts += 1
                return conn, False
            self._error("bind", bound["Error"])
            return conn, True
        cycle = (time.perf_counter() - t0) * 1000
        with self.lock:
            for k, v in (("filter", tf), ("prioritize", tp), ("bind", tb), ("cycle", cycle)):
                self.times[k].append(v)
        return conn, True


def create(conn, p: dict) -> None:
    """The pod is created: the server's watch entry point learns it (only the watch adds pods)."""
    conn.request("POST", "/bench/create", json.dumps(p), {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"create HTTP {r.status}")


def sustained(kind: str, args, seconds: float) -> dict:
    proc, port = start_server(kind, args)
    try:
        names = [f"node-{i:05d}" for i in range(args.nodes)]
        warm = Load(port, names, seed=1)  # a running extender has seen pods: caches and workload mix are warm
        warm.client(time.monotonic() + 3, "warm-")
        load = Load(port, names, seed=2)
        held_before = get_json(port, "/bench/objects") if kind == "tessera" else None
        stop_at = time.monotonic() + seconds
        threads = [threading.Thread(target=load.client, args=(stop_at, "p-")) for _ in range(args.clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        rss = []
        while time.monotonic() < stop_at:
            stats = get_json(port, "/bench/stats") if kind == "tessera" else {"fragmentation_memo": 0, "pods_known": 0}
            rss.append((time.monotonic() - started, rss_mib(proc.pid), stats["fragmentation_memo"], stats["pods_known"]))
            time.sleep(1)
        for t in threads:
            t.join()
        took = time.monotonic() - started
        result = {"kind": kind, "seconds": took, "load": load, "rss": rss}
        if kind == "tessera":
            result["stats"] = get_json(port, "/bench/stats")
            result["held"] = (held_before, get_json(port, "/bench/objects"))
            result["burst"] = burst(port, names, args)
        return result
    finally:
        proc.terminate()
        proc.wait(10)


def get_json(port: int, path: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def burst(port: int, names: list[str], args) -> dict:
    """1000 binds released at once, all onto the same 4 nodes, each on its own connection."""
    filt = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    rng = random.Random(3)
    pods = []
    for i in range(BURST):
        p = pod(i, rng)
        p["metadata"].update(name=f"burst-{i}", uid=f"burst-uid-{i}")
        create(filt, p)
        filt.request("POST", f"{P}/filter", json.dumps({"Pod": p, "NodeNames": names}), {"Content-Type": "application/json"})
        filt.getresponse().read()
        pods.append(p)
    filt.close()
    targets = names[:4]
    gate = threading.Barrier(BURST)
    answers: list = [None] * BURST

    def one(i: int) -> None:
        meta = pods[i]["metadata"]
        body = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                           "Node": targets[i % 4]})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.connect()
            gate.wait(timeout=120)
            conn.request("POST", f"{P}/bind", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            answers[i] = (r.status, json.loads(r.read()).get("Error"))
            conn.close()
        except Exception as e:
            answers[i] = (0, f"{type(e).__name__}: {e}")

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    stats = get_json(port, "/bench/stats")
    ok = sum(1 for a in answers if a == (200, ""))
    refused = sum(1 for a in answers if a and a[0] == 200 and a[1] and a[1].startswith("tessera:"))
    return {"ok": ok, "refused": refused, "other": BURST - ok - refused, "seconds": took, "stats": stats,
            "examples": [a for a in answers if not (a and a[0] == 200 and a[1] is not None)][:3]}


def memory_drift(rss: list[tuple]) -> str:
    """RSS and fragmentation memo, first 10 s against last 10 s of the samples (seconds, RSS MiB, memo entries, pods
    known). A run under 20 s has no separate windows, and a memo that did not grow has no bytes per entry: both said
    in words (it printed "grew by 0 entries: nan bytes per entry")."""
    end = rss[-1][0]
    if end < 20:
        return (f"RSS and memo drift: not measured, the run's {end:.0f} s of samples hold no separate first and last "
                "10 s (--seconds 20 or more)")
    early, late = [s for s in rss if s[0] < 10], [s for s in rss if s[0] >= end - 10]
    first, last = statistics.mean(s[1] for s in early), statistics.mean(s[1] for s in late)
    memo_first, memo_last = statistics.mean(s[2] for s in early), statistics.mean(s[2] for s in late)
    drift = f"RSS {last - first:+.1f} MiB ({(last - first) / first:+.1%})"
    if memo_last <= memo_first:
        return f"{drift} while the fragmentation memo did not grow ({memo_last:.0f} entries): no bytes per entry"
    per = (last - first) * 2**20 / (memo_last - memo_first)
    return f"{drift} while the fragmentation memo grew by {memo_last - memo_first:.0f} entries: {per:.0f} bytes per entry"


def report(results: list[dict], memo_limit: int = 0) -> bool:
    """Print the table; True when the run met its bar (no errors, no GPU over 1000, every burst bind answered)."""
    print(f"{'app':>8} {'seconds':>7} {'pods/s':>9} {'req/s':>7} {'cycle p50':>10} {'p99':>7} {'filter p99':>11}"
          f" {'prio p99':>9} {'bind p99':>9} {'errors':>7} {'conflicts':>10} {'RSS first10s':>13} {'last10s':>8}")
    for r in results:
        load, rss = r["load"], r["rss"]
        cycles = len(load.times["cycle"])
        first = statistics.mean(m for t, m, *_ in rss if t < 10) if rss else float("nan")
        last = statistics.mean(m for t, m, *_ in rss if t >= rss[-1][0] - 10) if rss else float("nan")
        t = load.times
        print(f"{r['kind']:>8} {r['seconds']:>7.1f} {cycles / r['seconds']:>9.1f} {load.requests / r['seconds']:>7.0f}"
              f" {pct(t['cycle'], .5):>10.2f} {pct(t['cycle'], .99):>7.2f} {pct(t['filter'], .99):>11.2f}"
              f" {pct(load.times['prioritize'], .99):>9.2f} {pct(load.times['bind'], .99):>9.2f} {sum(load.errors.values()):>7}"
              f" {load.conflicts:>10} {first:>11.1f}MiB {last:>5.1f}MiB")
        for e in load.examples:
            print(f"         error: {e}")
        if r["kind"] == "tessera" and rss:
            marks = [f"{t:.0f}s {m:.1f}/{n}/{k}" for t, m, n, k in rss[::10]]
            print(f"         every 10 s, RSS MiB/memo entries/pods known: {', '.join(marks)}")
            before, after = r["held"]
            print(f"         after a full GC, before the load: {before['objects']} GC objects, {before['blocks']} blocks,"
                  f" RSS {before['rss_mib']:.1f} MiB; after it: {after['objects']} GC objects, {after['blocks']} blocks"
                  f" (the fragmentation memo: {r['stats']['fragmentation_memo']} entries), RSS {after['rss_mib']:.1f} MiB")
            print(f"         {memory_drift(rss)}")
    tessera = next(r for r in results if r["kind"] == "tessera")
    null = next((r for r in results if r["kind"] == "null"), None)
    if null:
        t_rate = len(tessera["load"].times["cycle"]) / tessera["seconds"]
        n_rate = len(null["load"].times["cycle"]) / null["seconds"]
        print(f"ratio tessera/null: throughput {t_rate / n_rate:.2f}, cycle p99 "
              f"{pct(tessera['load'].times['cycle'], .99) / pct(null['load'].times['cycle'], .99):.2f}")
    s = tessera["stats"]
    print(f"sustained: {s['binds']} binds written, most milli ever held on one GPU {s['max_used_milli']} (binder's count), "
          f"GPUs below 0 free in the extender {s['gpus_over_1000_extender']}, "
          f"unschedulable cycles {tessera['load'].unschedulable}; at the end: pods known {s['pods_known']}, "
          f"running {s['live']}, fragmentation memo {s['fragmentation_memo']} entries (bounded at "
          f"{memo_limit or EXTENDER_MEMO_LIMIT:,})")
    b = tessera["burst"]
    print(f"{BURST} concurrent binds onto 4 nodes in {b['seconds']:.1f} s: {b['ok']} bound, {b['refused']} refused in words,"
          f" {b['other']} other; most milli ever on one GPU {b['stats']['max_used_milli']},"
          f" GPUs over 1000 milli {b['stats']['gpus_over_1000_extender'] + (b['stats']['max_used_milli'] > 1000)}")
    for e in b["examples"]:
        print(f"         not answered: {e}")
    over = s["max_used_milli"] > 1000 or b["stats"]["max_used_milli"] > 1000 or b["stats"]["gpus_over_1000_extender"] > 0
    return not over and b["other"] == 0 and sum(tessera["load"].errors.values()) == 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=number_arg(float, 1), default=60)
    ap.add_argument("--baseline-seconds", type=number_arg(float, 0), default=20)
    ap.add_argument("--nodes", type=number_arg(int, 1), default=500)
    ap.add_argument("--clients", type=number_arg(int, 1), default=8)
    ap.add_argument("--lifetime", type=float, default=5.0, help="seconds a bound pod runs before it finishes")
    ap.add_argument("--memo-limit", type=number_arg(int, 0), default=0,
                    help="cap the fragmentation memo at N entries (default: the extender's 50,000)")
    ap.add_argument("--serve", choices=["tessera", "null"], help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.nodes, args.lifetime, args.port_file, args.memo_limit)
        return 0
    print(f"{args.nodes} nodes x 8 GPUs, {args.clients} clients, filter+prioritize+bind per pod, pods run {args.lifetime:.0f} s")
    results = []
    if args.baseline_seconds > 0:
        results.append(sustained("null", args, args.baseline_seconds))
    results.append(sustained("tessera", args, args.seconds))
    return 0 if report(results, args.memo_limit) else 1


if __name__ == "__main__":
    sys.exit(main())
