"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1), both directions.

Keys are Go field names (PascalCase) with no JSON tags; kube-scheduler decodes replies
case-insensitively, and we parse requests the same way (old schedulers sent lowercase keys).
Nested Kubernetes objects (Pod, Node) keep their usual camelCase. Scores must be JSON integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..binding import BindTarget
from ..core.cluster import grouped

if TYPE_CHECKING:
    from ..judge import Priorities


class WireError(ValueError):
    """A request body that is not what kube-scheduler sends; the text says what is wrong."""


def _fold(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise WireError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return {str(k).lower(): v for k, v in obj.items()}


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """filter / prioritize request."""

    pod: dict
    node_names: list[str]
    nodes: list[dict] | None  # the full Node objects when nodeCacheCapable is false

    @property
    def cache_capable(self) -> bool:
        return self.nodes is None


def _pod(obj: Any) -> dict:
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise WireError("Pod: expected a Pod object with metadata")
    meta = obj["metadata"]
    for key in ("name", "uid"):
        if not isinstance(meta.get(key), str) or not meta.get(key):
            raise WireError(f"Pod.metadata.{key}: expected a non-empty string")
    if "spec" in obj and not isinstance(obj["spec"], dict):
        raise WireError("Pod.spec: expected an object")
    return obj


def _all_strings(items: list) -> bool:
    """str.join refuses anything but strings: one C-level pass (14 us at 5000 names, where set(map(type, ...)) took 55)."""
    try:
        "".join(items)
    except TypeError:
        return False
    return True


def parse_extender_args(body: Any) -> ExtenderArgs:
    args = _fold(body, "ExtenderArgs")
    pod = _pod(args.get("pod"))
    names, nodes = args.get("nodenames"), args.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not _all_strings(names):
            raise WireError("NodeNames: expected an array of strings")
        return ExtenderArgs(pod, list(names), None)
    if nodes is not None:
        items = _fold(nodes, "Nodes").get("items")
        if items is None:
            items = []
        if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
            raise WireError("Nodes.items: expected an array of Node objects")
        node_names = []
        for n in items:
            meta = n.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError("Nodes.items[].metadata.name: expected a non-empty string")
            node_names.append(name)
        return ExtenderArgs(pod, node_names, items)
    return ExtenderArgs(pod, [], None)  # both null: no candidate nodes


def parse_binding_args(body: Any) -> BindTarget:
    args = _fold(body, "ExtenderBindingArgs")
    values = {}
    for key, wire in (("pod_name", "podname"), ("pod_namespace", "podnamespace"), ("pod_uid", "poduid"), ("node", "node")):
        v = args.get(wire)
        if not isinstance(v, str) or not v:
            raise WireError(f"{wire}: expected a non-empty string")
        values[key] = v
    return BindTarget(**values)


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: dict
    victims: dict[str, list[str]]  # node -> victim pod UIDs
    num_pdb_violations: dict[str, int]
    cache_capable: bool


def parse_preemption_args(body: Any) -> PreemptionArgs:
    args = _fold(body, "ExtenderPreemptionArgs")
    pod = _pod(args.get("pod"))
    meta, full = args.get("nodenametometavictims"), args.get("nodenametovictims")
    source, cache_capable = (meta, True) if meta is not None else (full, False)
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    if source is not None and not isinstance(source, dict):
        raise WireError("victims map: expected a JSON object")
    for node, v in (source or {}).items():
        entry = _fold(v if v is not None else {}, f"victims of {node}")
        pods = entry.get("pods") or []
        if not isinstance(pods, list):
            raise WireError(f"victims of {node}: Pods must be an array")
        uids = []
        for p in pods:
            p = _fold(p, f"victim of {node}")
            meta = p.get("metadata")
            uid = p.get("uid") if cache_capable else (meta.get("uid") if isinstance(meta, dict) else None)
            if not isinstance(uid, str) or not uid:
                raise WireError(f"victim of {node}: missing UID")
            uids.append(uid)
        victims[node] = uids
        n = entry.get("numpdbviolations") or 0
        pdb[node] = int(n) if isinstance(n, int) else 0
    return PreemptionArgs(pod, victims, pdb, cache_capable)


MAX_REFUSAL_CHARS = 400  # one reason on every node: kube-scheduler's event is refused past 1024 characters


def refusal_reason(text: str) -> str:
    """Why the pod itself is refused, as the reason every node fails with (kept short: see MAX_REFUSAL_CHARS)."""
    return text if len(text) <= MAX_REFUSAL_CHARS else text[:MAX_REFUSAL_CHARS - 1] + "…"


def filter_result(
    args: ExtenderArgs, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> dict:
    failed = {n: grouped(r) for n, r in failed.items()}  # per-node figures stay in /inspect (core/cluster.py: grouped)
    unresolvable = {n: grouped(r) for n, r in unresolvable.items()}
    # unresolvable nodes in both maps: 1.21+ lets FailedAndUnresolvableNodes win (preemption skips them);
    # 1.20 ignores that key, and a node in neither map would reach the pod's event with no reason at all
    result: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {**unresolvable, **failed} or None,
                              "FailedAndUnresolvableNodes": unresolvable or None, "Error": error}
    if error:
        return result
    if args.cache_capable:
        result["NodeNames"] = passed
    else:
        keep = set(passed)
        result["Nodes"] = {"metadata": {}, "items": [n for n in args.nodes or [] if n["metadata"]["name"] in keep]}
    return result


def filter_error(message: str) -> dict:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": None, "Error": message}


def host_priorities(priorities: Priorities) -> list[dict]:
    """Scores must already be ints (policies' extender_scores return ints): Go decodes them as int64. Built from the
    two lists at once (judge.py's Priorities says why)."""
    return [{"Host": host, "Score": score} for host, score in zip(priorities.names, priorities.scores, strict=True)]


def preemption_result(victims: dict[str, list[str]], pdb: dict[str, int]) -> dict:
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb.get(node, 0)} for node, uids in victims.items()
    }}
