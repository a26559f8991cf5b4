"""The openb trace through the real kube-scheduler 1.20.2 and `tessera serve`, against the replay.

All GPU nodes of openb become Node objects; pods are created one at a time in the packing
order of `tessera simulate` (seeded shuffle plus resampling), each waited on until kube-scheduler
binds it or marks it unschedulable, until arrived GPU demand reaches 100% of capacity; no
departures. Prints the unallocated GPU share at the end next to what `tessera simulate` predicts
for the kube setting with the same seed (the replay), and the pods' throughput. kube-scheduler runs
the shipped control-plane configuration (GPU pods bound by Tessera, CPU-only pods ranked by it
through the ignorable entry and bound by kube-scheduler): 4.64% unallocated at seed 42.

    python bench/kube_openb.py [--seed 42] [--trace CSV] [--nodes CSV] [--limit-pods N]

Data: Alibaba cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch

from extender.cli.args import number_arg
from extender.sim.packing import inflate, replay_packing
from extender.sim.trace import load_nodes, load_pods
from testing.local_cluster import LocalCluster, binaries_missing
from testing.trace_objects import SHARED, node_body, pod_body

NS = "openb"


class Decisions:
    """Watches the namespace: a pod is decided once bound or marked unschedulable."""

    def __init__(self, api) -> None:
        self.api, self.lock, self.cv = api, threading.Lock(), threading.Condition()
        self.bound: dict[str, str] = {}
        self.unschedulable: set[str] = set()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                for ev in watch.Watch().stream(self.api.list_namespaced_pod, NS, timeout_seconds=600):
                    pod = ev["object"]
                    with self.cv:
                        if pod.spec.node_name:
                            self.bound[pod.metadata.name] = pod.spec.node_name
                            self.unschedulable.discard(pod.metadata.name)
                        elif any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or []):
                            self.unschedulable.add(pod.metadata.name)
                        self.cv.notify_all()
            except Exception:
                time.sleep(0.5)

    def wait(self, name: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self.cv:
            while name not in self.bound and name not in self.unschedulable:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                self.cv.wait(left)
            return "bound" if name in self.bound else "unschedulable"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--trace", default=str(SHARED / "openb_pod_list_default.csv"))
    ap.add_argument("--nodes", default=str(SHARED / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--limit-pods", type=number_arg(int, 0), default=0, help="stop after this many pods (0: at 100%% arrived)")
    args = ap.parse_args()
    missing = binaries_missing()
    if missing:
        print(missing)
        return 2
    nodes = load_nodes(args.nodes)
    pods = [p.request for p in load_pods(args.trace)]
    predicted = replay_packing(nodes, pods, "tessera", "kube", args.seed)

    work = Path(tempfile.mkdtemp(prefix="kube-openb-")) / "cp"
    cluster = LocalCluster(work)
    cluster.start()
    try:
        config.load_kube_config(config_file=str(work / "kubeconfig"))
        api = client.CoreV1Api()
        api.create_namespace({"metadata": {"name": NS}})
        t0 = time.monotonic()
        for n in nodes:
            api.create_node(node_body(n))
        while len(cluster.extender.inspect()["nodes"]) < len(nodes):
            time.sleep(0.5)
        print(f"{len(nodes)} nodes created and seen by tessera in {time.monotonic() - t0:.1f} s", flush=True)
        run = replay(api, pods, sum(n.gpu_count for n in nodes) * 1000, args.seed, args.limit_pods)
        time.sleep(5)  # let retried pods settle, then count what the API says is bound
        report(api, run, predicted.unallocated_pct.get("100"), f"openb {Path(args.trace).stem}, seed {args.seed}")
        print(f"tessera's own count: {sum(1 for _ in cluster.extender.inspect()['not_counted'])} assignments not counted")
    finally:
        cluster.stop()
    return 0


@dataclass
class Replay:
    decisions: Decisions
    capacity: int
    arrived: int = 0
    elapsed: float = 0.0
    demand: dict[str, int] = field(default_factory=dict)  # pod name -> GPU milli it asks
    counts: dict[str, int] = field(default_factory=lambda: {"bound": 0, "unschedulable": 0, "timeout": 0})


def replay(api, pods: list, capacity: int, seed: int, limit_pods: int) -> Replay:
    """Create the pods one at a time, each after the previous one's decision, until 100% of capacity arrived."""
    decisions = Decisions(api)
    run = Replay(decisions, capacity)
    t0 = time.monotonic()
    for i, p in enumerate(inflate(pods, capacity, seed)):
        if run.arrived + p.gpu_demand > capacity or (limit_pods and i >= limit_pods):
            break
        run.arrived += p.gpu_demand
        name = f"p{i:05d}"
        api.create_namespaced_pod(NS, pod_body(p, name))
        run.demand[name] = p.gpu_demand
        run.counts[decisions.wait(name, 60)] += 1
        if i % 500 == 0:
            print(f"  {i} pods, {run.arrived / capacity:.1%} arrived, {run.counts}, "
                  f"{i / (time.monotonic() - t0 + 1e-9):.0f} pods/s", flush=True)
    run.elapsed = time.monotonic() - t0
    return run


def report(api, run: Replay, sim: float, label: str) -> None:
    """What the API says is bound against what `tessera simulate --scheduler kube` predicted."""
    bound = {p.metadata.name for p in api.list_namespaced_pod(NS).items if p.spec.node_name}
    allocated = sum(d for n, d in run.demand.items() if n in bound)
    late = sorted(n for n in run.decisions.unschedulable if n in bound)
    if late:
        print(f"{len(late)} pods were unschedulable at first and bound on a retry")
    never = sorted(n for n in run.demand if n not in bound)
    for n in never[:3]:
        msgs = [e.message for e in api.list_namespaced_event(NS, field_selector=f"involvedObject.name={n}").items]
        print(f"  {n} ({run.demand[n]} milli): {msgs[-1] if msgs else '(no event)'}")
    real = 100 - 100 * allocated / run.capacity
    total = sum(run.counts.values())
    print(f"\n{label}, {total} pods in {run.elapsed:.0f} s ({total / run.elapsed:.0f} pods/s): {run.counts}")
    print(f"unallocated GPUs at {run.arrived / run.capacity:.1%} arrived: real kube-scheduler + tessera {real:.2f}%, "
          f"tessera simulate --scheduler kube predicts {sim:.2f}% (difference {real - sim:+.2f} points)")


if __name__ == "__main__":
    sys.exit(main())
