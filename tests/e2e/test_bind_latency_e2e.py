"""bench/bind_latency.py, run small against its own control plane: it keeps working, every pod it schedules through
`tessera serve` is really bound (the Binding back through the watch), and the extender's breakdown reaches the report.
The figures come from the bench itself at 5000 nodes (issue 38)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .harness import skip_without_control_plane

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bind_latency.py"


def test_a_small_run_binds_every_pod_and_reports_the_breakdown():
    skip_without_control_plane()
    run = subprocess.run([sys.executable, str(BENCH), "--nodes", "30", "--pods", "10", "--warm", "2"],
                         capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "30 nodes x 8 GPUs created" in out, out
    for label in ("r1-tessera", "r1-null"):
        line = next(x for x in out.splitlines() if x.startswith(label))
        assert "bound 10/10" in line and "bind errors" not in line, out
    assert "tessera's own breakdown over all pods" in out and "the 10 slowest" in out, out
    assert "tessera serve RSS at the end" in out, out
