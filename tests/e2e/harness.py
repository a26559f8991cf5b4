"""What the end-to-end tests share beyond the control plane itself (testing/local_cluster.py starts that): skipping
where it cannot start, waiting for a state, the real-node tests' summary, the guide's blocks as written, and acting as
the shipped ServiceAccounts."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from testing.local_cluster import KUBE_BIN, ROOT, binaries_missing


def skip_without_control_plane(controllers: bool = False) -> None:
    """Skip the calling test (with the reason) when the Kubernetes binaries or etcd are missing
    (kube-controller-manager too with `controllers=True`)."""
    import shutil

    import pytest

    missing = binaries_missing(controllers)
    if missing:
        pytest.skip(missing)
    if not shutil.which("etcd"):
        pytest.skip("etcd not installed (scripts/kube-build.sh installs Debian's etcd-server)")


# What scripts/node-e2e.sh --json prints: each real-node test (test_nodes_e2e.py, test_install_e2e.py) records what it
# measured or showed here, and each module writes it out when it ends (a key is absent when its test did not get
# that far).
NODE_SUMMARY: dict = {}


def write_node_summary() -> None:
    """Merge NODE_SUMMARY into the JSON file $TESSERA_NODE_E2E_JSON names (several modules write one file)."""
    out = os.environ.get("TESSERA_NODE_E2E_JSON")
    if not out:
        return
    try:
        with open(out) as f:
            merged = json.load(f)
    except (OSError, ValueError):
        merged = {}
    merged.update(NODE_SUMMARY)
    with open(out, "w") as f:
        json.dump(merged, f, sort_keys=True)


def until(what: str, check, timeout: float = 60.0, describe=None, every: float = 0.3):
    """Poll `check` until it returns something truthy (and return that); after `timeout`, fail naming `what` and
    what `describe()` says of the state then."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}: {describe() if describe else value!r}")
        time.sleep(every)


def guide_block(name: str, doc: str = "docs/admin-guide.md") -> str:
    """The bash block between `<!-- name:begin -->` and `<!-- name:end -->` of a guide, as written."""
    import re

    m = re.search(rf"<!-- {name}:begin -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->", (ROOT / doc).read_text(), re.S)
    assert m, f"no {name} block in {doc}"
    return m.group(1)


def create_assignment_key(kubeconfig: Path, namespace: str, name: str) -> subprocess.CompletedProcess:
    """The install's step, as an admin runs it: docs/admin-guide.md's "Create the assignment key" block, as written,
    with kubectl 1.20.2, NS and SECRET set (the test skips without kubectl). The caller reads the return code: run
    twice, the block must fail and change nothing."""
    if not (KUBE_BIN / "kubectl").is_file():
        import pytest

        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN}: the guide's step runs kubectl")
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), NS=namespace, SECRET=name, PATH=f"{KUBE_BIN}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", guide_block("assignment-key")], env=env,
                          capture_output=True, text=True, timeout=60)


# --- acting as the shipped ServiceAccounts (the RBAC and raybridge e2e tests) ----------------------

def create_or_keep(fn, *args) -> None:
    """Create an object; one already there (409) is kept as it is."""
    from kubernetes.client.exceptions import ApiException

    try:
        fn(*args)
    except ApiException as e:
        if e.status != 409:
            raise


def impersonating(api, namespace: str, sa: str):
    """An ApiClient with `api`'s admin credentials that acts as ServiceAccount `namespace`/`sa`."""
    from kubernetes import client

    return client.ApiClient(api.api_client.configuration, header_name="Impersonate-User",
                            header_value=f"system:serviceaccount:{namespace}:{sa}")


def refused(call) -> bool:
    """True when the apiserver answers the call with 403 Forbidden."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        return e.status == 403
    return False

