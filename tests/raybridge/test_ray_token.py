"""A job's Ray cluster refuses every process without the job's token (Ray 2.60 token auth).

What keeps one job's code off another job's actors, objects and checkpoints in memory: each job's
Ray cluster has its own token (the job's Secret), so a hostile entrypoint in another job, holding
its own token, cannot connect. Run in subprocesses: Ray's auth mode is fixed per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from raybridge.raycluster import ray_missing

pytestmark = pytest.mark.ray

HEAD = """
import os, subprocess, sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False,
                  object_store_memory=80 * 1024 * 1024))
probe = "import ray; ray.init(address=%r, log_to_driver=False); print('CONNECTED', flush=True)" % cluster.address
for label, token in (("own", os.environ["RAY_AUTH_TOKEN"]), ("other job's", "o" * 64), ("none", None)):
    env = dict(os.environ)
    if token is None:
        env.pop("RAY_AUTH_TOKEN"); env["RAY_AUTH_MODE"] = "disabled"
    else:
        env["RAY_AUTH_TOKEN"] = token
    try:
        p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=45,
                           start_new_session=True)
        ok = "CONNECTED" in p.stdout
    except subprocess.TimeoutExpired:
        ok = False
    print(f"RESULT {label}: {'connected' if ok else 'refused'}", flush=True)
cluster.shutdown()
"""


def test_a_jobs_ray_cluster_refuses_other_tokens_and_none():
    missing = ray_missing()
    if missing:
        pytest.skip(missing)
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="j" * 64, RAY_USAGE_STATS_ENABLED="0",
               RAY_TMPDIR=tempfile.mkdtemp(prefix="rbt", dir="/tmp"))
    p = subprocess.run([sys.executable, "-c", HEAD], env=env, capture_output=True, text=True, timeout=300)
    results = dict(line.removeprefix("RESULT ").split(": ") for line in p.stdout.splitlines() if line.startswith("RESULT"))
    assert results == {"own": "connected", "other job's": "refused", "none": "refused"}, p.stdout[-2000:] + p.stderr[-2000:]
