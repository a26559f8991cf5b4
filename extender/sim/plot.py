"""PNG plots of replay results (matplotlib, headless)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .packing import PackingResult
from .report import packing_curves
from .timemode import TimeResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_packing(results: list[PackingResult], path: Path) -> Path:
    """Unallocated GPUs vs arrived workload, one line per policy, one panel per trace/scheduler."""
    plt = _pyplot()
    curves = packing_curves(results)
    unserved = packing_curves(results, metric="unserved_pct")
    groups = sorted({(t, s) for t, s, _ in curves})
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (trace, sched) in zip(axes[0], groups, strict=False):
        for (t, s, policy), c in sorted(curves.items()):
            if (t, s) != (trace, sched):
                continue
            xs = sorted(int(x) for x in c if int(x) >= 80)
            line = ax.plot(xs, [statistics.mean(c[str(x)]) for x in xs], label=policy, linewidth=1.5)[0]
            u = unserved.get((t, s, policy), {})
            if u.get("100") and abs(statistics.mean(u["100"]) - statistics.mean(c["100"])) > 0.5:
                # k8s-default holds a whole GPU for a slice: show what does not serve demand too
                ax.plot(xs, [statistics.mean(u[str(x)]) for x in xs], linestyle="--", color=line.get_color(),
                        label=f"{policy}: not serving demand", linewidth=1.2)
        ax.set_title(f"{trace}, {sched} scheduler")
        _label(ax, "arrived workload (% of GPU capacity)", "unallocated GPUs (%)")
    return _save(plt, fig, path)


def plot_time(results: list[TimeResult], path: Path) -> Path:
    """Mean queueing delay vs offered load, one line per policy."""
    plt = _pyplot()
    by = defaultdict(lambda: defaultdict(list))
    for r in results:
        by[(r.scheduler, r.policy)][r.load].append(r.wait_mean_s / 60)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (sched, policy), c in sorted(by.items()):
        loads = sorted(c)
        ax.plot(loads, [statistics.mean(c[x]) for x in loads], marker="o", label=f"{policy} ({sched})")
    _label(ax, "offered GPU load (share of capacity)", "mean queueing delay (min)")
    return _save(plt, fig, path)


def _label(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
