"""The resource and annotation contract between ML engineers' pods, nodes and Tessera.

Pure functions from Kubernetes objects (plain dicts, camelCase as the API serves them) to the
core's types, and from an assignment back to annotations. Documented in README.md.

Pods ask for
  * whole GPUs: `nvidia.com/gpu: N` in a container's limits (kube-scheduler checks the node's
    count; Tessera picks which GPUs);
  * a slice of one GPU: `tessera.dev/gpu-milli: M` (1..1000) in a container's limits; the
    scheduler config lists it in managedResources with ignoredByScheduler: true;
  * GPU models: required node affinity (or a nodeSelector) on `nvidia.com/gpu.product`;
  * a gang: annotations `tessera.dev/gang-name` and `tessera.dev/gang-size`.
Nodes offer `nvidia.com/gpu` capacity, the `nvidia.com/gpu.product` label and optionally
`nvidia.com/gpu.memory` (MiB per GPU); the node agent's `tessera.dev/gpu-inventory` annotation,
when present, adds per-GPU UUIDs, memory and health and wins. It also says how much memory
processes outside any Tessera assignment hold on each GPU (`oob_memory_mib`): that share, as
milli (ceil(oob / memory * 1000)), is withheld from placement, and an unhealthy GPU is withheld
whole.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from ..core.model import MILLI_PER_GPU, Assignment, NodeSpec, PodRequest, RequestError
from .keyring import AssignmentSigner  # the keyring lives in keyring.py; callers import it from here
from .shape import check_pod
from .taints import NO_TOLERATIONS, Taint, Tolerations, node_taints, pod_tolerations

GPU_RESOURCE = "nvidia.com/gpu"
MILLI_RESOURCE = "tessera.dev/gpu-milli"
MODEL_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
INVENTORY_ANNOTATION = "tessera.dev/gpu-inventory"
GANG_NAME_ANNOTATION = "tessera.dev/gang-name"
GANG_SIZE_ANNOTATION = "tessera.dev/gang-size"
ASSIGNMENT_ANNOTATION = "tessera.dev/gpu-assignment"
VISIBLE_DEVICES_ANNOTATION = "tessera.dev/visible-devices"
MAC_ANNOTATION = "tessera.dev/assignment-mac"
MIB = 1024 * 1024
MAX_QUANTITY = Decimal(2**63)  # Kubernetes stores quantities as int64; "1e999999999" would take minutes to int()
MAX_GANG_SIZE = 10_000  # the gang check places every missing member on a scratch cluster: bounded work


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    healthy: bool = True
    oob_memory_mib: int = 0  # held by processes that belong to no Tessera assignment

    @property
    def reserved_milli(self) -> int:
        """Milli placement must not hand out: all of an unhealthy GPU, else the out-of-band memory's share.

        With the memory size unknown the share cannot be computed, and nothing is withheld.
        """
        if not self.healthy:
            return MILLI_PER_GPU
        if self.oob_memory_mib <= 0 or self.memory_mib <= 0:
            return 0
        return min(MILLI_PER_GPU, math.ceil(self.oob_memory_mib * MILLI_PER_GPU / self.memory_mib))


@dataclass(frozen=True, slots=True)
class NodeInventory:
    spec: NodeSpec
    gpus: tuple[GpuInfo, ...]
    taints: tuple[Taint, ...] = ()  # NoSchedule/NoExecute only (kube/taints.py)


@dataclass(frozen=True, slots=True)
class Gang:
    name: str  # namespace-qualified
    size: int


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the extender needs to know about a pod."""

    uid: str
    key: str  # namespace/name
    request: PodRequest
    node: str  # spec.nodeName, "" while pending
    gang: Gang | None
    assignment: Assignment | None  # from its annotation, once bound by Tessera
    phase: str = ""
    forged: str = ""  # why its assignment annotation is not Tessera's (then `assignment` is None)
    kid: str = ""  # the key id its MAC names, valid or not (keyring.py: keys_in_use, check_keys)
    tolerations: Tolerations = NO_TOLERATIONS


def _quantity(value, what: str) -> Decimal:
    try:
        q = parse_quantity(value)
    except (ArithmeticError, ValueError, TypeError):
        raise RequestError(f"{what}: not a quantity: {str(value)[:80]!r}") from None
    if not q.is_finite() or not 0 <= q <= MAX_QUANTITY:
        raise RequestError(f"{what}: must be a finite quantity from 0 to 2^63, got {str(value)[:80]!r}")
    return q


def _container_amount(containers: list, resource: str, scale: int, what: str) -> int:
    total = 0
    for c in containers or []:
        res = (c or {}).get("resources") or {}
        raw = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        if raw is not None:
            total += int(_quantity(raw, f"{what} {resource}") * scale)
    return total


def _pod_amount(spec: dict, resource: str, scale: int, what: str) -> int:
    """Kubernetes' effective request: the sum over containers, or the largest init container."""
    main = _container_amount(spec.get("containers"), resource, scale, what)
    init = max((_container_amount([c], resource, scale, what) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def _models(spec: dict) -> frozenset[str]:
    selector = (spec.get("nodeSelector") or {}).get(MODEL_LABEL)
    if selector:
        return frozenset([selector])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    models: set[str] = set()
    for term in terms:  # terms are ORed: any term without a model constraint allows every model
        expressions = [e or {} for e in (term or {}).get("matchExpressions") or []]  # null: Go's nil, as check_pod reads it
        values = [v for e in expressions if e.get("key") == MODEL_LABEL and e.get("operator") == "In"
                  for v in e.get("values") or []]
        if not values:
            return frozenset()
        models.update(values)
    return frozenset(models)


def pod_request(pod: dict) -> PodRequest:
    """The core's view of a pod; RequestError in words when the pod asks for something invalid."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    gpus = _pod_amount(spec, GPU_RESOURCE, 1, key)
    milli = _pod_amount(spec, MILLI_RESOURCE, 1, key)
    if gpus and milli:
        raise RequestError(f"pod {key}: asks for both {GPU_RESOURCE} and {MILLI_RESOURCE}; use one")
    if milli and not 1 <= milli <= MILLI_PER_GPU:
        raise RequestError(f"pod {key}: {MILLI_RESOURCE} must be 1..1000 (one GPU at most), got {milli}")
    return PodRequest(
        name=key,
        cpu_milli=_pod_amount(spec, "cpu", 1000, key),
        memory_mib=_pod_amount(spec, "memory", 1, key) // MIB,
        gpu_count=gpus or (1 if milli else 0),
        gpu_milli=MILLI_PER_GPU if gpus else milli,
        gpu_models=_models(spec),
    )


def pod_gang(pod: dict) -> Gang | None:
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    name = ann.get(GANG_NAME_ANNOTATION)
    if not name:
        return None
    try:
        size = int(ann.get(GANG_SIZE_ANNOTATION, ""))
    except ValueError:
        raise RequestError(f"{GANG_SIZE_ANNOTATION} must be a whole number, got {ann.get(GANG_SIZE_ANNOTATION)!r}") from None
    if not 1 <= size <= MAX_GANG_SIZE:
        raise RequestError(f"{GANG_SIZE_ANNOTATION} must be 1..{MAX_GANG_SIZE}, got {size}")
    return Gang(f"{meta.get('namespace', 'default')}/{name}", size)


def assignment_annotations(a: Assignment, uuids: tuple[str, ...] = (), signer: AssignmentSigner | None = None,
                           uid: str = "") -> dict[str, str]:
    """What bind writes on the pod: which GPUs, milli each, their UUIDs, a visible-devices value, and a MAC."""
    ids = [uuids[g] if g < len(uuids) and uuids[g] else str(g) for g in a.gpus]
    body = json.dumps({"node": a.node, "gpus": list(a.gpus), "milli": a.milli, "uuids": ids}, separators=(",", ":"))
    out = {ASSIGNMENT_ANNOTATION: body, VISIBLE_DEVICES_ANNOTATION: ",".join(ids)}
    if signer is not None:
        out[MAC_ANNOTATION] = signer.mac(uid, body)
    return out


def parse_assignment(pod: dict, request: PodRequest) -> Assignment | None:
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    if not ann:
        return None
    try:
        body = json.loads(ann)
        gpus = tuple(int(g) for g in body["gpus"])
        return Assignment(
            pod=request.name, node=str(body["node"]), gpus=gpus, milli=int(body["milli"]),
            cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, shape=request.shape(),
        )
    except (ValueError, KeyError, TypeError, OverflowError):
        raise RequestError(f"pod {request.name}: unreadable {ASSIGNMENT_ANNOTATION}: {ann[:80]!r}") from None


def forged_reason(pod: dict, signer: AssignmentSigner | None) -> str:
    """'' when the pod carries no assignment or one Tessera signed; else why it does not count."""
    return _mac_verdict(pod, signer)[0]


def _mac_verdict(pod: dict, signer: AssignmentSigner | None) -> tuple[str, str]:
    """(why the assignment does not count or '', the key id its MAC names or '')."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    body = ann.get(ASSIGNMENT_ANNOTATION)
    if signer is None or not body:
        return "", ""
    check = signer.check(str(meta.get("uid", "")), str(body), ann.get(MAC_ANNOTATION))
    why = {
        "ok": "",
        "missing": f"{ASSIGNMENT_ANNOTATION} not written by Tessera (no {MAC_ANNOTATION}): ignored",
        "malformed": f"{ASSIGNMENT_ANNOTATION} not written by Tessera ({MAC_ANNOTATION} is not a MAC Tessera writes): ignored",
        "unknown": f"{ASSIGNMENT_ANNOTATION} signed with key id {check.kid}, which this extender does not hold: ignored",
        "mismatch": f"{ASSIGNMENT_ANNOTATION} edited or copied (its {MAC_ANNOTATION} does not match): ignored",
    }[check.status]
    return why, check.kid


def pod_info(pod: dict, signer: AssignmentSigner | None = None) -> PodInfo:
    """The extender's view of a pod; with a signer, an assignment without Tessera's MAC is set aside."""
    check_pod(pod)
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    request = pod_request(pod)
    forged, kid = _mac_verdict(pod, signer)
    return PodInfo(
        uid=str(meta.get("uid", "")), key=request.name, request=request, node=spec.get("nodeName") or "",
        gang=pod_gang(pod), assignment=None if forged else parse_assignment(pod, request),
        phase=(pod.get("status") or {}).get("phase", ""), forged=forged, kid=kid, tolerations=pod_tolerations(pod),
    )


def node_inventory(node: dict) -> NodeInventory:
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    name = meta.get("name") or ""
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    cpu = int(_quantity(alloc.get("cpu", "0"), f"node {name} cpu") * 1000)
    memory = int(_quantity(alloc.get("memory", "0"), f"node {name} memory") / MIB)
    count = int(_quantity(alloc.get(GPU_RESOURCE, "0"), f"node {name} {GPU_RESOURCE}"))
    model = labels.get(MODEL_LABEL, "")
    memory_per_gpu = int(labels.get(MEMORY_LABEL, "0") or 0) if str(labels.get(MEMORY_LABEL, "0")).isdigit() else 0
    gpus = tuple(GpuInfo(i, model=model, memory_mib=memory_per_gpu) for i in range(count))
    if ann.get(INVENTORY_ANNOTATION):
        try:
            listed = json.loads(ann[INVENTORY_ANNOTATION])["gpus"]
            gpus = tuple(
                GpuInfo(int(g["index"]), str(g.get("uuid", "")), str(g.get("model", model)),
                        int(g.get("memory_mib", 0)), _flag(g.get("healthy", True)), int(g.get("oob_memory_mib", 0)))
                for g in sorted(listed, key=lambda g: int(g["index"]))
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RequestError(f"node {name}: unreadable {INVENTORY_ANNOTATION}") from None
        if any(g.memory_mib < 0 or g.oob_memory_mib < 0 for g in gpus):
            raise RequestError(f"node {name}: {INVENTORY_ANNOTATION}: memory must not be negative")
        if [g.index for g in gpus] != list(range(len(gpus))):
            raise RequestError(f"node {name}: {INVENTORY_ANNOTATION} must list GPUs 0..n-1")
        if gpus:
            model = gpus[0].model or model
            memory_per_gpu = gpus[0].memory_mib or memory_per_gpu
    reserved = tuple(g.reserved_milli for g in gpus)
    spec = NodeSpec(name=name, cpu_milli=cpu, memory_mib=memory, gpu_count=len(gpus), gpu_model=model,
                    gpu_memory_mib=memory_per_gpu, gpu_reserved=reserved if any(reserved) else ())
    return NodeInventory(spec, gpus, node_taints(node))


def _flag(value) -> bool:
    """A JSON boolean; the string "false" is not true (bool("false") would be)."""
    if isinstance(value, bool):
        return value
    raise TypeError(f"not a boolean: {value!r}")
