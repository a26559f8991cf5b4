"""Checks a custom resource against a CRD's structural schema the way the apiserver would: the
schema's types, enums, patterns and required fields (jsonschema), plus the fields the apiserver
would prune because the schema does not list them (a misspelt field is dropped silently there).

The check that needs no cluster; tests/e2e/test_manifests_e2e.py also dry-runs the same objects
against the same CRDs on the real apiserver (tests/crds/README.md)."""

from __future__ import annotations

import jsonschema


def crd_schema(crd: dict, version: str) -> dict:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd['metadata']['name']} has no version {version}")


def pruned(obj, schema: dict, path: str = "") -> list[str]:
    """Paths the apiserver would drop: fields of an object whose schema lists its properties."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            if not path and k in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and k in props:
                out += pruned(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += pruned(v, extra, f"{path}.{k}")
            else:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += pruned(v, schema["items"], f"{path}[{i}]")
    return out


def problems(obj: dict, crd: dict) -> list[str]:
    group, _, version = obj["apiVersion"].partition("/")
    if group != crd["spec"]["group"] or obj["kind"] != crd["spec"]["names"]["kind"]:
        return [f"{obj['apiVersion']} {obj['kind']} is not {crd['metadata']['name']}"]
    schema = crd_schema(crd, version)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft4Validator(schema).iter_errors(obj)]
    return errors + [f"{p}: not in the schema (the apiserver would drop it)" for p in pruned(obj, schema)]
