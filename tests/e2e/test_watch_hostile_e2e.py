"""A few hundred hostile pods and nodes through the real watch against the real apiserver (bench/watch_fuzz.py).

The bench's 10,000-object run is in docs/reliability.md; this keeps its bar in CI: the extender stays
ready and synced, every legit pod is counted on exactly its GPUs, deleted ones are released, no GPU
is over 1000 milli, and the hostile objects that reached the watch are recorded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "watch_fuzz.py"


def _bench():
    spec = importlib.util.spec_from_file_location("watch_fuzz", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["watch_fuzz"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_hostile_objects_through_the_real_watch_lose_no_pod_and_no_gpu(cluster):
    wf = _bench()
    fz = wf.Fuzzer(cluster["api"], cluster["extender"], seed=7, namespace="watch-fuzz-e2e", prefix="wfe-")
    fz.setup()
    try:
        f = fz.run(objects=300, threads=4)
        print(wf.report(f, 300))
        assert not f.problems, f.problems
        assert f.legit_pods > 5 and f.legit_deleted > 0 and f.accepted > 50
        assert sum(f.extra["bad_total"].values()) > 20, "hostile objects reached the watch and none was recorded"
        assert set(f.readyz) <= {200}, f.readyz  # sampled every 0.5 s while sending
    finally:
        fz.cleanup()
