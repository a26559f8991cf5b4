"""The README's "two commands" table is what its command prints (issue 16, item 6).

Before, the README quoted the openb trace's figures right after the embedded run a newcomer makes,
which prints other numbers. This replays the embedded workload for the README's rows and compares.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from extender.sim.runner import EMBEDDED, Job, run_job

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_rows() -> dict[str, tuple[float, float, float]]:
    text = README.read_text()
    section = text[text.index("## The two commands"):text.index("## What is here")]
    return {m[1]: (float(m[2]), float(m[3]), float(m[4]))
            for m in re.finditer(r"^\| `([\w-]+)` \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", section, re.M)}


def test_the_readme_table_is_there():
    assert set(readme_rows()) == {"tessera", "fgd", "bestfit", "k8s-default"}


@pytest.mark.slow
def test_the_readme_figures_are_what_tessera_simulate_prints():
    for policy, (ideal, kube, unserved) in readme_rows().items():
        runs = {s: [run_job(Job(trace=EMBEDDED, nodes=EMBEDDED, policy=policy, scheduler=s, seed=seed)) for seed in (42, 43)]
                for s in ("ideal", "kube")}
        got = (statistics.mean(r.unallocated_pct["100"] for r in runs["ideal"]),
               statistics.mean(r.unallocated_pct["100"] for r in runs["kube"]),
               statistics.mean(r.unserved_pct["100"] for r in runs["ideal"]))
        assert [round(g, 2) for g in got] == [ideal, kube, unserved], policy
