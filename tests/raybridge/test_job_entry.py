"""The job-side entries: a member pod's Ray node advertises only its own assignment, and no job
starts an open Ray cluster (token auth is required)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from raybridge.contract import ContractError, Slice
from raybridge.job import head_command, main, member_command
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


TRAIN = ["train", "--entrypoint", "raybridge.examples.resnet:build"]


@pytest.mark.parametrize("flags, words", [
    (["--world", "1", "--config", "notjson"], "--config: not JSON: 'notjson'"),  # was a JSONDecodeError traceback
    (["--world", "1", "--config", "[]"], "--config must be a JSON object"),  # was a ValueError traceback
    (["--world", "1", "--config", '{"steps": 0}'], "--config: steps must be a whole number of at least 1, got '0'"),
    (["--world", "0"], "--world must be at least 1 (one trainer per Ray node), got 0"),  # was taken
    (["--world", "-2"], "--world must be at least 1"),
    (["--world", "1", "--entrypoint", "no-colon"], "--entrypoint must be 'package.module:function', got 'no-colon'"),
])
def test_train_refuses_bad_flags_in_one_line_before_ray_is_imported(flags, words, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises: the checks run without it
    assert main([*TRAIN, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybridge.job: ") and words in err and err.count("\n") == 1, err


def fake_ray(nodes=(), refuse=None):
    """What _train asks of Ray: init (joining, or ConnectionError as Ray says it) and the cluster's nodes."""
    def init(**kwargs):
        if refuse:
            raise ConnectionError(refuse)
        joined.append(kwargs["address"])
    joined: list[str] = []
    return types.SimpleNamespace(init=init, nodes=lambda: list(nodes), is_initialized=lambda: bool(joined), joined=joined)


def test_train_with_no_address_joins_a_running_cluster_and_never_starts_one(monkeypatch, capsys):
    ray = fake_ray([{"NodeID": "a", "Alive": True, "Resources": {"CPU": 4.0}}])  # no tessera-node:<name>
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main([*TRAIN, "--world", "2"]) == 1
    assert ray.joined == ["auto"]  # ray.init(address=None) would have started a local Ray when none runs
    err = capsys.readouterr().err  # was a ValueError traceback
    assert err.startswith("raybridge.job: the Ray cluster has 0 nodes advertising tessera-node:<name>, the job wants 2")
    assert err.count("\n") == 1


def test_train_says_in_one_line_that_there_is_no_ray_cluster(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", fake_ray(refuse="Could not find any running Ray instance.\nmore detail"))
    assert main([*TRAIN, "--world", "1"]) == 1
    assert capsys.readouterr().err == ("raybridge.job: no Ray cluster to join at $RAY_ADDRESS or on this machine: "
                                       "Could not find any running Ray instance.\n")


def test_train_help_says_where_it_looks_for_a_cluster(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "none is started" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("listen", ["99999", "0.0.0.0:0", "host:port", ":9600"])
def test_the_driver_refuses_a_bad_metrics_listener_before_it_starts_ray(listen, monkeypatch, capsys):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("the Ray head was started"))
    with pytest.raises(SystemExit) as e:
        main(["driver", "--gang", "g", "--metrics-listen", listen])
    assert e.value.code == 2 and "--metrics-listen: wants HOST:PORT" in capsys.readouterr().err


def test_the_drivers_job_metrics_are_served_over_http():
    """The job's controller keeps its tessera_ray_job_* series in the registry the driver serves (they were kept in a
    registry nothing served, so on a cluster only the progress annotation showed them)."""
    import socket
    import urllib.request

    from raybridge.metrics import JobMetrics, serve_metrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = JobMetrics()
    metrics.step.labels("ml/resnet").set(42)
    metrics.set_phase("ml/resnet", "Running")
    serve_metrics(metrics.registry, f"127.0.0.1:{port}")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'tessera_ray_job_step{job="ml/resnet"} 42.0' in body
    assert 'tessera_ray_job_phase{job="ml/resnet",phase="Running"} 1.0' in body
