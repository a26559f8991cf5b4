"""Install tests/crds' CustomResourceDefinitions in the local apiserver and wait until they serve: every
*.yaml there (RayCluster, ServiceMonitor, and scheduler-plugins' PodGroup, which `tessera serve` watches).

Only binaries built by scripts/kube-build.sh recipe r2 or later can take them: the r1 build
vendored reflect2 v1.0.1, which makes the Go 1.19-built apiserver segfault on the first custom
resource request and would take every other end-to-end test down with it. The recipe is read
from the stamp the build script writes next to bin/."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testing.local_cluster import KUBE_BIN

CRD_DIR = Path(__file__).resolve().parents[1] / "crds"
FIRST_GOOD_RECIPE = 2


@dataclass(frozen=True)
class CustomKind:
    """Where the CustomObjectsApi finds one kind."""

    kind: str
    group: str
    version: str
    plural: str


def recipe_too_old(bin_dir: Path = KUBE_BIN) -> str:
    """Why the binaries cannot serve custom resources, or '' when they can."""
    stamp = bin_dir.parent / "recipe"
    text = stamp.read_text().strip() if stamp.is_file() else ""
    if not (text.startswith("r") and text[1:].isdigit()):
        return f"{bin_dir} has no build-recipe stamp ({stamp}); binaries from before the reflect2 fix crash on CRs"
    if int(text[1:]) < FIRST_GOOD_RECIPE:
        return f"{bin_dir} was built by recipe {text}, before the reflect2 fix (r{FIRST_GOOD_RECIPE})"
    return ""


def crd_manifests() -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def install(api_client: client.ApiClient, timeout: float = 60) -> dict[str, CustomKind]:
    """Create (or keep) every CRD in tests/crds and return its kinds once each is Established."""
    ext = client.ApiextensionsV1Api(api_client)
    kinds: dict[str, CustomKind] = {}
    for crd in crd_manifests():
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as e:
            if e.status != 409:
                raise
        spec = crd["spec"]
        storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
        kinds[spec["names"]["kind"]] = CustomKind(spec["names"]["kind"], spec["group"], storage, spec["names"]["plural"])
    deadline = time.monotonic() + timeout
    for crd in crd_manifests():
        name = crd["metadata"]["name"]
        while not _established(ext.read_custom_resource_definition(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established within {timeout}s")
            time.sleep(0.2)
    return kinds


def _established(crd) -> bool:
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
