"""The job-side entries: a member pod's Ray node advertises only its own assignment, and no job
starts an open Ray cluster (token auth is required)."""

from __future__ import annotations

import json

import pytest

from raybridge.contract import ContractError, Slice
from raybridge.job import head_command, member_command
from raybridge.placement import trainer_options

TOKEN = "t" * 40


def env(**extra):
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "TESSERA_RAY_HEAD": "job-head.ml.svc:6379",
            "POD_NAME": "train-0", "POD_NAMESPACE": "ml", "POD_IP": "10.0.0.7",
            "TESSERA_GPU_ASSIGNMENT": json.dumps({"node": "n1", "gpus": [2, 3], "milli": 1000}), **extra}


def test_a_member_advertises_its_own_pod_and_its_assigned_gpus_only():
    cmd = member_command(env())
    res = json.loads(next(a for a in cmd if a.startswith("--resources=")).split("=", 1)[1])
    assert res == {"tessera-pod:ml.train-0": 1000.0}
    assert "--num-gpus=2" in cmd and "--address=job-head.ml.svc:6379" in cmd and "--block" in cmd
    assert "--node-ip-address=10.0.0.7" in cmd
    opts = trainer_options(Slice("n1", (2, 3), 1000, (), pod="ml/train-0"))
    assert opts["resources"] == {"tessera-pod:ml.train-0": 1.0} and opts["num_gpus"] == 2


@pytest.mark.parametrize("bad", [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_TOKEN": "short"}, {"RAY_AUTH_TOKEN": ""}])
def test_no_open_ray_cluster_is_started(bad):
    with pytest.raises(ContractError, match="RAY_AUTH_TOKEN"):
        member_command(env(**bad))
    with pytest.raises(ContractError, match="RAY_AUTH_TOKEN"):
        head_command(env(**bad))


def test_the_head_has_no_dashboard():
    cmd = head_command(env())
    assert "--include-dashboard=false" in cmd and "--num-gpus=0" in cmd
