"""Tables of replay results: what `tessera simulate` prints and bench/openb.py reuses."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from .packing import REPORT_POINTS, PackingResult
from .timemode import TimeResult
from .waits import class_order


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def packing_curves(results: Iterable[PackingResult], metric: str = "unallocated_pct") -> dict[tuple[str, str, str], dict]:
    """(trace, scheduler, policy) -> arrived percent -> per-seed values of `metric` (unallocated %)."""
    curves: dict = defaultdict(lambda: defaultdict(list))
    for r in results:
        for x, v in getattr(r, metric).items():
            curves[(r.trace, r.scheduler, r.policy)][x].append(v)
    return curves


def packing_table(results: list[PackingResult], points=REPORT_POINTS) -> str:
    """Unallocated GPUs (held, the paper's metric) per arrived point; `unserved@100` also counts a
    GPU held by a pod that asked for less (k8s-default gives a slice a whole GPU) as not serving."""
    curves = packing_curves(results)
    unserved = defaultdict(list)
    for r in results:
        if "100" in r.unserved_pct:
            unserved[(r.trace, r.scheduler, r.policy)].append(r.unserved_pct["100"])
    lines = []
    groups = sorted({(t, s) for t, s, _ in curves})
    for trace, sched in groups:
        policies = [p for t, s, p in curves if (t, s) == (trace, sched)]
        seeds = max(len(curves[(trace, sched, p)].get("100", [])) for p in policies)
        lines.append(f"\nUnallocated GPUs (% of capacity) vs arrived workload: trace {trace}, scheduler {sched}, {seeds} seed(s)")
        lines.append(f"{'policy':<12}" + "".join(f"{x:>7}%" for x in points) + f"{'sd@100':>8}{'unserved@100':>14}")
        rows = []
        for p in policies:
            c = curves[(trace, sched, p)]
            means = [statistics.mean(c[str(x)]) if c.get(str(x)) else float("nan") for x in points]
            sd = _mean_sd(c["100"])[1] if c.get("100") else float("nan")
            u = unserved.get((trace, sched, p))
            rows.append((u and statistics.mean(u), p, means, sd))
        for u, p, means, sd in sorted(rows, key=lambda r: (r[0] is None, r[0] or 0)):
            lines.append(f"{p:<12}" + "".join(f"{m:8.2f}" for m in means) + f"{sd:8.2f}" + (f"{u:14.2f}" if u else ""))
    lines.extend(moves_table(results))
    return "\n".join(lines)


def moves_table(results: list[PackingResult]) -> list[str]:
    """With a movable share: per (trace, scheduler, policy), the moves made and pods placed thanks to them
    (means per seed) beside unallocated at 100% arrived; nothing when no run moved anything."""
    by = defaultdict(list)
    for r in results:
        if r.defrag is not None:
            by[(r.trace, r.scheduler, r.policy)].append(r)
    if not by:
        return []
    w = max(len(trace) for trace, _, _ in by) + 2
    lines = ["\nMoves of movable pods (core/defrag.py), means per seed",
             f"{'trace':<{w}}{'scheduler':<10}{'policy':<12}{'movable':>8}{'moves':>8}{'placed':>8}{'unalloc@100':>13}"]
    for (trace, sched, policy), rs in sorted(by.items()):
        m = {k: statistics.mean(r.defrag[k] for r in rs) for k in ("movable_share", "moves", "placed_by_moves")}
        unalloc = statistics.mean(r.unallocated_pct["100"] for r in rs if "100" in r.unallocated_pct)
        lines.append(f"{trace:<{w}}{sched:<10}{policy:<12}{m['movable_share']:>8.2f}{m['moves']:>8.1f}"
                     f"{m['placed_by_moves']:>8.1f}{unalloc:>13.2f}")
    return lines


def time_table(results: list[TimeResult]) -> str:
    """Waits over all pods with the GPU shares (time-averaged over the arrival window), then waits per pod
    class; each figure the mean over seeds of the per-seed figure."""
    by = defaultdict(list)
    for r in results:
        by[(r.trace, r.scheduler, r.load, r.policy)].append(r)
    lines = []
    for trace, sched in sorted({(k[0], k[1]) for k in by}):
        keys = sorted(k for k in by if k[:2] == (trace, sched))
        seeds = max(len(by[k]) for k in keys)
        lines.append(f"\nQueueing delay and GPU allocation vs offered load: trace {trace}, scheduler {sched}, {seeds} seed(s)")
        lines.append(
            f"{'load':>5} {'policy':<12}{'wait mean':>11}{'p50':>9}{'p99':>9}{'max':>9}{'GPU alloc%':>11}{'served%':>9}"
        )
        for key in keys:
            rs = by[key]
            m = {f: statistics.mean(getattr(r, f) for r in rs) for f in (
                "wait_mean_s", "wait_p50_s", "wait_p99_s", "wait_max_s", "gpu_alloc_mean_pct", "gpu_served_mean_pct")}
            lines.append(
                f"{key[2]:>5.2f} {key[3]:<12}{_dur(m['wait_mean_s']):>11}{_dur(m['wait_p50_s']):>9}"
                f"{_dur(m['wait_p99_s']):>9}{_dur(m['wait_max_s']):>9}{m['gpu_alloc_mean_pct']:>11.1f}{m['gpu_served_mean_pct']:>9.1f}"
            )
        lines.extend(_class_rows(by, keys))
        lines.extend(_time_moves(by, keys))
        lines.extend(_time_short_first(by, keys))
    return "\n".join(lines)


def _time_short_first(by: dict, keys: list) -> list[str]:
    """With shortest runs first: its settings, and per (load, policy) the attempts of held pods that found no node, per seed."""
    keys = [k for k in keys if all(r.short_first is not None for r in by[k])]
    if not keys:
        return []
    rule = by[keys[0]][0].short_first
    lines = [f"\nShortest runs first (core/short_first.py): longer runs kept off the nodes where a shorter one fits while "
             f"more than {rule['waiting']} GPU pods of at most {rule['run_s']:.0f} s wait, each for at most "
             f"{rule['max_hold_s']:.0f} s; attempts of held pods that found no node, mean per seed",
             f"{'load':>5} {'policy':<12}{'held':>10}"]
    for key in keys:
        lines.append(f"{key[2]:>5.2f} {key[3]:<12}{statistics.mean(r.short_first['attempts_held'] for r in by[key]):>10.0f}")
    return lines


def _time_moves(by: dict, keys: list) -> list[str]:
    """With a movable share: per (load, policy), moves made and pods placed thanks to them per seed, and trainer time lost."""
    keys = [k for k in keys if all(r.defrag is not None for r in by[k])]
    if not keys:
        return []
    lines = ["\nMoves of movable pods (core/defrag.py), means per seed",
             f"{'load':>5} {'policy':<12}{'movable':>8}{'moves':>8}{'placed':>8}{'trainer-s lost/move':>21}"]
    for key in keys:
        m = {f: statistics.mean(r.defrag[f] for r in by[key]) for f in
             ("movable_share", "moves", "placed_by_moves", "trainer_s_per_move")}
        lines.append(f"{key[2]:>5.2f} {key[3]:<12}{m['movable_share']:>8.2f}{m['moves']:>8.1f}{m['placed_by_moves']:>8.1f}"
                     f"{m['trainer_s_per_move']:>21.0f}")
    return lines


def _class_rows(by: dict, keys: list) -> list[str]:
    """One row per (load, policy, pod class): pods per seed and the wait statistics."""
    lines = ["\nWaits per pod class (cpu: no GPU; slice: under 1000 milli of one GPU; <n>gpu: n whole GPUs)",
             f"{'load':>5} {'policy':<12}{'class':<7}{'pods':>6}{'mean':>9}{'p50':>9}{'p99':>9}{'max':>9}"]
    for key in keys:
        rs = by[key]
        for c in class_order(c for r in rs for c in r.classes):
            stats = [r.classes[c] for r in rs if c in r.classes]
            m = {f: statistics.mean(getattr(s, f) for s in stats) for f in ("pods", "mean_s", "p50_s", "p99_s", "max_s")}
            lines.append(f"{key[2]:>5.2f} {key[3]:<12}{c:<7}{m['pods']:>6.0f}{_dur(m['mean_s']):>9}{_dur(m['p50_s']):>9}"
                         f"{_dur(m['p99_s']):>9}{_dur(m['max_s']):>9}")
    return lines


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
