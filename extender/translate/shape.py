"""Type checks on the parts of a Pod object that the contract reads, before it reads them.

The API server only ever serves well-typed objects, but the extender's HTTP verbs take a Pod from
whoever can reach the port: a wrong type anywhere `pod_info` looks (a string where the containers
list belongs, a number as an annotation value) must end as a `RequestError` in words, not as an
AttributeError deep in the contract (a 500 to kube-scheduler). Only the fields Tessera reads are
checked; everything else in the object is left alone, as Kubernetes' own decoders would not care.
"""

from __future__ import annotations

from typing import Any

from ..core.model import RequestError


def _kind(value: Any) -> str:
    return "null" if value is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__)


def _obj(value: Any, path: str) -> dict:
    """An object, or null (Go's omitempty / nil map): {}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{path}: expected an object, got {_kind(value)}")
    return value


def _list(value: Any, path: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{path}: expected an array, got {_kind(value)}")
    return value


def _str(value: Any, path: str) -> None:
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{path}: expected a string, got {_kind(value)}")


def _str_map(value: Any, path: str) -> None:
    """Labels, annotations, nodeSelector: map[string]string, so null values are refused too."""
    for k, v in _obj(value, path).items():
        if not isinstance(v, str):
            raise RequestError(f"{path}[{k!r}]: expected a string, got {_kind(v)}")


def _quantities(value: Any, path: str) -> None:
    for k, v in _obj(value, path).items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise RequestError(f"{path}[{k!r}]: expected a quantity (string or number), got {_kind(v)}")


def _containers(value: Any, path: str) -> None:
    for i, c in enumerate(_list(value, path)):
        resources = _obj(_obj(c, f"{path}[{i}]").get("resources"), f"{path}[{i}].resources")
        for part in ("requests", "limits"):
            _quantities(resources.get(part), f"{path}[{i}].resources.{part}")


def _affinity(value: Any, path: str) -> None:
    """The node affinity's terms, and that the inter-pod ones are objects (their required terms are read for whether
    they exist). Paths are built only for the message: a pod near the API's size limit carries some 260,000 values,
    and naming each as it passed cost 140 ms a pod on the watch's thread (audit, 2026-12-02); 10 ms now."""
    affinity = _obj(value, path)
    for kind in ("podAffinity", "podAntiAffinity"):
        _obj(affinity.get(kind), f"{path}.{kind}")
    node = _obj(affinity.get("nodeAffinity"), f"{path}.nodeAffinity")
    required = _obj(node.get("requiredDuringSchedulingIgnoredDuringExecution"), f"{path}.nodeAffinity.required")
    terms = _list(required.get("nodeSelectorTerms"), f"{path}.nodeAffinity.required.nodeSelectorTerms")
    for i, term in enumerate(terms):
        if term is None:
            continue
        where = f"{path}.nodeAffinity.required.nodeSelectorTerms[{i}]"
        term = _obj(term, where)
        for field in ("matchExpressions", "matchFields"):
            for j, e in enumerate(_list(term.get(field), f"{where}.{field}")):
                if e is None:
                    continue
                e = _obj(e, f"{where}.{field}[{j}]")
                for key in ("key", "operator"):
                    _str(e.get(key), f"{where}.{field}[{j}].{key}")
                values = _list(e.get("values"), f"{where}.{field}[{j}].values")
                if not all(isinstance(v, str) for v in values):
                    k = next(k for k, v in enumerate(values) if not isinstance(v, str))
                    raise RequestError(f"{where}.{field}[{j}].values[{k}]: expected a string, got {_kind(values[k])}")


def check_pod(pod: Any) -> None:
    """Raise RequestError naming the first field of `pod` that has the wrong JSON type."""
    pod = _obj(pod, "Pod")
    meta = _obj(pod.get("metadata"), "Pod.metadata")
    for key in ("name", "namespace", "uid"):
        _str(meta.get(key), f"Pod.metadata.{key}")
    _str_map(meta.get("annotations"), "Pod.metadata.annotations")
    spec = _obj(pod.get("spec"), "Pod.spec")
    _str(spec.get("nodeName"), "Pod.spec.nodeName")
    _str_map(spec.get("nodeSelector"), "Pod.spec.nodeSelector")
    _containers(spec.get("containers"), "Pod.spec.containers")
    _containers(spec.get("initContainers"), "Pod.spec.initContainers")
    _affinity(spec.get("affinity"), "Pod.spec.affinity")
    _str(_obj(pod.get("status"), "Pod.status").get("phase"), "Pod.status.phase")
