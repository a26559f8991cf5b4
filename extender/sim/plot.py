"""PNG plots of replay results (matplotlib, headless)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .packing import PackingResult
from .report import packing_curves
from .timemode import TimeResult
from .waits import class_order


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Each policy its own colour AND dash, the same in every panel and plot: with colour alone a
# line hid under another (tessera under fgd) and a reader without colour vision could not tell.
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
            "tab:olive", "tab:cyan")
_DASHES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2, 2, 2)), (0, (4, 2)),
           (0, (2, 3)))


def policy_styles(policies) -> dict[str, dict]:
    """policy -> matplotlib line keywords: distinct colour and dash; tessera drawn thick and on top."""
    out = {}
    policies = set(policies)
    others = sorted(policies - {"tessera"})
    for i, policy in enumerate(others):
        out[policy] = {"color": _COLOURS[i % len(_COLOURS)], "linestyle": _DASHES[(i + 1) % len(_DASHES)],
                       "linewidth": 1.6, "zorder": 3}
    if "tessera" in policies:
        out["tessera"] = {"color": "black", "linestyle": "-", "linewidth": 2.0, "zorder": 2}  # under the dashes: they show
    return dict(sorted(out.items()))


def packing_figure(results: list[PackingResult]):
    """Two rows per trace/scheduler: unallocated GPUs (the paper's metric) and GPUs not serving demand.

    The second row counts a GPU held by a pod that asked for less (k8s-default gives a 100 milli
    slice a whole GPU) as not serving: on the first row alone k8s-default looks best, because it
    allocates more than was asked. One legend, outside the panels, so it hides no curve.
    """
    plt = _pyplot()
    rows = (("unallocated_pct", "unallocated GPUs (%)"),
            ("unserved_pct", "GPUs not serving demand (%):\nunallocated + held beyond the request"))
    curves = {metric: packing_curves(results, metric=metric) for metric, _ in rows}
    groups = sorted({(t, s) for t, s, _ in curves["unallocated_pct"]})
    styles = policy_styles(p for _, _, p in curves["unallocated_pct"])
    fig, axes = plt.subplots(2, len(groups), figsize=(6.5 * len(groups), 8.0), squeeze=False, sharex=True)
    for col, (trace, sched) in enumerate(groups):
        for row, (metric, ylabel) in enumerate(rows):
            ax = axes[row][col]
            for (t, s, policy), c in sorted(curves[metric].items()):
                if (t, s) != (trace, sched):
                    continue
                xs = sorted(int(x) for x in c if int(x) >= 80)
                ax.plot(xs, [statistics.mean(c[str(x)]) for x in xs], label=policy, **styles[policy])
            if row == 0:
                ax.set_title(f"{trace}, {sched} scheduler")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if row == len(rows) - 1:
                ax.set_xlabel("arrived workload (% of GPU capacity)")
    handles = [plt.Line2D([], [], label=p, **{k: v for k, v in st.items() if k != "zorder"}) for p, st in styles.items()]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), title="policy", fontsize=9)
    fig.suptitle("top: unallocated GPUs (the FGD paper's metric); bottom: GPUs not serving demand "
                 "(a slice given a whole GPU counts here)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_packing(results: list[PackingResult], path: Path) -> Path:
    """The packing figure as a PNG (the legend outside the panels is kept: bbox_inches='tight')."""
    plt = _pyplot()
    fig = packing_figure(results)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_time(results: list[TimeResult], path: Path) -> Path:
    """The time-mode figure as a PNG."""
    plt = _pyplot()
    return _save(plt, time_figure(results), path)


def time_figure(results: list[TimeResult]):
    """Mean queueing delay vs offered load, one line per policy (and scheduler): one panel for all pods and
    one per pod class, each with its own scale, since 8-GPU pods wait hours where slices wait minutes."""
    plt = _pyplot()
    panels: dict[str, dict] = {"all pods": defaultdict(lambda: defaultdict(list))}
    for c in class_order(c for r in results for c in r.classes):
        panels[c] = defaultdict(lambda: defaultdict(list))
    for r in results:
        panels["all pods"][(r.scheduler, r.policy)][r.load].append(r.wait_mean_s / 60)
        for c, stats in r.classes.items():
            panels[c][(r.scheduler, r.policy)][r.load].append(stats.mean_s / 60)
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    styles = policy_styles(p for _, p in panels["all pods"])
    markers = {s: m for s, m in zip(sorted({s for s, _ in panels["all pods"]}), "osD^v", strict=False)}
    for ax, (title, by) in zip(axes.flat, panels.items(), strict=False):
        for (sched, policy), c in sorted(by.items()):
            loads = sorted(c)
            ax.plot(loads, [statistics.mean(c[x]) for x in loads], marker=markers.get(sched, "o"), markersize=3,
                    label=f"{policy} ({sched})", **styles[policy])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("offered GPU load (share of capacity)", fontsize=8)
        ax.set_ylabel("mean queueing delay (min)", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="policy (scheduler)")
    return fig


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
