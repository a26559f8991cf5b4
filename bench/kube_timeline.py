"""Time mode's pod stream, replayed in compressed time through the real kube-scheduler 1.20.2 and `tessera serve`.

100 openb GPU nodes sampled as time mode samples them (`sample_nodes`, same seed) become Node
objects; the pods of time mode's stream for the same seed and offered load (`arrival_order`,
`compress`) are created at their arrival times divided by the compression factor C, and each is
deleted when its run ends: C-times-shortened trace duration after the watch saw it bound. The pods
of the first `--hours` of trace time are replayed (the same cut on both sides) and the run lasts
until every one of them was bound. Waits are measured from a pod's due arrival, in trace time
(wall x C), and printed per class (extender/sim/waits.py) next to time mode's for the same stream,
run in this process with kube-scheduler's clocks scaled to trace time.

The clock. Three of kube-scheduler's constants are wall-clock, and replayed C times faster each
is C times longer in trace time:
- its queue's: backoff 1 s doubling to 10 s, the 60 s flush of unschedulable pods every 30 s.
  Time mode runs with `KUBE_1_20.scaled(C)` (the same queue, every clock x C).
- its API client's rate limit, 50 requests a second (burst 100): binds, and the status update and
  event of each failed attempt. The replayed configuration allows 50 x C (`CompressedCluster`);
  at 50 the first run at C = 100 had requests held over a second 228 times, scaled none.
- its scheduling cycle: it tries one pod at a time. Time mode counts a cycle as zero by default,
  and that is what the compression breaks: every pending pod is retried about every 10 s of wall
  time (the capped backoff, as moves come far more often), so at the seed's load the loop is busy
  for minutes on end; at C = 100 activeQ reached 820 pods and CPU-only pods, which always fit,
  waited 6.4 min on average (p99 18.9 min) behind it, where time mode had them wait 0. So the
  bench measures the cycle while the loop is busy (wall time per attempt while activeQ held at
  least 20 pods, from kube-scheduler's /metrics; 8.7-15.0 ms on the shared 2-core machine) and
  runs time mode again with it (`QueueTimings.cycle_s`, x C: 0.9-1.5 s of trace time at C = 100). The table
  shows time mode without the cycle as well. Uncompressed, the same cycle costs a pod seconds,
  not minutes: time mode's default of zero stands for docs/results.md §4.

Choice of C, at load 1.33 (the seed's setting, where the queue is; at load 1.0 the first 6 h have
no queue at all) and the default 6 trace hours (7424 pods, 42 of 8 GPUs; the queue builds from
about hour 3): the last pod (an 8-GPU one) is bound 12-13 h into trace time, so C = 100 gives a
replay of 470-560 s and the whole bench 500-590 s, inside the 10-minute budget (seed 43's
last 8-GPU pod waited until 18 h: 706 s; `--max-wall` bounds the wait, leaving such pods out); C = 60 would take
about 14 minutes (13 h of trace time at 60 x). The price of C = 100: 34 pods a second created (and as many deleted) during the
arrivals; the creation lag stayed at p99 4-26 ms, max 170 ms (17 s of trace time), in four runs. Without the cycle, time
mode's mean wait moves little with C (17.6 min with clocks x 100, 15.1 min unscaled, 6 h at 1.33,
seed 42), its slices' more (8.1 against 2.9 min): the 10 s backoff is 17 min of trace time.

Pods are created by a pool of threads at their due time (an API call that is slow delays no other
pod's creation), deleted by another pool; the lag between due time and the call's start is printed
for both. CPU-only pods are created and scheduled as bench/kube_openb.py does (the shipped
configuration: ranked by Tessera through the ignorable entry, bound by kube-scheduler). Pods that
fit no sampled node even empty are not created (time mode rejects them too).

    python bench/kube_timeline.py [--seed 42] [--load 1.33] [--hours 6] [--compression 100] [--policy tessera]
                                  [--short-first on|off] [--declarations users|exact]

`--short-first` (on by default, as `tessera serve` ships) runs shortest runs first on both sides
(extender/core/short_first.py's defaults; estimates off, as shipped): `tessera serve` gets the rule's bounds / C,
and each pod that declares a run carries `spec.activeDeadlineSeconds` of it / C rounded up, so a pod is short on both
sides exactly when its declared run is at most an hour (C dividing 3600). `--declarations` (users by default, as
time mode) is what each pod declares: as users do (sim/declarations.py: 40% nothing, most too long, some too short,
each such pod deleted at its deadline as the kubelet would stop it) or its exact run. With the rule C is 50 unless
given (and `--max-wall` 1500; about 17 minutes): a held pod's attempt costs kube-scheduler an extender call,
and at C = 100 the loop saturated (1.7 s of trace time per attempt) and the rule's gain vanished in the real run
while time mode kept part of it (docs/results.md §4, "Shortest runs first"). `--short-first off` replays what
docs/results.md §4b measured before the rule shipped.

Data: Alibaba cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

import yaml
from kubernetes import client, config, watch

from extender.cli.args import names_arg, number_arg
from extender.core.cluster import Cluster, never_fits
from extender.core.model import NodeSpec
from extender.core.policy import policy_names
from extender.core.short_first import ShortFirstSettings
from extender.core.workload import TargetWorkload
from extender.sim.declarations import DECLARATIONS, Declaration, declare_runs
from extender.sim.kubequeue import KUBE_1_20, QueueTimings
from extender.sim.timemode import DEFAULT_NODES, arrival_order, compress, replay_time, sample_nodes
from extender.sim.trace import TracePod, load_nodes, load_pods
from extender.sim.waits import WaitStats, class_order, pod_class, waits_by_class
from testing.local_cluster import LocalCluster, binaries_missing
from testing.trace_objects import SHARED, node_body, pod_body

NS = "timeline"
TOLERANCE = 0.15  # issue 14: per-class waits within 15% of time mode's ...
TOLERANCE_S = 120.0  # ... or 2 minutes of trace time
KUBE_CLIENT_QPS, KUBE_CLIENT_BURST = 50, 100  # kube-scheduler's clientConnection defaults (v1beta1)


# --- the stream, in trace time and on the wall clock (pure) -----------------------------------------

def first_hours(timeline: list[tuple[float, float]], hours: float, limit: int = 0) -> int:
    """How many pods of the stream arrive within its first `hours` (all for hours <= 0), at most `limit` (0: no limit)."""
    count = len(timeline) if hours <= 0 else sum(1 for arrival, _ in timeline if arrival < hours * 3600)
    return min(count, limit) if limit > 0 else count


@dataclass(frozen=True)
class Clock:
    """Trace time replayed `compression` times faster from the wall-clock instant `start` (time.monotonic)."""

    start: float
    compression: float

    def wall(self, trace_s: float) -> float:
        """The wall-clock instant of a trace time."""
        return self.start + trace_s / self.compression

    def trace(self, wall: float) -> float:
        """The trace time of a wall-clock instant."""
        return (wall - self.start) * self.compression

    def span(self, wall_s: float) -> float:
        """A wall-clock duration in trace seconds."""
        return wall_s * self.compression


@dataclass(frozen=True)
class Stream:
    nodes: list[NodeSpec]  # the sampled cluster
    pods: list[TracePod]  # in arrival order, cut at --hours
    timeline: list[tuple[float, float]]  # (arrival, duration) per pod, trace seconds
    workload: TargetWorkload  # the whole trace's mix, as time mode learns it
    placeable: list[bool]  # False for a pod no sampled node could hold even empty (never created)
    deadlines: tuple[int | None, ...] = ()  # with the rule: each pod's spec.activeDeadlineSeconds, its declared run / C
    drawn: tuple[Declaration, ...] | None = None  # users' declarations: what each pod declares and runs (None: exact)


def build_stream(args) -> Stream:
    """Time mode's stream for the seed and load: with users' declarations, as `replay_time` draws them (the same seed),
    each pod running what it runs as declared and the arrivals compressed to the load of those runs."""
    everything = arrival_order(load_pods(args.trace))
    nodes = sample_nodes(load_nodes(args.nodes), DEFAULT_NODES, args.seed)
    drawn = declare_runs([p.duration for p in everything], "users", args.seed) if args.declarations == "users" else None
    runs = everything if drawn is None else [replace(p, duration=d.run_s) for p, d in zip(everything, drawn, strict=True)]
    timeline, _ = compress(runs, Cluster(nodes).gpu_capacity_milli, args.load, args.seed)
    count = first_hours(timeline, args.hours, args.limit)
    pods = everything[:count]
    placeable = [not all(never_fits(p.request, n) for n in nodes) for p in pods]
    # the runs as compressed: capped at the arrival window, as `replay_time` caps them (its timeline is these runs)
    if drawn is not None:
        drawn = tuple(replace(d, run_s=run) for d, (_, run) in zip(drawn[:count], timeline[:count], strict=True))
    return Stream(nodes, pods, timeline[:count], TargetWorkload.from_pods(p.request for p in everything), placeable,
                  drawn=drawn)


def with_deadlines(stream: Stream, compression: int) -> Stream:
    """Each pod's spec.activeDeadlineSeconds in wall seconds: its declared run (exact: its run) / C, rounded up; None
    for a pod that declares nothing."""
    declared = [d for _, d in stream.timeline] if stream.drawn is None else [d.declared_s for d in stream.drawn]
    return replace(stream, deadlines=tuple(None if d is None else max(1, math.ceil(d / compression)) for d in declared))


def scheduler_metrics(text: str) -> dict[str, float]:
    """kube-scheduler's queue lengths and attempts from its Prometheus text: pending_<queue> and attempts_<result>."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        for metric, label, key in (("scheduler_pending_pods{", 'queue="', "pending_"),
                                   ("scheduler_schedule_attempts_total{", 'result="', "attempts_")):
            if line.startswith(metric) and label in line:
                name = line.split(label, 1)[1].split('"', 1)[0]
                out[key + name] = out.get(key + name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# --- the real side -------------------------------------------------------------------------------------

class Bind(NamedTuple):
    """A pod's bind as the watch first saw it: when (time.monotonic) and on which node."""

    at: float
    node: str


class BindWatch:
    """Watches the namespace; the first event that shows a pod with a node is its bind (time.monotonic)."""

    def __init__(self, api, on_bind) -> None:
        self.api, self.on_bind = api, on_bind
        self.bound: dict[str, Bind] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                stream = watch.Watch().stream(self.api.list_namespaced_pod, NS, timeout_seconds=3600, deserialize=False)
                for ev in stream:
                    self._see(ev.get("object") or {})
            except Exception as e:  # a dropped watch: watch again (pods bound meanwhile are seen as listed)
                if not self.stopped.is_set():
                    print(f"  watch restarted: {e}", flush=True)
                time.sleep(0.2)

    def _see(self, pod: dict) -> None:
        now = time.monotonic()
        name, node = pod.get("metadata", {}).get("name"), pod.get("spec", {}).get("nodeName")
        if not name or not node:
            return
        with self.lock:
            if name in self.bound:
                return
            self.bound[name] = Bind(now, node)
        self.on_bind(name, now)

    def count(self) -> int:
        with self.lock:
            return len(self.bound)


class Deleter:
    """Deletes each bound pod when its run ends, by a pool of threads; records how late each call started."""

    def __init__(self, api, clock: Clock, durations: dict[str, float], threads: int) -> None:
        self.api, self.clock, self.durations = api, clock, durations
        self.due: list[tuple[float, str]] = []
        self.cv = threading.Condition()
        self.pool = ThreadPoolExecutor(threads)
        self.lags: list[float] = []  # wall seconds, due -> call start
        self.deleted = 0
        self.errors: list[str] = []
        threading.Thread(target=self._run, daemon=True).start()

    def bound(self, name: str, at: float) -> None:
        with self.cv:
            heapq.heappush(self.due, (at + self.durations[name] / self.clock.compression, name))
            self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.cv.wait(self.due[0][0] - time.monotonic() if self.due else None)
                due, name = heapq.heappop(self.due)
            try:
                self.pool.submit(self._delete, name, due)
            except RuntimeError:  # the bench is over and the interpreter shutting down
                return

    def _delete(self, name: str, due: float) -> None:
        self.lags.append(time.monotonic() - due)
        try:
            self.api.delete_namespaced_pod(name, NS, grace_period_seconds=0, _preload_content=False).read()
            self.deleted += 1
        except Exception as e:
            self.errors.append(f"delete {name}: {e}")


@dataclass
class RealRun:
    clock: Clock
    names: list[str]  # pod index -> its name ("" for a pod not created)
    created_lag: list[float] = field(default_factory=list)  # wall seconds, due -> create call start
    errors: list[str] = field(default_factory=list)
    bound: dict[str, Bind] = field(default_factory=dict)
    deleted_lag: list[float] = field(default_factory=list)
    replay_wall_s: float = 0.0


def create_all(api, stream: Stream, clock: Clock, names: list[str], pool: ThreadPoolExecutor, run: RealRun) -> None:
    """Submit each pod's creation at its due wall time; the pool's threads make the calls."""
    def create(i: int, due: float) -> None:
        run.created_lag.append(time.monotonic() - due)
        body = pod_body(stream.pods[i].request, names[i])
        if stream.deadlines and stream.deadlines[i] is not None:
            body["spec"]["activeDeadlineSeconds"] = stream.deadlines[i]
        try:
            api.create_namespaced_pod(NS, body, _preload_content=False).read()
        except Exception as e:
            run.errors.append(f"{names[i]}: {e}")

    for i, (arrival, _) in enumerate(stream.timeline):
        if not names[i]:
            continue
        due = clock.wall(arrival)
        if (ahead := due - time.monotonic()) > 0:
            time.sleep(ahead)
        pool.submit(create, i, due)


def busy_cycle(samples: list[tuple[float, float, float]], busy: float = 20) -> float:
    """Wall seconds per attempt while kube-scheduler's loop had no idle moment: over the spans between two
    samples (time, attempts so far, activeQ length) that both saw at least `busy` pods in activeQ
    (0 when there was none). That is the cycle time the loop kept up while it was the bottleneck."""
    spent = made = 0.0
    for (t0, a0, q0), (t1, a1, q1) in pairwise(samples):
        if q0 >= busy and q1 >= busy and a1 > a0:
            spent, made = spent + t1 - t0, made + a1 - a0
    return spent / made if made else 0.0


class SchedulerQueueProbe:
    """Samples kube-scheduler's /metrics every second: activeQ's length and the attempts made.

    A scheduling cycle is wall-clock time that time mode counts as zero by default; when kube-scheduler
    cannot try every pod moved back to activeQ before the next ones arrive, a new pod waits behind
    them, and that wait is C times longer in trace time. The activeQ's length says whether it kept
    up, and `busy_cycle` how long an attempt took while it did not."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float, float]] = []  # (time.monotonic, attempts so far, activeQ length)
        self.latest: dict[str, float] = {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    self.latest = scheduler_metrics(r.read().decode())
                attempts = sum(v for k, v in self.latest.items() if k.startswith("attempts_"))
                self.samples.append((time.monotonic(), attempts, self.latest.get("pending_active", 0.0)))
            except OSError:
                pass
            time.sleep(1.0)

    @property
    def peak_active(self) -> float:
        return max((q for _, _, q in self.samples), default=0.0)


def replay_real(api, stream: Stream, compression: float, threads: int, max_wall_s: float,
                probe: SchedulerQueueProbe) -> RealRun:
    names = [f"p{i:05d}" if ok else "" for i, ok in enumerate(stream.placeable)]
    durations = {n: d for n, (_, d) in zip(names, stream.timeline, strict=True) if n}
    expected = len(durations)
    clock = Clock(time.monotonic() + 2.0, compression)  # 2 s to start the threads before the first arrival
    run = RealRun(clock, names)
    deleter = Deleter(api, clock, durations, threads)
    binds = BindWatch(api, deleter.bound)
    progress = threading.Thread(target=report_progress, args=(clock, binds, deleter, run, expected, probe), daemon=True)
    progress.start()
    with ThreadPoolExecutor(threads) as pool:
        create_all(api, stream, clock, names, pool, run)
    deadline = clock.start + max_wall_s
    while binds.count() < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    run.replay_wall_s = time.monotonic() - clock.start
    binds.stopped.set()
    with binds.lock:
        run.bound = dict(binds.bound)
    run.deleted_lag = list(deleter.lags)
    run.errors += deleter.errors
    return run


def report_progress(clock: Clock, binds: BindWatch, deleter: Deleter, run: RealRun, expected: int,
                    probe: SchedulerQueueProbe) -> None:
    while True:
        time.sleep(15)
        lag = max(run.created_lag[-200:], default=0.0)
        q = probe.latest
        print(f"  wall {time.monotonic() - clock.start:4.0f} s = trace {clock.trace(time.monotonic()) / 3600:4.1f} h: "
              f"{len(run.created_lag)} created, {binds.count()} bound of {expected}, {deleter.deleted} deleted; "
              f"recent creation lag max {lag * 1000:.0f} ms; kube queues active {q.get('pending_active', 0):.0f} "
              f"backoff {q.get('pending_backoff', 0):.0f} unschedulable {q.get('pending_unschedulable', 0):.0f}", flush=True)


def metrics_url(work: Path) -> str:
    """kube-scheduler's /metrics, at the address scripts/controlplane.sh rendered into its configuration."""
    rendered = yaml.safe_load((work / "scheduler-config.yaml").read_text())
    return f"http://{rendered['metricsBindAddress']}/metrics"


class CompressedCluster(LocalCluster):
    """The shipped configuration with kube-scheduler's API rate limit (50 requests a second, burst 100: the
    v1beta1 defaults), a wall-clock constant too, x C: in trace time it is then the one a real cluster has."""

    def __init__(self, work: Path, compression: int, extender_args: tuple[str, ...]) -> None:
        super().__init__(work, extender_args)
        self.compression = compression

    def scheduler_config(self) -> dict:
        cfg = super().scheduler_config()
        cfg["clientConnection"].update(qps=KUBE_CLIENT_QPS * self.compression, burst=KUBE_CLIENT_BURST * self.compression)
        return cfg


def short_first_server_args(compression: int) -> tuple[str, ...]:
    """`tessera serve`'s shortest-runs-first flags for time mode's default rule (1 h runs, 2 h hold) in wall seconds:
    a pod's deadline is its run / C rounded up, so it is short exactly when its run is at most C x (3600 // C) s.
    Estimates are said off in so many words, as `tessera serve` ships them and as the time mode this compares with."""
    rule = ShortFirstSettings()
    run, hold = int(rule.run_s) // compression, int(rule.max_hold_s) // compression
    return ("--short-first", "on", "--short-first-waiting", str(rule.waiting),
            "--short-first-run", f"{run}s", "--short-first-hold", f"{hold}s", "--short-first-estimate", "off")


def start_cluster(stream: Stream, policy: str, compression: int, short_first: bool) -> tuple[LocalCluster, client.CoreV1Api]:
    work = Path(tempfile.mkdtemp(prefix="kube-timeline-")) / "cp"
    # `tessera serve` holds by shortest runs first unless told not to; its bounds in trace hours would be C times too long
    extender_args = ("--policy", policy) + (short_first_server_args(compression) if short_first else ("--short-first", "off"))
    cluster = CompressedCluster(work, compression, extender_args)
    cluster.start()
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(work / "kubeconfig"), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64  # one connection per creating and deleting thread, kept
    api = client.CoreV1Api(client.ApiClient(cfg))
    api.create_namespace({"metadata": {"name": NS}})
    for n in stream.nodes:
        api.create_node(node_body(n))
    while len(cluster.extender.inspect()["nodes"]) < len(stream.nodes):
        time.sleep(0.5)
    return cluster, api


# --- the comparison ----------------------------------------------------------------------------------

def real_waits(stream: Stream, run: RealRun) -> tuple[dict[str, WaitStats], int]:
    """Per-class waits in trace time, and how many created pods were never bound (left out)."""
    classes, waits, unbound = [], [], 0
    for i, name in enumerate(run.names):
        if not name:
            continue
        if name not in run.bound:
            unbound += 1
            continue
        classes.append(pod_class(stream.pods[i].request))
        waits.append(real_wait(stream, run, i, name))
    return waits_by_class(classes, waits), unbound


def real_wait(stream: Stream, run: RealRun, i: int, name: str) -> float | None:
    """Pod i's wait in trace seconds, from its due arrival to the bind the watch saw; None if it was never bound."""
    bound = run.bound.get(name)
    return None if bound is None else max(0.0, run.clock.span(bound.at - run.clock.wall(stream.timeline[i][0])))


def write_waits(path: str, stream: Stream, run: RealRun) -> None:
    """One JSON line per pod created: its index in the stream, class, arrival, run and declared run, the wait the
    real run gave it (null: never bound), in trace seconds, and its node; to compare pod by pod with time mode on the
    same stream."""
    with open(path, "w") as out:
        for i, name in enumerate(run.names):
            if not name:
                continue
            wait = real_wait(stream, run, i, name)
            declared = stream.drawn[i].declared_s if stream.drawn is not None else stream.timeline[i][1]
            out.write(json.dumps({"pod": i, "class": pod_class(stream.pods[i].request), "arrival_s": stream.timeline[i][0],
                                  "run_s": stream.timeline[i][1], "declared_s": declared, "wait_s": wait,
                                  "node": bound.node if (bound := run.bound.get(name)) else None}) + "\n")


def time_mode(stream: Stream, args, timings: QueueTimings, seed: int | None = None) -> dict[str, WaitStats]:
    """Time mode's per-class waits for the stream; `seed` other than the stream's draws other ties (and policy seed)."""
    seed = args.seed if seed is None else seed
    result = replay_time(stream.nodes, stream.pods, args.policy, "kube", seed, args.load, len(stream.nodes),
                         workload=stream.workload, timings=timings, timeline=stream.timeline,
                         short_first=ShortFirstSettings() if args.short_first == "on" else None,
                         declarations=args.declarations, drawn=None if stream.drawn is None else list(stream.drawn))
    return result.classes


def within(real: float, model: float) -> bool:
    return abs(real - model) <= max(TOLERANCE * model, TOLERANCE_S)


def minutes(s: float) -> str:
    return f"{s / 60:.1f}"


def compare(real: dict[str, WaitStats], model: dict[str, WaitStats], no_cycle: dict[str, WaitStats],
            unscaled: dict[str, WaitStats]) -> list[str]:
    """A markdown table, one row per class: real, time mode (clocks x C and the measured cycle), the difference,
    the verdict, and time mode without the cycle and with 1.20's clocks unscaled (docs/results.md §4's)."""
    rows = ["| class | pods | real mean / p50 / p99 / max (min) | time mode, clocks x C, measured cycle | difference "
            "of the mean | within 15% or 2 min (mean, p50, p99, max) | time mode, clocks x C, no cycle (mean / p99) "
            "| time mode, 1.20's clocks (mean / p99) |",
            "|---|---|---|---|---|---|---|---|"]
    empty = WaitStats.of([])
    for c in class_order(set(real) | set(model)):
        r, m = real.get(c, empty), model.get(c, empty)
        n, u = no_cycle.get(c, empty), unscaled.get(c, empty)
        stats = [(r.mean_s, m.mean_s), (r.p50_s, m.p50_s), (r.p99_s, m.p99_s), (r.max_s, m.max_s)]
        diff = f"{(r.mean_s - m.mean_s) / m.mean_s:+.0%}" if m.mean_s else f"{minutes(r.mean_s - m.mean_s)} min"
        verdict = " ".join("yes" if within(a, b) else "NO" for a, b in stats)
        rows.append(f"| {c} | {r.pods} / {m.pods} | {' / '.join(minutes(a) for a, _ in stats)} | "
                    f"{' / '.join(minutes(b) for _, b in stats)} | {diff} | {verdict} | "
                    f"{minutes(n.mean_s)} / {minutes(n.p99_s)} | {minutes(u.mean_s)} / {minutes(u.p99_s)} |")
    return rows


def tie_runs(stream: Stream, args, timings: QueueTimings, model: dict[str, WaitStats]) -> list[dict[str, WaitStats]]:
    """Time mode on the same stream, nodes and clocks, with `args.tie_seeds` other seeds for its random ties."""
    return [model] + [time_mode(stream, args, timings, s) for s in range(args.seed + 1, args.seed + 1 + args.tie_seeds)]


def tie_mean(runs: list[dict[str, WaitStats]]) -> dict[str, WaitStats]:
    """Per class, each statistic averaged over the runs: time mode's expected figures for the stream.

    kube-scheduler breaks ties between nodes of equal score at random, and time mode does too, so one
    run of either is one draw. Between two draws a class of 15-44 pods moves by 21-41% of its mean at
    load 1.33 (seed 42, docs/results.md §4b); a real draw against the model's expectation over its
    ties keeps the model's own draw out of the comparison."""
    out = {}
    for c in class_order(set().union(*runs)):
        got = [r[c] for r in runs if c in r]
        out[c] = WaitStats(got[0].pods, *(sum(getattr(g, f) for g in got) / len(got)
                                          for f in ("mean_s", "p50_s", "p99_s", "max_s")))
    return out


def print_tie_spread(args, runs: list[dict[str, WaitStats]], real: dict[str, WaitStats]) -> None:
    """How far time mode's own figures move with its random ties alone, and the real run against their mean."""
    print(f"\ntime mode with the measured cycle, seeds {args.seed}-{args.seed + len(runs) - 1} for its ties (same stream), "
          "min-max (min), and the real run against their mean (within 15% or 2 min: mean, p50, p99, max):")
    expected = tie_mean(runs)
    empty = WaitStats.of([])
    for c in class_order(expected):
        means, p99s = [r[c].mean_s for r in runs if c in r], [r[c].p99_s for r in runs if c in r]
        e, r = expected[c], real.get(c, empty)
        pairs = [(r.mean_s, e.mean_s), (r.p50_s, e.p50_s), (r.p99_s, e.p99_s), (r.max_s, e.max_s)]
        verdict = " ".join("yes" if within(a, b) else "NO" for a, b in pairs)
        print(f"  {c}: mean {minutes(min(means))}-{minutes(max(means))}, p99 {minutes(min(p99s))}-{minutes(max(p99s))}; "
              f"tie mean {' / '.join(minutes(b) for _, b in pairs)}, real {' / '.join(minutes(a) for a, _ in pairs)}: "
              f"{verdict}")


def lag_line(what: str, lags: list[float], compression: float) -> str:
    s = WaitStats.of(lags)
    return (f"{what} lag (due -> call start), {s.pods} calls: p50 {s.p50_s * 1000:.0f} ms, p99 {s.p99_s * 1000:.0f} ms, "
            f"max {s.max_s * 1000:.0f} ms wall (max {s.max_s * compression:.0f} s of trace time)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--load", type=number_arg(float, 0.01), default=1.33,
                    help="offered GPU load (1.33: the seed's setting, docs/results.md §4)")
    ap.add_argument("--hours", type=number_arg(float, 0), default=6.0,
                    help="replay the pods arriving in the first HOURS of trace time")
    ap.add_argument("--limit", type=number_arg(int, 0), default=0, help="at most this many pods (0: all of those hours)")
    ap.add_argument("--compression", type=number_arg(int, 1), default=None,
                    help="trace seconds per wall second, an integer (default 50 with the rule, 100 without)")
    ap.add_argument("--policy", type=lambda t: names_arg("policy", policy_names())(t)[0], default="tessera")
    ap.add_argument("--cycle-ms", type=number_arg(float, 0), default=None,
                    help="time mode's scheduling cycle, wall ms (default: kube-scheduler's, measured in this run while busy)")
    ap.add_argument("--tie-seeds", type=number_arg(int, 0), default=4,
                    help="time mode again with this many other seeds for its ties")
    ap.add_argument("--threads", type=number_arg(int, 1), default=16, help="threads creating pods, and as many deleting them")
    ap.add_argument("--max-wall", type=number_arg(float, 1), default=None,
                    help="stop waiting for binds after this many wall seconds (default 1500 with the rule, 900 without)")
    ap.add_argument("--short-first", choices=("on", "off"), default="on",
                    help="shortest runs first on both sides, as shipped (core/short_first.py's defaults; pods carry "
                         "activeDeadlineSeconds); default on")
    ap.add_argument("--declarations", choices=DECLARATIONS, default="users",
                    help="what run each pod declares: as users do (default) or exactly (sim/declarations.py)")
    ap.add_argument("--trace", default=str(SHARED / "openb_pod_list_default.csv"))
    ap.add_argument("--nodes", default=str(SHARED / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--waits", default=None, metavar="PATH",
                    help="write each pod's real wait here, one JSON line per pod (class, arrival, run, declared run, node)")
    args = ap.parse_args()
    rule = args.short_first == "on"  # the rule needs a loop with room to spare: C = 50 (module docstring)
    args.compression = args.compression or (50 if rule else 100)
    args.max_wall = args.max_wall or (1500.0 if rule else 900.0)
    if args.compression < 1:
        ap.error("--compression must be at least 1")
    if missing := binaries_missing():
        print(missing)
        return 2
    started = time.monotonic()
    stream = build_stream(args)
    if args.short_first == "on":
        stream = with_deadlines(stream, args.compression)
    t = time.monotonic()
    no_cycle, unscaled = time_mode(stream, args, KUBE_1_20.scaled(args.compression)), time_mode(stream, args, KUBE_1_20)
    print(f"stream: {len(stream.pods)} pods over {stream.timeline[-1][0] / 3600:.1f} h of trace time, "
          f"{stream.placeable.count(False)} fit no node; time mode (twice) in {time.monotonic() - t:.1f} s", flush=True)
    cluster, api = start_cluster(stream, args.policy, args.compression, args.short_first == "on")
    try:
        print(f"control plane up, {len(stream.nodes)} nodes seen by tessera, {time.monotonic() - started:.0f} s", flush=True)
        probe = SchedulerQueueProbe(metrics_url(cluster.work))
        run = replay_real(api, stream, args.compression, args.threads, args.max_wall, probe)
        attempts = {k.removeprefix("attempts_"): int(v) for k, v in probe.latest.items() if k.startswith("attempts_")}
    finally:
        cluster.stop()
    real, unbound = real_waits(stream, run)
    if args.waits:
        write_waits(args.waits, stream, run)
    cycle = args.cycle_ms / 1000 if args.cycle_ms is not None else busy_cycle(probe.samples)
    model = time_mode(stream, args, replace(KUBE_1_20, cycle_s=cycle).scaled(args.compression))
    print(f"\nopenb {Path(args.trace).stem}, seed {args.seed}, load {args.load}, "
          f"{f'first {args.hours} h' if args.hours > 0 else 'whole stream'}, policy "
          f"{args.policy}, short-first {args.short_first}, declarations {args.declarations}, "
          f"C = {args.compression}: replay {run.replay_wall_s:.0f} s wall, whole bench "
          f"{time.monotonic() - started:.0f} s; {unbound} pods never bound, {len(run.errors)} API errors")
    print(f"kube-scheduler: attempts {attempts} ({sum(attempts.values()) / run.replay_wall_s:.0f} a wall second), "
          f"longest activeQ seen {probe.peak_active:.0f} pods; cycle while busy {busy_cycle(probe.samples) * 1000:.1f} ms, "
          f"time mode's {cycle * 1000:.1f} ms = {cycle * args.compression:.1f} s of trace time")
    print(lag_line("creation", run.created_lag, args.compression))
    print(lag_line("deletion", run.deleted_lag, args.compression))
    for e in run.errors[:3]:
        print(f"  {e}")
    print("\n" + "\n".join(compare(real, model, no_cycle, unscaled)))
    if args.tie_seeds:
        print_tie_spread(args, tie_runs(stream, args, replace(KUBE_1_20, cycle_s=cycle).scaled(args.compression), model),
                         real)
    return 0


if __name__ == "__main__":
    sys.exit(main())
