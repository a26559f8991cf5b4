"""Under TESSERA_REQUIRE_E2E=1 (CI's .ci/run sets it) an end-to-end test that skips fails, with its reason;
without it the same test skips. Shown on a real e2e test whose Kubernetes binaries are pointed nowhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ONE = "tests/e2e/test_nodes_e2e.py::test_two_kubelets_register_ready_with_their_own_capacity"


def run_one(tmp_path: Path, required: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESSERA_KUBE_BIN=str(tmp_path / "no-binaries-here"))
    env.pop("TESSERA_REQUIRE_E2E", None)
    if required:
        env["TESSERA_REQUIRE_E2E"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", ONE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("required", [False, True])
def test_a_skipping_e2e_test_fails_only_where_e2e_is_required(tmp_path, required):
    done = run_one(tmp_path, required)
    if required:
        # a skip in a fixture is reported as an error of the test's setup, one in its body as a failure: either is red
        assert done.returncode == 1 and ("1 error" in done.stdout or "1 failed" in done.stdout), done.stdout[-2000:]
        assert "TESSERA_REQUIRE_E2E=1 says end-to-end tests must run here" in done.stdout
        assert "no-binaries-here" in done.stdout  # the skip's own reason is kept
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout[-2000:]
