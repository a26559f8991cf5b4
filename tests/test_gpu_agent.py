"""The node agent's pure parts: the static backend, cgroup attribution, out-of-band accounting, metrics, CLI."""

import json
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpu_sharing.cgroups import pod_uid_from_cgroup, pod_uid_of
from gpu_sharing.devices import BackendUnavailable, GpuDevice, GpuProcess, GpuSample
from gpu_sharing.metrics import AgentCollector, registry_for
from gpu_sharing.publish import current_state, desired_state, product_label
from gpu_sharing.static import StaticBackend
from gpu_sharing.usage import gpu_reports, slices_on_node

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
    (json.dumps({"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": 9, "healthy": "yes"}]}), "each GPU needs"),
])
def test_static_backend_refuses_bad_files_in_words(tmp_path, body, words):
    f = tmp_path / "inv.json"
    f.write_text(body)
    with pytest.raises(BackendUnavailable, match=words):
        StaticBackend(f)


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


def pod(name, uid, gpus, milli, phase="Running"):
    ann = {"tessera.dev/gpu-assignment": json.dumps({"node": "n", "gpus": gpus, "milli": milli, "uuids": []})}
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": ann}, "status": {"phase": phase}}


def test_out_of_band_memory_is_what_no_assignment_on_that_gpu_explains():
    devices = tuple(GpuDevice(i, f"GPU-{i}", "A100", 81920) for i in range(2))
    samples = (
        GpuSample(0, 80.0, 30000, (GpuProcess(1, 10000, "u-a"), GpuProcess(2, 5000, ""), GpuProcess(3, 3000, "u-b"))),
        GpuSample(1, 10.0, 2000, (GpuProcess(4, 2000, "u-b"),)),
    )
    slices = slices_on_node([pod("a", "u-a", [0], 500), pod("b", "u-b", [1], 250), pod("done", "u-c", [0], 500, "Succeeded")])
    r = gpu_reports(devices, samples, slices)
    # GPU 0: a's 10000 is its slice; the host process (5000) and b straying onto GPU 0 (3000) are out-of-band
    assert r[0].oob_memory_mib == 8000 and r[0].oob_published_mib == 8192
    assert [(s.pod, s.milli, s.used_mib) for s in r[0].slices] == [("ml/a", 500, 10000)]
    assert r[1].oob_memory_mib == 0 and [(s.pod, s.used_mib) for s in r[1].slices] == [("ml/b", 2000)]


def test_desired_state_is_the_extenders_contract():
    devices = (GpuDevice(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 81920), GpuDevice(1, "GPU-1", "NVIDIA A100-SXM4-80GB", 81920,
                                                                               healthy=False, health_reason="XID 48"))
    r = gpu_reports(devices, (GpuSample(0, 0.0, 700, (GpuProcess(9, 700),)),), ())
    want = desired_state(r)
    assert want.product == "NVIDIA-A100-SXM4-80GB" and want.milli == 1000
    from extender.kube.contract import node_inventory

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


def test_metrics_show_per_gpu_and_per_slice_figures():
    devices = (GpuDevice(0, "GPU-0", "T4", 15360),)
    r = gpu_reports(devices, (GpuSample(0, 42.0, 3000, (GpuProcess(1, 1024, "u-a"), GpuProcess(2, 512, ""))),),
                    slices_on_node([pod("a", "u-a", [0], 300)]))
    c = AgentCollector("node-1")
    c.update(r)
    text = generate_latest(registry_for(c)).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    gpu = (("gpu", "0"), ("model", "T4"), ("node", "node-1"), ("uuid", "GPU-0"))
    pod_labels = (("gpu", "0"), ("namespace", "ml"), ("node", "node-1"), ("pod", "a"), ("uuid", "GPU-0"))
    assert got[("tessera_gpu_utilization_ratio", gpu)] == 0.42
    assert got[("tessera_gpu_memory_used_bytes", gpu)] == 3000 * 2**20
    assert got[("tessera_gpu_memory_total_bytes", gpu)] == 15360 * 2**20
    assert got[("tessera_gpu_out_of_band_memory_bytes", gpu)] == 512 * 2**20
    assert got[("tessera_gpu_healthy", gpu)] == 1.0
    assert got[("tessera_slice_milli", pod_labels)] == 300
    assert got[("tessera_slice_memory_used_bytes", pod_labels)] == 2**30


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
