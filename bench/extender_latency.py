"""Filter + prioritize latency of `tessera serve`'s HTTP app, next to a do-nothing Flask app.

N nodes x 8 GPUs (nodeCacheCapable: true, so requests carry node names), 60% of the GPUs held by
a seeded mix of slices and whole GPUs. For each pod, like kube-scheduler: POST filter, then
prioritize with the survivors, one pod at a time over loopback HTTP (waitress, as in production).
The baseline, in the same run and the same server, is a Flask app that parses the same bodies
(with the same JSON library, orjson) and answers a constant: the ratio is Tessera's own cost.
The client is Python too and its JSON work is inside every figure (kube-scheduler's is Go). 200 pods go through first, as in any
running cluster (the workload mix is learned and the per-node verdict caches are filled).

    python bench/extender_latency.py [--nodes 1000,5000] [--pods 300]
"""

from __future__ import annotations

import argparse
import http.client
import random
import socket
import statistics
import sys
import threading
import time

import orjson
import waitress

from extender.cli.args import number_arg
from extender.http.app import create_app
from extender.runtime import tune_gc
from extender.service import Extender
from extender.translate.objects import pod_info
from testing.load_cluster import build_extender, null_app, pct, pod


def serve(app) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threading.Thread(target=waitress.serve, args=(app,), kwargs={"host": "127.0.0.1", "port": port, "threads": 8,
                                                                  "_quiet": True}, daemon=True).start()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


class CpuMeter:
    """WSGI wrapper: CPU seconds of the handler thread per request (time.thread_time), which other
    processes on a busy machine barely disturb, unlike wall-clock round trips."""

    def __init__(self, app) -> None:
        self.app, self.seconds = app, []

    def __call__(self, environ, start_response):
        t0 = time.thread_time()
        try:
            return self.app(environ, start_response)
        finally:
            self.seconds.append(time.thread_time() - t0)


def run(port: int, names: list[str], pods: list[dict], ext: Extender | None = None) -> list[float]:
    """Round trips per pod; with `ext`, each pod is first created (the watch's `upsert_pod`, untimed:
    only the watch adds pods) and then bound to its best node (untimed), as in a real cluster, so the
    next pod meets a changed node and the views really re-judge it."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for p in pods:
        if ext is not None:
            ext.upsert_pod(pod_info(p))
        t0 = time.perf_counter()
        conn.request("POST", "/tessera/filter", orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}),
                     {"Content-Type": "application/json"})
        passed = orjson.loads(conn.getresponse().read())["NodeNames"] or []
        conn.request("POST", "/tessera/prioritize", orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": passed}),
                     {"Content-Type": "application/json"})
        scores = orjson.loads(conn.getresponse().read())
        times.append((time.perf_counter() - t0) * 1000)
        assert len(scores) == len(passed)
        if ext is not None and scores:
            best = max(scores, key=lambda s: s["Score"])["Host"]
            uid, key = p["metadata"]["uid"], f"bench/{p['metadata']['name']}"
            ext.reserve(uid, key, best)
            ext.bind_done(uid, True)
    conn.close()
    return times


def counts_arg(text: str) -> list[int]:
    """Cluster sizes such as 1000,5000: whole numbers of at least 1."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"node counts look like 1000,5000; got {text[:40]!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"node counts must be at least 1; got {text[:40]!r}")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=counts_arg, default=[1000, 5000], help="cluster sizes, e.g. 1000,5000")
    ap.add_argument("--pods", type=number_arg(int, 1), default=300)
    args = ap.parse_args()
    null_meter = CpuMeter(null_app())
    null_port = serve(null_meter)
    print("filter + prioritize round trip over loopback HTTP, ms (one pod at a time, as kube-scheduler calls;")
    print("each pod then bound to its best node); cpu: the handler thread's CPU per pod, less disturbed by other load")
    print(f"{'nodes':>6} {'tessera p50':>12} {'p99':>7} {'null p50':>9} {'p99':>7} {'ratio p50':>10} {'pods/s':>7}"
          f" {'cpu p50':>8} {'p99':>6} {'null cpu':>9} {'p99':>6}")
    for n in args.nodes:
        ext = build_extender(n, seed=n)
        meter = CpuMeter(create_app(ext, binder=None))
        port = serve(meter)
        names = [node.name for node in ext.cluster.nodes]
        rng = random.Random(7)
        warm = [pod(i, rng) for i in range(200)]
        pods = [pod(200 + i, rng) for i in range(args.pods)]
        run(port, names, warm, ext)  # a running extender has seen pods: its workload mix and caches are warm
        tune_gc()  # as `tessera serve` does once its cache has synced
        run(null_port, names, warm[:20])
        meter.seconds.clear()
        null_meter.seconds.clear()
        t = run(port, names, pods, ext)
        b = run(null_port, names, pods)
        cpu = [1000 * (a + b) for a, b in zip(meter.seconds[::2], meter.seconds[1::2], strict=True)]
        ncpu = [1000 * (a + b) for a, b in zip(null_meter.seconds[::2], null_meter.seconds[1::2], strict=True)]
        print(f"{n:>6} {statistics.median(t):>12.2f} {pct(t, .99):>7.2f} {statistics.median(b):>9.2f} {pct(b, .99):>7.2f}"
              f" {statistics.median(t) / statistics.median(b):>10.2f} {1000 / statistics.mean(t):>7.0f}"
              f" {statistics.median(cpu):>8.2f} {pct(cpu, .99):>6.2f} {statistics.median(ncpu):>9.2f} {pct(ncpu, .99):>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
