"""What a pod says of the gang it belongs to, beyond Tessera's own annotations (gangs.py).

  * scheduler-plugins' PodGroup: the label `scheduling.x-k8s.io/pod-group: NAME` puts the pod in the PodGroup
    NAME of its namespace (`pod-group.scheduling.sigs.k8s.io` is the label older coscheduling releases and
    the training operators of their day wrote; both are read, and must agree). Kubeflow's training operator
    and KubeRay write it when pointed at scheduler-plugins (docs/gangs-ecosystem.md).
  * the kube shape: a digest of everything kube-scheduler's own filters read of the pod (resources, node
    selector and affinity, tolerations, pod (anti-)affinity, topology spread, host ports, volumes, priority,
    runtime class, scheduler name). Labels are left out: a Job's or a training operator's members differ in
    them (a replica index) while kube-scheduler's verdicts do not; only another pod's (anti-)affinity term
    could tell two such members apart.
"""

from __future__ import annotations

import hashlib
import json
import re

import orjson

from tessera_contract import GANG_NAME_ANNOTATION, AnnotationError

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
OLD_POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # an object name (a DNS subdomain)

# The pod spec's fields kube-scheduler 1.20's filters read, besides the containers' resources and host ports; and
# schedulingGates (1.26+): a gated pod is never offered a node, so it must not share a shape with one that is (a
# queue such as Kueue holds a gang's pods back by it: Tessera must not bind them past the gate)
KUBE_FILTERED = ("nodeName", "nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "priority",
                 "priorityClassName", "schedulerName", "runtimeClassName", "overhead", "hostNetwork", "volumes",
                 "schedulingGates")


def pod_group(meta: dict) -> str:
    """namespace/name of the PodGroup the pod's label names, "" for none; AnnotationError in words for a label
    Tessera cannot read as one, or a pod that names a Tessera gang as well (one pod is in one gang)."""
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return ""
    named = {labels[k] for k in (POD_GROUP_LABEL, OLD_POD_GROUP_LABEL) if labels.get(k)}
    if not named:
        return ""
    if len(named) > 1:
        raise AnnotationError("bad-value", f"labels {POD_GROUP_LABEL} and {OLD_POD_GROUP_LABEL} name two PodGroups "
                                           f"({', '.join(sorted(repr(str(n)[:63]) for n in named))}); keep one")
    name = named.pop()
    if not isinstance(name, str) or not _NAME.match(name):
        raise AnnotationError("bad-value", f"label {POD_GROUP_LABEL} must name a PodGroup (lower-case letters, digits, "
                                           f"'-' and '.'), got {str(name)[:63]!r}")
    if (meta.get("annotations") or {}).get(GANG_NAME_ANNOTATION):
        raise AnnotationError("bad-value", f"{GANG_NAME_ANNOTATION} and the label {POD_GROUP_LABEL} both make this pod a "
                                           "gang member; a pod is in one gang: keep one")
    return f"{meta.get('namespace') or 'default'}/{name}"


def pod_group_problems(meta: dict) -> list[AnnotationError]:
    try:
        pod_group(meta)
    except AnnotationError as e:
        return [e]
    return []


def member_fields(spec: dict) -> dict:
    """What a pending gang member's PodInfo carries of its spec for gang admission (gangs.py)."""
    return {"kube_shape": kube_shape(spec), "placed_by_peers": placed_by_peers(spec)}


def placed_by_peers(spec: dict) -> bool:
    """Whether where the pod may go depends on where other pods are: inter-pod affinity or anti-affinity, or topology
    spread. kube-scheduler judges those against the pods bound at that moment, which an offer made before a gang's
    other members were placed does not show; so such a member is bound by kube-scheduler, never by Tessera itself."""
    affinity = spec.get("affinity") or {}
    peers = isinstance(affinity, dict) and bool(affinity.get("podAffinity") or affinity.get("podAntiAffinity"))
    return peers or bool(spec.get("topologySpreadConstraints"))


def kube_shape(spec: dict) -> str:
    """A 16-hex digest of what kube-scheduler's own filters read of a pod spec: equal for members from one template."""
    containers = [c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])] if isinstance(c, dict)]
    read = [[c.get("resources"), [p for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]]
            for c in containers]
    parts = [read, {k: spec.get(k) for k in KUBE_FILTERED}]
    try:
        raw = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer past 64 bits, say: the API would not have stored it, but never fail on it
        raw = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()
