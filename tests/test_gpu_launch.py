"""tessera-launch and gpu_sharing.apply() in real processes: the environment and the PyTorch cap match the assignment."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_sharing.apply import apply
from gpu_sharing.assignment import AssignmentError, parse_podinfo, read_assignment

LAUNCH = [sys.executable, "-m", "gpu_sharing.launch"]
SHOW = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
SLICE = {"node": "n1", "gpus": [1], "milli": 250, "uuids": ["GPU-5e1f0c2a-0000-4000-8000-000000000001"]}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def launch(env_extra, command=SHOW, args=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "CUDA_", "NVIDIA_"))}
    env.update(env_extra, TESSERA_PODINFO=env_extra.get("TESSERA_PODINFO", "/nonexistent/podinfo"))
    return subprocess.run([*LAUNCH, *args, "--", *command], env=env, capture_output=True, text=True, timeout=120)


def child_env(env_extra):
    done = launch(env_extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_slice_from_the_annotation_env_sets_devices_and_memory_fraction(tmp_path):
    env = child_env({"TESSERA_ASSIGNMENT": json.dumps(SLICE), "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    uuid = SLICE["uuids"][0]
    assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["TESSERA_GPU_MEMORY_FRACTION"] == "0.250" and env["TESSERA_GPU_MILLI"] == "250"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # no MPS daemon: time-sliced
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("gpu_sharing/_boot")
    assert "CUDA_DEVICE_ORDER" not in env  # UUIDs need no ordering


def test_mps_gets_the_slices_share_of_threads(tmp_path):
    os.mkfifo(tmp_path / "control")
    env = child_env({"TESSERA_ASSIGNMENT": json.dumps(dict(SLICE, milli=333)), "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"


def test_the_downward_api_volume_file_is_read(tmp_path):
    annotation = json.dumps({"node": "n1", "gpus": [0, 3], "milli": 1000, "uuids": ["GPU-a", "GPU-b"]})
    quoted = annotation.replace("\\", "\\\\").replace('"', '\\"')  # as kubelet writes it (Go strconv.Quote)
    podinfo = tmp_path / "annotations"
    podinfo.write_text(f'kubernetes.io/config.seen="2026-01-01T00:00:00Z"\ntessera.dev/gpu-assignment="{quoted}"\n')
    env = child_env({"TESSERA_PODINFO": str(podinfo)})
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and env["TESSERA_GPU_MEMORY_FRACTION"] == "1.000"
    assert "_boot" not in env.get("PYTHONPATH", "")  # whole GPUs: nothing to cap


def test_indices_only_are_ordered_by_pci_bus_like_nvml():
    env = child_env({"TESSERA_VISIBLE_DEVICES": "2", "TESSERA_GPU_MILLI": "500"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["TESSERA_GPU_MEMORY_FRACTION"] == "0.500"


@pytest.mark.parametrize("extra, words", [
    ({}, "no Tessera assignment"),
    ({"TESSERA_ASSIGNMENT": "{not json"}, "unreadable tessera.dev/gpu-assignment"),
    ({"TESSERA_ASSIGNMENT": json.dumps(dict(SLICE, milli=0))}, "milli must be 1..1000"),
    ({"TESSERA_ASSIGNMENT": json.dumps(dict(SLICE, milli=300, uuids=[], gpus=[]))}, "no GPU assigned"),
    ({"TESSERA_VISIBLE_DEVICES": "GPU-a,GPU-b", "TESSERA_GPU_MILLI": "500"}, "a slice is one GPU"),
])
def test_no_or_bad_assignment_is_refused_and_the_command_never_runs(tmp_path, extra, words):
    marker = tmp_path / "ran"
    done = launch(extra, command=["touch", str(marker)])
    assert done.returncode == 2 and words in done.stderr and not marker.exists()


def test_a_cpu_only_pod_sees_no_gpu():
    env = child_env({"TESSERA_ASSIGNMENT": json.dumps({"node": "n1", "gpus": [], "milli": 0, "uuids": []})})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "" and "_boot" not in env.get("PYTHONPATH", "")


def test_the_exit_code_is_the_commands():
    done = launch({"TESSERA_ASSIGNMENT": json.dumps(SLICE)}, command=[sys.executable, "-c", "raise SystemExit(7)"])
    assert done.returncode == 7


def test_an_unknown_option_is_refused_as_one_and_the_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    done = launch({"TESSERA_ASSIGNMENT": json.dumps(SLICE)}, command=["touch", str(marker)], args=["--bogus"])
    assert done.returncode == 2 and not marker.exists()  # was "command not found: --bogus", exit 127
    assert done.stderr.startswith("tessera-launch: unknown option --bogus; usage:") and done.stderr.count("\n") == 1


@pytest.mark.parametrize("text, mode, words", [
    ("touch {ran}\n", 0o755, "Exec format error; a script needs a #! line"),  # was an OSError traceback
    ("#!/nonexistent/sh\ntouch {ran}\n", 0o755, "No such file or directory; is the interpreter its #! line names"),
    ("#!/bin/sh\ntouch {ran}\n", 0o644, "not an executable file"),  # was "command not found", exit 127
])
def test_a_file_that_cannot_be_run_is_said_in_one_line_with_a_shells_exit_code(tmp_path, text, mode, words):
    script = tmp_path / "job.sh"
    script.write_text(text.format(ran=tmp_path / "ran"))
    script.chmod(mode)
    done = launch({"TESSERA_ASSIGNMENT": json.dumps(SLICE)}, command=[str(script)])
    assert done.returncode == 126 and not (tmp_path / "ran").exists()
    assert done.stderr.startswith(f"tessera-launch: cannot run {script}: {words}") and done.stderr.count("\n") == 1


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    env = child_env({"TESSERA_ASSIGNMENT": json.dumps(SLICE), "PYTHONPATH": str(tmp_path)})
    assert env["SHADOWED_RAN"] == "1" and env["PYTHONPATH"].endswith(str(tmp_path))


def test_podinfo_unquotes_go_escapes():
    assert parse_podinfo('a="x\\"y\\\\z\\n\\u00e9"\nbad line\n') == {"a": 'x"y\\z\n\u00e9'}


def test_apply_sets_the_environment_of_a_python_entrypoint():
    env = {"TESSERA_ASSIGNMENT": json.dumps(SLICE), "TESSERA_PODINFO": "/nonexistent"}
    done = apply(env)
    assert env["CUDA_VISIBLE_DEVICES"] == SLICE["uuids"][0] and env["TESSERA_GPU_MEMORY_FRACTION"] == "0.250"
    assert "PYTHONPATH" not in env  # in-process: nothing to hand to children
    assert done.assignment.milli == 250
    if not HAS_TORCH:
        assert done.memory_cap == "torch not installed: no memory cap"
    with pytest.raises(AssignmentError):
        read_assignment({"TESSERA_PODINFO": "/nonexistent"})


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (it comes with the `ray` extra): the cap cannot be shown")
def test_a_python_child_importing_torch_gets_its_memory_capped_at_the_slice():
    """The cap is queued in torch for CUDA's initialisation; scripts/gpu-check.sh shows it biting on a GPU."""
    probe = ("import torch\n"
             "queued = [getattr(c[0], 'tessera_fraction', None) for c in torch.cuda._queued_calls]\n"
             "print([f for f in queued if f is not None])\n")
    done = launch({"TESSERA_ASSIGNMENT": json.dumps(SLICE), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                  command=[sys.executable, "-c", probe])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [0.25]


def test_boot_dir_is_shipped_with_the_package():
    import gpu_sharing.enforce as enforce

    assert (Path(enforce.BOOT_DIR) / "sitecustomize.py").is_file() and (Path(enforce.BOOT_DIR) / "tessera_torchcap.py").is_file()


def test_the_launcher_uses_the_contracts_annotation_name():
    from extender.translate import objects as contract
    from gpu_sharing import assignment

    assert assignment.ASSIGNMENT_ANNOTATION == contract.ASSIGNMENT_ANNOTATION


def test_the_ray_pods_name_for_the_assignment_gives_the_slice_not_a_whole_gpu():
    """The Ray example hands the annotation over as TESSERA_GPU_ASSIGNMENT beside TESSERA_VISIBLE_DEVICES: read only
    as the devices, with TESSERA_GPU_MILLI unset, a 250-milli slice was capped at 1000."""
    a = read_assignment({"TESSERA_GPU_ASSIGNMENT": json.dumps(SLICE), "TESSERA_VISIBLE_DEVICES": SLICE["uuids"][0],
                         "TESSERA_PODINFO": "/nonexistent/podinfo"})
    assert a.milli == 250 and a.source == "env TESSERA_GPU_ASSIGNMENT"
