"""Node taints and pod tolerations, with Kubernetes' own matching rules.

kube-scheduler's TaintToleration plugin already keeps pods off nodes whose taints they do not
tolerate; the extender checks again because its verbs are a second door: a bind (or a filter)
that reaches it directly must not put a pod on a NoSchedule/NoExecute node either.

Matching is `ToleratesTaint` from k8s.io/api core/v1: a toleration with an effect matches only
that effect (empty: every effect); with a key matches only that key (empty key: every key);
operator `Exists` matches any value, `Equal` (or empty) the same value; any other operator
matches nothing. Only NoSchedule and NoExecute keep a pod off a node; PreferNoSchedule is a
preference for the scoring plugins.

The types (Taint, Tolerations) are plain state (extender/state.py); this module reads them from
API objects.
"""

from __future__ import annotations

from tessera_contract import RequestError

from ..state import BLOCKING_EFFECTS, NO_TOLERATIONS, Taint, Tolerations

__all__ = ["BLOCKING_EFFECTS", "NO_TOLERATIONS", "Taint", "Tolerations", "node_taints", "pod_tolerations"]


def _str_field(entry: dict, field: str, where: str) -> str:
    value = entry.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"{where}.{field}: expected a string, got {type(value).__name__}")
    return value


def _entries(value, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{where}: expected an array, got {type(value).__name__}")
    for i, entry in enumerate(value):
        if entry is not None and not isinstance(entry, dict):
            raise RequestError(f"{where}[{i}]: expected an object, got {type(entry).__name__}")
    return [e for e in value if e is not None]


def node_taints(node: dict) -> tuple[Taint, ...]:
    """The taints that keep pods off `node` (NoSchedule, NoExecute); RequestError in words if unreadable."""
    spec = (node.get("spec") if isinstance(node, dict) else None) or {}
    if not isinstance(spec, dict):
        raise RequestError("node spec: expected an object")
    out = []
    for i, t in enumerate(_entries(spec.get("taints"), "node spec.taints")):
        where = f"node spec.taints[{i}]"
        taint = Taint(_str_field(t, "key", where), _str_field(t, "value", where), _str_field(t, "effect", where))
        if taint.effect in BLOCKING_EFFECTS:
            out.append(taint)
    return tuple(dict.fromkeys(out))


def pod_tolerations(pod: dict) -> Tolerations:
    """A pod's tolerations as sets; RequestError in words when a field has the wrong type."""
    spec = (pod.get("spec") if isinstance(pod, dict) else None) or {}
    if not isinstance(spec, dict):
        raise RequestError("Pod.spec: expected an object")
    exists: set[tuple[str, str]] = set()
    equal: set[tuple[str, str, str]] = set()
    for i, t in enumerate(_entries(spec.get("tolerations"), "Pod.spec.tolerations")):
        where = f"Pod.spec.tolerations[{i}]"
        key, op = _str_field(t, "key", where), _str_field(t, "operator", where)
        value, effect = _str_field(t, "value", where), _str_field(t, "effect", where)
        if op == "Exists":
            exists.add((key, effect))
        elif op in ("", "Equal"):
            equal.add((key, value, effect))
        # any other operator tolerates nothing (as in Kubernetes)
    if not exists and not equal:
        return NO_TOLERATIONS
    return Tolerations(frozenset(exists), frozenset(equal))
