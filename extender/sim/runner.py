"""Runs many replays (trace x policy x scheduler x seed [x load]) over a process pool.

Workers load each trace once (cached per process); jobs are small tuples, results plain
dataclasses. With one worker everything runs in-process, which keeps tests simple.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from multiprocessing import get_context
from pathlib import Path

from ..core.backfill import BackfillSettings
from ..core.model import NodeSpec
from ..core.short_first import ShortFirstSettings
from . import default_workload
from .kubequeue import QUEUES
from .packing import PackingResult, replay_packing
from .schedulers import DEFAULT_EXTENDER_WEIGHT
from .timemode import DEFAULT_NODES, TimeResult, replay_time
from .trace import TracePod, load_nodes, load_pods

EMBEDDED = "embedded"


@dataclass(frozen=True)
class Job:
    trace: str  # a CSV path, or EMBEDDED
    nodes: str  # a CSV path, or EMBEDDED
    policy: str
    scheduler: str
    seed: int
    mode: str = "packing"
    load: float = 0.9
    node_count: int = DEFAULT_NODES
    weight: int = DEFAULT_EXTENDER_WEIGHT
    extender_sees: str = "all"
    queue: str = "kube-1.20"  # time mode: a key of kubequeue.QUEUES
    backfill: BackfillSettings | None = None  # time mode: reservations with backfill (core/backfill.py); None: off
    movable_share: float = 0.0  # the share of GPU pods that may be moved (core/defrag.py); 0: none
    short_first: ShortFirstSettings | None = None  # time mode: shortest runs first (core/short_first.py); None: off
    declarations: str = "exact"  # time mode: what run each pod declares (declarations.py): "exact" or "users"


def trace_label(trace: str) -> str:
    if trace == EMBEDDED:
        return default_workload.TRACE_NAME
    stem = Path(trace).stem
    return stem.removeprefix("openb_pod_list_")


@cache
def _pods(trace: str) -> list[TracePod]:
    return default_workload.default_trace() if trace == EMBEDDED else load_pods(trace)


@cache
def _nodes(nodes: str) -> list[NodeSpec]:
    return default_workload.default_nodes() if nodes == EMBEDDED else load_nodes(nodes)


def run_job(job: Job) -> PackingResult | TimeResult:
    pods, nodes, label = _pods(job.trace), _nodes(job.nodes), trace_label(job.trace)
    if job.mode == "packing":
        return replay_packing(
            nodes, [p.request for p in pods], job.policy, job.scheduler, job.seed, label, weight=job.weight,
            extender_sees=job.extender_sees, movable_share=job.movable_share,
        )
    if job.mode == "time":
        return replay_time(
            nodes, pods, job.policy, job.scheduler, job.seed, job.load, job.node_count, label, weight=job.weight,
            extender_sees=job.extender_sees, timings=QUEUES[job.queue],
            backfill=job.backfill, movable_share=job.movable_share, short_first=job.short_first,
            declarations=job.declarations,
        )
    raise ValueError(f"unknown mode {job.mode!r}; known: packing, time")


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def run_jobs(jobs: list[Job], workers: int | None = None) -> Iterator[PackingResult | TimeResult]:
    """Results in completion order."""
    workers = min(workers or default_workers(), len(jobs)) or 1
    if workers == 1:
        for job in jobs:
            yield run_job(job)
        return
    # the longest jobs first keeps both cores busy to the end
    ordered = sorted(jobs, key=lambda j: j.policy not in ("fgd", "tessera"))
    # workers ignore Ctrl-C: the parent's KeyboardInterrupt leaves the `with`, which terminates them quietly (each
    # printed its own traceback)
    with get_context("fork").Pool(workers, initializer=_ignore_sigint) as pool:
        yield from pool.imap_unordered(run_job, ordered)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
