"""bench/load.py's machinery, briefly: a few seconds of load and the 1000 concurrent binds over real HTTP.

The 60-s figures come from the bench itself (docs/reliability.md); this only keeps it working and keeps
its correctness bar in CI: no errors, every one of 1000 simultaneous binds answered, no GPU over 1000 milli.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "load.py"


def test_short_load_and_1000_concurrent_binds_over_loopback():
    run = subprocess.run([sys.executable, str(BENCH), "--seconds", "3", "--baseline-seconds", "0", "--nodes", "40",
                          "--clients", "4", "--lifetime", "1"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's, not the install's
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "1000 concurrent binds onto 4 nodes" in out and ", 0 other;" in out and "GPUs over 1000 milli 0" in out, out
    bound = int(out.split("1000 concurrent binds onto 4 nodes in ")[1].split(": ")[1].split(" bound")[0])
    assert 0 < bound < 1000  # 4 nodes cannot take 1000 pods: both outcomes happened
