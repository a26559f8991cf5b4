"""`tessera simulate`'s flags and run: replay a trace through placement policies (extender/sim/), print the
tables, draw the PNG; and the checks before a run that bench/openb.py and bench/rooms.py make too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .args import csv_file, empty_csv, loads_arg, names_arg, number_arg, seeds_arg, share_arg
from .serve import add_reservation_flags, backfill_settings, short_first_settings

if TYPE_CHECKING:  # imported where used: `tessera --help` loads no simulator
    from ..core.backfill import BackfillSettings

DEFAULT_TIME_LOADS = "0.7,0.8,0.9,1.0,1.1,1.2"
NO_MATPLOTLIB = "matplotlib is not installed (pip install 'tessera[plot]', or --plot none)"



def add_simulate_command(sub) -> None:
    from ..core.policy import policy_names
    from ..sim.declarations import DECLARATIONS
    from ..sim.kubequeue import QUEUES
    from ..sim.schedulers import DEFAULT_EXTENDER_WEIGHT, EXTENDER_SEES, SCHEDULERS
    from ..sim.timemode import DEFAULT_NODES

    sim = sub.add_parser(
        "simulate",
        help="replay a trace through placement policies",
        description="Replay a trace (openb CSV format) through placement policies. With no arguments: "
        "packing mode on the embedded openb-like workload, every policy, ideal and kube schedulers.",
    )
    sim.add_argument("--mode", choices=("packing", "time"), default="packing")
    sim.add_argument("--trace", type=csv_file, action="append", help="pod list CSV (openb format); repeatable")
    sim.add_argument("--nodes", type=csv_file, help="node list CSV (openb format); default: the embedded cluster")
    sim.add_argument("--policy", type=names_arg("policy", policy_names()), default=None, help="a,b,c or all (default)")
    sim.add_argument("--scheduler", type=names_arg("scheduler", SCHEDULERS), default=None,
                     help="ideal (the paper's), kube (kube-scheduler's scoring) or ideal,kube (default)")
    sim.add_argument("--seeds", type=seeds_arg, default=None, help="42-51 (default for traces); 42-43 for the embedded run")
    sim.add_argument("--load", type=loads_arg, default=None,
                     help=f"time mode: offered GPU load(s), default {DEFAULT_TIME_LOADS}")
    sim.add_argument("--cluster-nodes", type=number_arg(int, 1), default=None,
                     help=f"time mode only: nodes sampled from the node list (default {DEFAULT_NODES}); packing mode "
                          "replays on the whole node list and refuses it")
    sim.add_argument("--queue", choices=tuple(QUEUES), default=None,
                     help="time mode: kube-scheduler 1.20's queue with its backoff and 60 s flush (default), or "
                          "events-only (every waiting pod retried in arrival order when a pod leaves, no timers)")
    add_reservation_flags(sim)  # time mode: the queue rules read each pod's declared run (--declarations)
    sim.add_argument("--declarations", choices=DECLARATIONS, default=None,
                     help="time mode: what run each pod declares (spec.activeDeadlineSeconds, tessera.dev/expected-runtime): "
                          "users (default: round values, mostly overestimated, some too short, so the pod is stopped at "
                          "its deadline, many none; docs/queueing.md) or exact (each its own run)")
    sim.add_argument("--movable-share", type=share_arg, default=0.0, metavar="F",
                     help="the share of GPU pods that may be moved to place a pod that fits nowhere (packing mode: "
                          "ideal scheduler only; time mode: whole-GPU pods ask, as the server's --moves does; "
                          "docs/defragmentation.md); default 0: no moves")
    sim.add_argument("--weight", type=number_arg(int, 1), default=None,
                     help=f"kube: the extender's configured weight (at least 1; default {DEFAULT_EXTENDER_WEIGHT})")
    sim.add_argument("--extender-sees", choices=EXTENDER_SEES, default=None,
                     help="kube: which pods kube-scheduler sends to the extender: all (the shipped config) or gpu "
                          "(managedResources lists the GPU resources, so CPU-only pods are placed by kube alone)")
    sim.add_argument("--workers", type=number_arg(int, 1), default=None, help="processes (default: one per core)")
    sim.add_argument("--json", action="store_true", help="one JSON object per line instead of tables (no plot unless --plot)")
    sim.add_argument("--plot", type=Path, default=None,
                     help="PNG path (default: tessera-<mode>.png, none with --json; 'none' to skip)")
    sim.set_defaults(run=cmd_simulate)



def cmd_simulate(args: argparse.Namespace) -> int:
    from ..core.policy import policy_names
    from ..sim.declarations import DEFAULT_DECLARATIONS
    from ..sim.packing import PackingResult
    from ..sim.plot import plot_packing, plot_time
    from ..sim.report import packing_table, time_table
    from ..sim.runner import EMBEDDED, Job, run_jobs
    from ..sim.schedulers import DEFAULT_EXTENDER_WEIGHT, SCHEDULERS
    from ..sim.timemode import DEFAULT_NODES

    if args.cluster_nodes is not None and args.mode != "time":
        raise ValueError("--cluster-nodes applies to --mode time only: packing mode replays on the whole node list "
                         "(give a smaller --nodes file instead)")
    plot = _plot_path(args)  # a bad path fails now, not after the whole run
    traces = args.trace or [EMBEDDED]
    nodes = args.nodes or EMBEDDED
    if args.trace and not args.nodes:
        print("note: --trace without --nodes replays on the embedded openb-like cluster", file=sys.stderr)
    policies = args.policy or policy_names()
    schedulers = args.scheduler or list(SCHEDULERS)
    seeds = args.seeds or (list(range(42, 44)) if traces == [EMBEDDED] else list(range(42, 52)))
    _check_time_flags(args)
    if "kube" not in schedulers and (args.weight or args.extender_sees):
        raise ValueError(f"{'--weight' if args.weight else '--extender-sees'} shapes the kube scheduler's replay, "
                         f"and --scheduler {','.join(schedulers)} runs none (add kube)")
    loads = (args.load or loads_arg(DEFAULT_TIME_LOADS)) if args.mode == "time" else [0.0]
    backfill, short_first = _queue_settings(args)
    check_movable_share(args.movable_share, args.mode, schedulers)
    jobs = [
        Job(trace=t, nodes=nodes, policy=p, scheduler=s, seed=seed, mode=args.mode, load=load,
            node_count=args.cluster_nodes or DEFAULT_NODES, weight=args.weight or DEFAULT_EXTENDER_WEIGHT,
            extender_sees=args.extender_sees or "all", queue=args.queue or "kube-1.20", backfill=backfill,
            movable_share=args.movable_share, short_first=_short_first_for(p, short_first, args),
            declarations=args.declarations or DEFAULT_DECLARATIONS)
        for t in traces for s in schedulers for p in policies for seed in seeds for load in loads
    ]
    _check_inputs(args, traces, nodes, backfill)
    started = time.perf_counter()
    results = []
    progress = Progress(len(jobs), sys.stderr)
    for r in run_jobs(jobs, args.workers):
        results.append(r)
        if args.json:
            record = r.as_json()
            print(json.dumps(record), flush=True)
        progress.done(len(results))
    progress.close()
    if not args.json:
        print(packing_table(results) if args.mode == "packing" else time_table(results))
        print(f"\n{len(results)} runs in {time.perf_counter() - started:.1f} s")
    if plot is not None:
        try:
            if isinstance(results[0], PackingResult):
                plot_packing(results, plot)
            else:
                plot_time(results, plot)
        except OSError as e:  # what the probe before the run could not foresee (the disk filled up, say)
            raise ValueError(f"--plot {plot}: could not write it: {e.strerror or e} (the tables above are complete)") from None
        print(f"plot: {plot}", file=sys.stderr)
    return 0


def _check_time_flags(args: argparse.Namespace) -> None:
    """Time mode's flags outside it are refused in words: packing mode would take them and do nothing."""
    if args.mode != "time" and (args.load or args.queue or args.declarations):
        flag = "--load" if args.load else "--queue" if args.queue else "--declarations"
        raise ValueError(f"{flag} is a time-mode setting: packing mode has no clock (add --mode time)")


def _queue_settings(args: argparse.Namespace):
    """(reservations, shortest runs first) from the flags, each None when off. Outside time mode both are None, and a
    flag that asks for either is refused in words: packing mode has no queue. Shortest runs first is on unless
    --short-first off, as `tessera serve` ships; `_short_first_for` says which rows it runs in."""
    backfill, short_first = backfill_settings(args), short_first_settings(args)
    if args.mode == "time":
        return backfill, short_first
    shapers = [f for f, v in (("--short-first-waiting", args.short_first_waiting), ("--short-first-run", args.short_first_run),
                              ("--short-first-hold", args.short_first_hold),
                              ("--short-first-estimate", args.short_first_estimate)) if v is not None]
    asked = ["--reservations on"] * (backfill is not None) + ["--short-first on"] * (args.short_first == "on") + shapers
    if asked:
        raise ValueError(f"{asked[0]} is a time-mode setting: packing mode has no queue to wait in (add --mode time)")
    return None, None


def _short_first_for(policy: str, short_first, args: argparse.Namespace):
    """Shortest runs first for one row: asked for in so many words (--short-first on), every row; by default only
    `tessera`'s, since it is Tessera's queue rule and `k8s-default` and `fgd` are measured as those systems run."""
    return short_first if args.short_first == "on" or policy == "tessera" else None


def check_movable_share(share: float, mode: str, schedulers: list[str]) -> None:
    """Refuse a movable share where it would mean nothing, before the run (bench/openb.py asks too)."""
    if not share:
        return
    if mode == "packing" and schedulers != ["ideal"]:
        raise ValueError("--movable-share in packing mode needs --scheduler ideal: a moved pod goes where the policy ranks "
                         "best, the ideal scheduler's rule (time mode follows the server: filter sends the replacement there)")


def _plot_path(args: argparse.Namespace) -> Path | None:
    """Where the PNG goes, or None: --json writes none unless asked (it used to overwrite the table run's PNG).

    Checked before the run: a directory that does not exist or cannot be written, or a path that is a
    directory, used to fail after minutes of simulation. So is matplotlib, the `plot` extra (setup.cfg; the image
    ships without it): missing, the default PNG is skipped with a line on stderr, and an asked-for one refused.
    """
    if args.plot is not None and str(args.plot).lower() == "none":
        return None
    if args.plot is None and args.json:
        return None
    if importlib.util.find_spec("matplotlib") is None:  # found, not imported: the plot imports it after the run
        if args.plot is None:
            print(f"no plot: {NO_MATPLOTLIB}", file=sys.stderr)
            return None
        raise ValueError(f"--plot {args.plot}: {NO_MATPLOTLIB}")
    path = args.plot or Path(f"tessera-{args.mode}.png")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"--plot {path}: is a directory; give a file name such as {path / 'tessera.png'}")
    if not parent.is_dir():
        raise ValueError(f"--plot {path}: no such directory: {parent}")
    if path.suffix.lower() != ".png":
        raise ValueError(f"--plot {path}: the plot is a PNG; give a path ending in .png (or 'none')")
    try:  # tried, not asked: os.access says yes to root everywhere, and /sys or a read-only mount still refuse
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=parent, suffix=".png"):
                pass
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot write there ({(e.strerror or str(e)).lower()})") from None
    return path


class Progress:
    """`12/40 runs done, ETA 35 s` on stderr: one line rewritten in place on a terminal; in a pipe or a
    log, a new line at most every PIPE_EVERY_S seconds (and at the end), never one endless line."""

    PIPE_EVERY_S = 10.0

    def __init__(self, total: int, out, clock=time.monotonic) -> None:
        self.total, self.out, self.clock = total, out, clock
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.started = self.last = clock()

    def line(self, n: int) -> str:
        elapsed = self.clock() - self.started
        if n >= self.total:
            return f"{n}/{self.total} runs done in {elapsed:.0f} s"
        eta = f", ETA {elapsed / n * (self.total - n):.0f} s" if n else ""
        return f"{n}/{self.total} runs done{eta}"

    def done(self, n: int) -> None:
        if self.tty:
            print(f"\r{self.line(n)}\x1b[K", end="", file=self.out, flush=True)
        elif n >= self.total or self.clock() - self.last >= self.PIPE_EVERY_S:
            self.last = self.clock()
            print(self.line(n), file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)


def _check_inputs(args: argparse.Namespace, traces: list[str], nodes: str, backfill: BackfillSettings | None) -> None:
    """Before the run: refuse what the mode cannot replay, and warn of pods no policy can place."""
    from ..sim.timemode import DEFAULT_NODES

    check_trace_labels(traces)

    if args.mode == "time":
        _check_time_mode(traces, nodes, args.cluster_nodes or DEFAULT_NODES, backfill)
    for line in _unmeetable_notes(traces, nodes):
        print(line, file=sys.stderr)


def check_packable(trace: str, nodes: str) -> None:
    """ValueError in words (TraceError for a bad row) when a trace cannot be replayed on a node list at all: no pods,
    no pod asking for a GPU, or no GPU node; both modes measure GPUs (bench/openb.py asks too)."""
    from ..sim.runner import EMBEDDED, _nodes, _pods, trace_label

    for path in {trace, nodes} - {EMBEDDED}:
        empty_csv(path)
    pods = _pods(trace)
    if not pods:
        raise ValueError(f"trace {trace_label(trace)} has no pods")
    if not any(p.request.gpu_count for p in pods):
        raise ValueError(f"trace {trace_label(trace)}: none of its {len(pods)} pods asks for a GPU, and both modes "
                         "measure GPUs (unallocated, waits against offered GPU load): nothing to replay")
    if not any(n.gpu_count for n in _nodes(nodes)):
        raise ValueError(f"the node list {nodes} has no node with a GPU: nothing to place GPU pods on")


def check_trace_labels(traces: list[str]) -> None:
    """Results are keyed by a trace's label (its file name): two traces under one were merged into one row, and a
    trace given twice ran twice as if it were two seeds. ValueError in words (bench/openb.py asks too)."""
    from ..sim.runner import trace_label

    labels: dict[str, str] = {}
    for trace in traces:
        first = labels.setdefault(trace_label(trace), trace)
        if first != trace or traces.count(trace) > 1:
            raise ValueError(f"trace {trace} and {first} would both be reported as trace {trace_label(trace)!r}: give "
                             "each trace once, under its own file name")


def _check_time_mode(traces: list[str], nodes: str, node_count: int, backfill: BackfillSettings | None) -> None:
    """Time mode needs each pod's run time, and a cluster as large as asked: refuse or say so before the run."""
    from ..sim.runner import _nodes, _pods, trace_label

    for trace in traces:
        untimed = [p for p in _pods(trace) if not p.timed]
        if untimed:
            raise ValueError(f"trace {trace_label(trace)}: {len(untimed)} of its {len(_pods(trace))} pods have no "
                             f"deletion_time (e.g. {untimed[0].request.name}), and time mode runs each pod for its "
                             "trace run time; packing mode needs no times (openb's multigpu traces have none)")
    have = len(_nodes(nodes))
    if node_count > have:
        print(f"note: time mode samples {node_count} nodes and the node list has {have}: replaying on all {have}",
              file=sys.stderr)
    pool = backfill.drain_pool if backfill is not None else 0
    if pool >= min(node_count, have):
        raise ValueError(f"--drain-pool {pool} keeps every one of the {min(node_count, have)} nodes replayed for short "
                         "runs: give fewer")


def _unmeetable_notes(traces: list[str], nodes: str) -> list[str]:
    """Before a run: each trace's pods that can never be placed (models no node has, by model; more than any node
    holds), as warnings; a trace that asks for no GPU at all is refused (ValueError): there is nothing to measure."""
    from ..sim.runner import _nodes, _pods, trace_label
    from ..sim.trace import fit_nowhere, unmeetable

    lines = []
    for trace in traces:
        check_packable(trace, nodes)
        pods = _pods(trace)
        too_big = fit_nowhere(pods, _nodes(nodes))
        if too_big:
            r = too_big[0].request
            lines.append(f"warning: trace {trace_label(trace)}: {len(too_big)} pod{'s' if len(too_big) > 1 else ''} "
                         f"{'ask' if len(too_big) > 1 else 'asks'} more than any node has even empty (e.g. {r.name}: "
                         f"{r.gpu_count} GPUs, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB); never placed, counted "
                         "as unserved whatever the policy")
        by_model = unmeetable(pods, _nodes(nodes))
        if by_model:
            shown = ", ".join(f"{m} ({n})" for m, n in by_model.most_common(8))
            more = f" and {len(by_model) - 8} more" if len(by_model) > 8 else ""
            lines.append(f"warning: trace {trace_label(trace)}: {sum(by_model.values())} GPU pods ask only for models no "
                         f"node has: {shown}{more}; they can never be placed and count as unserved whatever the policy")
    return lines
