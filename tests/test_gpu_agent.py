"""The node agent's pure parts: the static backend, cgroup attribution, out-of-band accounting, metrics, CLI."""

import json
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extender.kube.node_writer import GpuVerdict, current_state, desired_state, product_label
from gpu_sharing.cgroups import pod_uid_from_cgroup, pod_uid_of
from gpu_sharing.devices import BackendUnavailable, GpuDevice, GpuProcess, GpuSample
from gpu_sharing.metrics import AgentCollector, registry_for
from gpu_sharing.static import StaticBackend
from gpu_sharing.usage import gpu_reports, report_document

UID = "0b5c9c4e-2f71-4f3b-9d55-5f7c3c1d8f1a"


def write(path, body):
    path.write_text(json.dumps(body))
    return path


def two_gpus(extra=None):
    extra = extra or {}
    return {"gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, **extra.get(i, {})}
                     for i in range(2)]}


def test_static_backend_reads_devices_and_samples_and_rereads_on_change(tmp_path):
    f = write(tmp_path / "inv.json", two_gpus({1: {"processes": [{"pid": 7, "used_mib": 4096}], "utilization_pct": 50}}))
    b = StaticBackend(f)
    assert [d.uuid for d in b.inventory()] == ["GPU-0", "GPU-1"]
    assert b.sample()[1] == GpuSample(1, 50.0, 4096, (GpuProcess(7, 4096, ""),))
    write(f, two_gpus({0: {"healthy": False, "health_reason": "XID 79"}, 1: {}}))
    assert [(d.healthy, d.health_reason) for d in b.inventory()] == [(False, "XID 79"), (True, "")]


def test_static_backend_reads_yaml(tmp_path):
    f = tmp_path / "inv.yaml"
    f.write_text("gpus:\n- {index: 0, uuid: GPU-0, model: T4, memory_mib: 15360}\n")
    assert StaticBackend(f).inventory() == (GpuDevice(0, "GPU-0", "T4", 15360),)


@pytest.mark.parametrize("body, words", [
    ("{", "not valid JSON"),
    (json.dumps({"gpus": [{"index": 0}]}), "each GPU needs"),
    (json.dumps({"gpus": [{"index": 1, "uuid": "u", "model": "m", "memory_mib": 1}]}), "0..n-1"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 0}]}), "positive"),
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 9, "healthy": "yes"}]}), "healthy must be"),
])
def test_static_backend_refuses_bad_files_in_words(tmp_path, body, words):
    f = tmp_path / "inv.json"
    f.write_text(body)
    with pytest.raises(BackendUnavailable, match=words):
        StaticBackend(f)


def one_gpu(**extra):
    return json.dumps({"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": 15360, **extra}]})


@pytest.mark.parametrize("body, words", [
    ('{"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": Infinity}]}',
     r"gpus\[0\]: memory_mib must be a finite number, got inf$"),  # was an OverflowError traceback
    ('{"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": 15360, "utilization_pct": NaN}]}',
     "utilization_pct must be a finite number"),
    (one_gpu(utilization_pct=101), "utilization_pct must be 0..100"),
    (one_gpu(memory_used_mib=15361), r"memory used \(15361 MiB\) is more than memory_mib \(15360\)"),
    (one_gpu(processes=[{"pid": 1, "used_mib": 10**400}]), "used_mib must be a finite number"),
    (one_gpu(uuid=""), "uuid must not be empty"),
    (one_gpu(model=" "), "model must not be empty"),
    (one_gpu(uuid=None), "uuid must not be empty"),
    (json.dumps({"gpus": [{"index": i, "uuid": "GPU-0", "model": "T4", "memory_mib": 9} for i in range(2)]}),
     "GPUs 0 and 1 have the same uuid 'GPU-0'"),
    ("{}", r'wants \{"gpus": \[...\]\}, a list of GPUs'),  # was "each GPU needs ... (KeyError('gpus'))"
    ("[]", r'wants \{"gpus"'),
    ('{"gpus": [7]}', r"gpus\[0\]: each GPU, and each of its processes, is a JSON object"),
    (json.dumps({"gpus": [{"index": 0, "model": "T4", "memory_mib": 9}]}), "gpus\\[0\\] has no 'uuid'; each GPU needs"),
])
def test_static_backend_refuses_what_no_gpu_has_in_one_line_naming_the_file(tmp_path, body, words):
    f = tmp_path / "inv.json"
    f.write_text(body)
    with pytest.raises(BackendUnavailable, match=words) as e:
        StaticBackend(f)
    assert str(e.value).startswith(f"inventory file {f}: ") and "\n" not in str(e.value)


def test_agent_with_a_bad_inventory_says_so_in_one_line_and_serves_nothing(tmp_path, capsys):
    from extender.cli import main

    f = tmp_path / "inv.json"
    f.write_text('{"gpus": [{"index": 0, "uuid": "GPU-0", "model": "T4", "memory_mib": Infinity}]}')
    assert main(["agent", "--node-name", "n1", "--inventory", str(f), "--metrics-listen", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err == f"tessera agent: inventory file {f}: gpus[0]: memory_mib must be a finite number, got inf\n"


def test_missing_inventory_file_is_refused(tmp_path):
    with pytest.raises(BackendUnavailable, match="No such file"):
        StaticBackend(tmp_path / "nope.json")


@pytest.mark.parametrize("text", [
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-ab.scope",
    f"12:memory:/kubepods/burstable/pod{UID}/0123abcd\n11:cpu:/kubepods/burstable/pod{UID}/0123abcd",
    f"0::/kubepods/besteffort/pod{UID}",
])
def test_pod_uid_comes_from_the_cgroup_path_of_either_driver(text):
    assert pod_uid_from_cgroup(text) == UID


def test_a_process_outside_any_pod_has_no_pod_uid(tmp_path):
    assert pod_uid_from_cgroup("0::/system.slice/ssh.service") == ""
    assert pod_uid_from_cgroup("0::/user.slice/user-1000.slice/podman-foo.scope") == ""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/c\n")
    assert pod_uid_of(42, tmp_path) == UID and pod_uid_of(43, tmp_path) == ""


def test_the_report_gives_memory_per_pod_uid_and_of_processes_in_no_pod():
    devices = tuple(GpuDevice(i, f"GPU-{i}", "A100", 81920) for i in range(2))
    samples = (
        GpuSample(0, 80.0, 30000, (GpuProcess(1, 10000, "u-a"), GpuProcess(2, 5000, ""), GpuProcess(3, 3000, "u-b"),
                                   GpuProcess(4, 1000, "u-a"))),
        GpuSample(1, 10.0, 2000, (GpuProcess(5, 2000, "u-b"),)),
    )
    r = gpu_reports(devices, samples)
    # the agent judges nothing: it adds up per pod, and keeps the host's processes apart
    assert r[0].pod_memory_mib == (("u-a", 11000), ("u-b", 3000)) and r[0].unattributed_mib == 5000
    assert r[1].pod_memory_mib == (("u-b", 2000),) and r[1].unattributed_mib == 0
    doc = json.loads(report_document("node-1", r))
    assert doc["version"] == 1 and [g["pods"] for g in doc["gpus"]] == [{"u-a": 11000, "u-b": 3000}, {"u-b": 2000}]
    assert [(g["index"], g["uuid"], g["memory_mib"], g["unattributed_mib"]) for g in doc["gpus"]] == [
        (0, "GPU-0", 81920, 5000), (1, "GPU-1", 81920, 0)]


def test_desired_state_is_the_extenders_contract():
    devices = (GpuDevice(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 81920), GpuDevice(1, "GPU-1", "NVIDIA A100-SXM4-80GB", 81920,
                                                                               healthy=False, health_reason="XID 48"))
    r = (GpuVerdict(devices[0], 700), GpuVerdict(devices[1], 0))
    want = desired_state(r)
    assert want.product == "NVIDIA-A100-SXM4-80GB" and want.milli == 1000
    from extender.translate.objects import node_inventory

    node = {"metadata": {"name": "n", "annotations": {"tessera.dev/gpu-inventory": want.inventory}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}}
    inv = node_inventory(node)
    assert inv.spec.gpu_model == "NVIDIA-A100-SXM4-80GB" and inv.spec.gpu_count == 2
    assert inv.spec.gpu_reserved == (10, 1000)  # 768 MiB published (256 MiB steps) of 81920 -> 10 milli; unhealthy -> all
    assert desired_state(r, existing_product="A100").product == "A100"  # a label already there names the model
    node["metadata"]["labels"] = {"nvidia.com/gpu.product": want.product}
    node["status"]["capacity"] = {"tessera.dev/gpu-milli": "1k"}  # as the apiserver canonicalises it
    assert current_state(node) == want


def test_product_label_is_a_valid_label_value():
    assert product_label("  NVIDIA GeForce RTX 4090 (rev a1) ") == "NVIDIA-GeForce-RTX-4090-rev-a1"
    assert len(product_label("x" * 100)) == 63


def test_metrics_show_per_gpu_and_per_pod_figures():
    devices = (GpuDevice(0, "GPU-0", "T4", 15360),)
    r = gpu_reports(devices, (GpuSample(0, 42.0, 3000, (GpuProcess(1, 1024, UID), GpuProcess(2, 512, ""))),))
    c = AgentCollector("node-1")
    c.update(r)
    text = generate_latest(registry_for(c)).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    gpu = (("gpu", "0"), ("model", "T4"), ("node", "node-1"), ("uuid", "GPU-0"))
    assert got[("tessera_gpu_utilization_ratio", gpu)] == 0.42
    assert got[("tessera_gpu_memory_used_bytes", gpu)] == 3000 * 2**20
    assert got[("tessera_gpu_memory_total_bytes", gpu)] == 15360 * 2**20
    assert got[("tessera_gpu_unattributed_memory_bytes", gpu)] == 512 * 2**20
    assert got[("tessera_gpu_healthy", gpu)] == 1.0
    pod_labels = (("gpu", "0"), ("node", "node-1"), ("pod_uid", UID), ("uuid", "GPU-0"))
    assert got[("tessera_gpu_pod_memory_used_bytes", pod_labels)] == 2**30


def test_agent_without_a_driver_says_so_in_one_line_and_exits_nonzero():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here: the no-driver path cannot be shown")
    except pynvml.NVMLError:
        pass
    done = subprocess.run([sys.executable, "-m", "extender.cli", "agent", "--node-name", "n"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessera agent: no GPU driver:") and "--inventory" in lines[0]


@pytest.mark.parametrize("interval", ["0", "-5", "nan", "inf"])
def test_agent_refuses_an_interval_that_is_not_a_positive_number_of_seconds(interval, capsys):
    from extender.cli import main

    assert main(["agent", "--node-name", "n", "--interval", interval]) != 0
    assert f"--interval must be 0.1 to 86400 seconds, got {float(interval)}" in capsys.readouterr().err


@pytest.mark.parametrize("interval", ["1e-9", "0.05", "1e10"])
def test_agent_refuses_an_interval_that_would_spin_or_overflow(interval, tmp_path, capsys, monkeypatch):
    from extender.cli import main

    monkeypatch.setattr("gpu_sharing.agent.make_server", lambda *a: pytest.fail("the agent started"))
    f = write(tmp_path / "inv.json", two_gpus())  # a valid node: only the interval is wrong
    assert main(["agent", "--node-name", "n", "--inventory", str(f), "--interval", interval]) == 2
    assert capsys.readouterr().err == f"tessera: --interval must be 0.1 to 86400 seconds, got {float(interval)}\n"
