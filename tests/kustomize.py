"""Reads manifests/'s kustomizations the way kustomize does, for the subset they use: `resources`
(files, or directories with their own kustomization), `bases`, a `configMapGenerator` from files
with `generatorOptions` labels and no hash suffix, `images` with `newTag` (containers only).
Anything else is an error, so a kustomization
that starts using more fails the tests here instead of being half read.

The tests need this without a kustomize binary; where kubectl 1.20 (kustomize v2.0.3) is built,
tests/e2e/test_manifests_e2e.py checks that both read the same objects."""

from __future__ import annotations

from pathlib import Path

import yaml

KNOWN_KEYS = {"resources", "bases", "configMapGenerator", "generatorOptions", "images"}


class KustomizationError(ValueError):
    pass


def kustomization(directory: Path) -> dict:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizationError(f"{directory}: no kustomization.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise KustomizationError(f"{path}: keys this reader does not know: {sorted(unknown)}")
    return data


def _inside(root: Path, ref: str, allow_parent: bool) -> Path:
    target = (root / ref).resolve()
    if not allow_parent and root.resolve() not in (target, *target.parents):
        raise KustomizationError(f"{root}: {ref} is outside the kustomization's directory")
    return target


def files(directory: Path) -> list[Path]:
    """Every file a kustomization reads (its own included), recursively."""
    data = kustomization(directory)
    out = [directory / "kustomization.yaml"]
    for ref in data.get("bases", []):
        out += files(_inside(directory, ref, allow_parent=True))
    for ref in data.get("resources", []):
        target = _inside(directory, ref, allow_parent=False)
        out += files(target) if target.is_dir() else [target]
    for gen in data.get("configMapGenerator", []):
        out += [_inside(directory, f, allow_parent=False) for f in gen.get("files", [])]
    return out


def render(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize directory` prints, in the order kustomize reads them."""
    data = kustomization(directory)
    objects: list[dict] = []
    for ref in data.get("bases", []):
        objects += render(_inside(directory, ref, allow_parent=True))
    for ref in data.get("resources", []):
        target = _inside(directory, ref, allow_parent=False)
        if target.is_dir():
            objects += render(target)
        else:
            objects += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]
    options = data.get("generatorOptions", {})
    generators = data.get("configMapGenerator", [])
    if generators and options.get("disableNameSuffixHash") is not True:
        raise KustomizationError(f"{directory}: generated names carry a hash this reader does not compute")
    for gen in generators:
        meta = {"name": gen["name"]}
        if "namespace" in gen:
            meta["namespace"] = gen["namespace"]
        if options.get("labels"):
            meta["labels"] = dict(options["labels"])
        body = {Path(f).name: _inside(directory, f, allow_parent=False).read_text() for f in gen.get("files", [])}
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": body})
    for image in data.get("images", []):
        if set(image) != {"name", "newTag"}:
            raise KustomizationError(f"{directory}: images entries this reader knows have name and newTag only")
        _retag(objects, image["name"], image["newTag"])
    seen: set[tuple] = set()
    for obj in objects:
        key = (obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "", obj["kind"],
               obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise KustomizationError(f"{directory}: {key} appears twice")
        seen.add(key)
    return objects


def _retag(objects: list[dict], name: str, tag: str) -> None:
    """kustomize's `images` transformer for a workload's containers: name[:old] -> name:tag."""
    for obj in objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c.get("image", "").split("@")[0].rsplit(":", 1)[0] == name or c.get("image") == name:
                c["image"] = f"{name}:{tag}"
