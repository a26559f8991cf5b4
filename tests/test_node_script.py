"""scripts/node.sh refuses bad input in words before it starts anything (no root or cluster needed for these)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

NODE_SH = Path(__file__).resolve().parent.parent / "scripts/node.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(NODE_SH), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name, index, words", [
    ("Node_A", "1", "node name 'Node_A' is not a DNS label"),
    ("node-a", "0", "INDEX must be 1..200, got '0'"),
    ("node-a", "201", "INDEX must be 1..200, got '201'"),
    ("node-a", "x", "INDEX must be 1..200, got 'x'"),
])
def test_bad_names_and_indexes_are_refused_in_words(tmp_path, name, index, words):
    done = run("start", str(tmp_path), name, index)
    assert done.returncode == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "nodes").exists()  # nothing made


def test_a_node_needs_a_control_plane_first(tmp_path):
    done = run("start", str(tmp_path / "absent"), "node-a", "1")
    assert done.returncode == 1 and "does not exist: start one first (scripts/controlplane.sh start" in done.stderr
    done = run("start", str(tmp_path), "node-a", "1")
    assert done.returncode == 1 and "kubeconfig missing: start the control plane first" in done.stderr


def test_usage_is_printed_for_an_unknown_command():
    done = run("begin")
    assert done.returncode == 2 and "node.sh start CP_DIR NAME INDEX" in done.stderr


@pytest.mark.parametrize("args", [["--jsn"], ["--json", "extra"], ["run"]])
def test_node_e2e_refuses_what_it_does_not_know_with_its_usage(args):
    done = subprocess.run([str(NODE_SH.parent / "node-e2e.sh"), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "node-e2e.sh --json" in done.stderr and not done.stdout, done.stderr


@pytest.mark.parametrize("args", [["--target"], ["--target", "gpu"], ["ray"], ["--target", "ray", "extra"]])
def test_image_build_refuses_an_unknown_target_in_words_before_building(args, tmp_path):
    done = subprocess.run([str(NODE_SH.parent / "image-build.sh"), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "TESSERA_IMAGE_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1 and "usage: scripts/image-build.sh [--target tessera|ray]" in done.stderr, done.stderr
    assert not done.stdout and not (tmp_path / "cache").exists()  # nothing built, nothing made
