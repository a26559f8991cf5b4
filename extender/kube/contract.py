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

import difflib
import json
import math
import re
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
# Any amount once scaled (CPU in milli, memory in MiB, summed over containers): an integer every JSON reader
# holds exactly. A node's "9223372036854775807" CPUs is 9.2e21 milli, past 64 bits: /inspect could not encode it.
MAX_AMOUNT = 2**53
MAX_GANG_SIZE = 10_000  # the gang check places every missing member on a scratch cluster: bounded work
# What one object may make the extender hold or loop over. Generous for any real machine (the
# largest nodes have 16 GPUs), small enough that a node status or annotation claiming 2^63 GPUs is
# refused in words instead of building a tuple that never finishes.
MAX_GPUS_PER_NODE = 256
MAX_GPU_MEMORY_MIB = 2**24  # 16 TiB per GPU
MAX_NAME_CHARS = 253  # a DNS subdomain, the longest name Kubernetes gives anything
MAX_QUANTITY_CHARS = 64  # "9223372036854775807" and a suffix; a 100 KiB "quantity" is not one
MAX_ANNOTATION_CHARS = 64 * 1024  # the assignment and inventory annotations (a 256-GPU inventory is ~40 KiB)
_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() accepts "²", which int() then refuses

DOMAIN = "tessera.dev/"
# Every tessera.dev/ key some part of Tessera reads or writes on a pod (labels included: a label key
# written as an annotation by mistake is still a key Tessera knows). A tessera.dev/ annotation outside
# this list is a misspelling ("gang-sise") that would otherwise be ignored without a word. raybridge
# owns the ray-* and bridge keys (raybridge/contract.py); tests/test_contract_annotations.py checks
# that every tessera.dev/ key in the repository's code is listed here.
KNOWN_POD_KEYS = frozenset({
    GANG_NAME_ANNOTATION, GANG_SIZE_ANNOTATION,  # written by users
    ASSIGNMENT_ANNOTATION, VISIBLE_DEVICES_ANNOTATION, MAC_ANNOTATION,  # written by Tessera's bind
    "tessera.dev/runtime", "tessera.dev/entrypoint", "tessera.dev/train-config",  # raybridge, read
    "tessera.dev/ray-phase", "tessera.dev/ray-progress", "tessera.dev/ray-lost",  # raybridge and its jobs, written
    "tessera.dev/replaces", "tessera.dev/created-by", "tessera.dev/bridge-mac",  # raybridge's pods
    "tessera.dev/ray-job", "tessera.dev/ray-role", "tessera.dev/ray-cluster",  # labels of the Ray examples
    "tessera.dev/scheduler", "tessera.dev/gpu-node",  # node labels and taints (second-scheduler mode, the agent)
})
# The fixed label set of tessera_pod_annotation_problems_total (a label per key would let tenants grow the series).
ANNOTATION_CATEGORIES = ("unknown-key", "half-gang", "bad-value", "zero-gpu-milli")
MAX_KEYS_REPORTED = 5  # a pod with 1,000 misspelt keys gets one readable message, not a 100 KiB one


class AnnotationError(RequestError):
    """A pod's tessera.dev/ input that Tessera will not take silently; `category` is one of ANNOTATION_CATEGORIES."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


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
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(f"{what}: not a quantity: {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_QUANTITY_CHARS:
        raise RequestError(f"{what}: not a quantity ({len(value)} characters): {value[:40]!r}...")
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
            total += _amount(_quantity(raw, f"{what} {resource}") * scale, f"{what} {resource}")
    return total


def _amount(value: Decimal | int, what: str) -> int:
    if value > MAX_AMOUNT:
        raise RequestError(f"{what}: more than anything real holds (over 2^53 once scaled)")
    return int(value)


def _pod_amount(spec: dict, resource: str, scale: int, what: str) -> int:
    """Kubernetes' effective request: the sum over containers, or the largest init container."""
    main = _amount(_container_amount(spec.get("containers"), resource, scale, what), f"{what} {resource}")
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
        raise AnnotationError("bad-value", f"pod {key}: {MILLI_RESOURCE} must be 1..1000 (one GPU at most), got {milli}")
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
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        raise RequestError(f"{GANG_NAME_ANNOTATION} must be a name of at most {MAX_NAME_CHARS} characters")
    raw = ann.get(GANG_SIZE_ANNOTATION, "")
    if not raw:
        raise AnnotationError("half-gang", f"{GANG_NAME_ANNOTATION} {name[:60]!r} without {GANG_SIZE_ANNOTATION}: Tessera "
                              f"cannot tell how many members to wait for; add {GANG_SIZE_ANNOTATION}")
    if not isinstance(raw, str) or not _DIGITS.fullmatch(raw.strip()):
        raise AnnotationError("bad-value", f"{GANG_SIZE_ANNOTATION} must be a whole number, got {str(raw)[:40]!r}")
    size = int(raw)
    if not 1 <= size <= MAX_GANG_SIZE:
        raise AnnotationError("bad-value", f"{GANG_SIZE_ANNOTATION} must be 1..{MAX_GANG_SIZE}, got {size}")
    return Gang(f"{meta.get('namespace', 'default')}/{name}", size)


def _mentions_milli(spec: dict) -> bool:
    """Whether any container names tessera.dev/gpu-milli in its requests or limits, whatever the amount."""
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = (c or {}).get("resources") or {}
        if MILLI_RESOURCE in (res.get("requests") or {}) or MILLI_RESOURCE in (res.get("limits") or {}):
            return True
    return False


def annotation_problems(pod: dict) -> list[AnnotationError]:
    """Every tessera.dev/ input on the pod that would otherwise be taken silently, in words ([] when none).

    Unknown keys (misspellings), a gang half specified (a size without a name would bind the pod
    alone; a name without a size cannot be waited for), values out of range, and a gpu-milli of 0
    (which would bind the pod with no GPU at all). A pending pod with any of these is refused by
    pod_info; a bound one keeps what it holds and gets a Warning Event (kube/cache.py).
    Assumes check_pod passed (annotations are a map of strings).
    """
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ann = meta.get("annotations") or {}
    out: list[AnnotationError] = []
    unknown = sorted(k for k in ann if isinstance(k, str) and k.startswith(DOMAIN) and k not in KNOWN_POD_KEYS)
    for key in unknown[:MAX_KEYS_REPORTED]:
        if key == MILLI_RESOURCE:
            why = f"annotation {key} does nothing: it is a resource, asked for in a container's resources.limits"
        else:
            close = difflib.get_close_matches(key, sorted(KNOWN_POD_KEYS), n=1, cutoff=0.8)
            why = f"unknown annotation {key[:80]}" + (f" (did you mean {close[0]}?)" if close else "")
        out.append(AnnotationError("unknown-key", why))
    if len(unknown) > MAX_KEYS_REPORTED:
        out.append(AnnotationError("unknown-key", f"and {len(unknown) - MAX_KEYS_REPORTED} more unknown tessera.dev/ keys"))
    if ann.get(GANG_SIZE_ANNOTATION) and not ann.get(GANG_NAME_ANNOTATION):
        out.append(AnnotationError(
            "half-gang", f"{GANG_SIZE_ANNOTATION} {str(ann[GANG_SIZE_ANNOTATION])[:40]!r} without {GANG_NAME_ANNOTATION}: "
            f"the pod would be placed alone, not with its gang; add {GANG_NAME_ANNOTATION} (or remove {GANG_SIZE_ANNOTATION})"))
    try:
        pod_gang(pod)
    except AnnotationError as e:
        out.append(e)
    except RequestError as e:
        out.append(AnnotationError("bad-value", str(e)))
    try:
        request = pod_request(pod)
    except AnnotationError as e:
        out.append(e)
    except RequestError:
        pass  # not a tessera.dev/ problem: pod_info refuses it in its own words
    else:
        if request.gpu_count == 0 and _mentions_milli(spec):
            out.append(AnnotationError(
                "zero-gpu-milli", f"{MILLI_RESOURCE} is 0: the pod would be bound with no GPU at all; "
                f"ask for 1..1000 (or remove {MILLI_RESOURCE} for a pod without a GPU)"))
    return out


def annotation_refusal(problems: list[AnnotationError]) -> AnnotationError:
    """One error for all of a pod's problems, in the first one's category: what filter says to kube-scheduler."""
    return AnnotationError(problems[0].category, "; ".join(str(p) for p in problems))


def assignment_annotations(a: Assignment, uuids: tuple[str, ...] = (), signer: AssignmentSigner | None = None,
                           uid: str = "") -> dict[str, str]:
    """What bind writes on the pod: which GPUs, milli each, their UUIDs, a visible-devices value, and a MAC."""
    ids = [uuids[g] if g < len(uuids) and uuids[g] else str(g) for g in a.gpus]
    body = json.dumps({"node": a.node, "gpus": list(a.gpus), "milli": a.milli, "uuids": ids}, separators=(",", ":"))
    out = {ASSIGNMENT_ANNOTATION: body, VISIBLE_DEVICES_ANNOTATION: ",".join(ids)}
    if signer is not None:
        out[MAC_ANNOTATION] = signer.mac(uid, body)
    return out


def bound_message(a: Assignment, uuids: tuple[str, ...] = ()) -> str:
    """The bind Event's words: the node, which GPUs, how much of each, and their UUIDs when known."""
    if not a.gpus:
        return f"bound to {a.node} with no GPU"
    ids = [uuids[g] for g in a.gpus if g < len(uuids) and uuids[g]]
    many = len(a.gpus) > 1
    return (f"bound to {a.node} GPU{'s' if many else ''} {','.join(map(str, a.gpus))} at {a.milli} milli{' each' if many else ''}"
            + (f" ({', '.join(ids)})" if ids else ""))


def _load_json(raw: str, what: str):
    """A JSON annotation, bounded: its size, and its depth (a RecursionError is not a ValueError)."""
    if len(raw) > MAX_ANNOTATION_CHARS:
        raise RequestError(f"{what}: {len(raw)} characters, over {MAX_ANNOTATION_CHARS}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError(f"{what}: not JSON: {raw[:80]!r}") from None


def _int(value, low: int, high: int, what: str) -> int:
    """A JSON integer within bounds: 1e400 (inf), 2.5, "3" and true are not GPU indexes or MiB."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{what} must be a whole number {low}..{high}, got {str(value)[:40]!r}")
    return value


def _text(value, what: str, limit: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise RequestError(f"{what} must be a string of at most {limit} characters, got {str(value)[:40]!r}")
    return value


def parse_assignment(pod: dict, request: PodRequest) -> Assignment | None:
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    if not ann:
        return None
    what = f"pod {request.name}: unreadable {ASSIGNMENT_ANNOTATION}"
    body = _load_json(_text(ann, what, MAX_ANNOTATION_CHARS), what)
    if not isinstance(body, dict) or not isinstance(body.get("gpus"), list) or "node" not in body or "milli" not in body:
        raise RequestError(f"{what}: expected {{node, gpus, milli}}: {ann[:80]!r}")
    if len(body["gpus"]) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: more than {MAX_GPUS_PER_NODE} GPUs")
    gpus = tuple(_int(g, 0, MAX_GPUS_PER_NODE - 1, f"{what}: a GPU index") for g in body["gpus"])
    if len(set(gpus)) != len(gpus):
        raise RequestError(f"{what}: a GPU is named twice: {list(gpus)}")
    return Assignment(
        pod=request.name, node=_text(body["node"], f"{what}: node"), gpus=gpus,
        milli=_int(body["milli"], 0, MILLI_PER_GPU, f"{what}: milli"),
        cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, shape=request.shape(),
    )


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
    """The extender's view of a pod; with a signer, an assignment without Tessera's MAC is set aside.

    A pod already bound to a node holds what the kubelet gave it whatever its annotations say, so
    an unreadable assignment or gang annotation on it does not make the whole pod unreadable (its
    GPUs would then go uncounted and be handed out twice): the assignment is set aside as forged
    (counted like another binder's pod) and the gang forgotten. A pending pod with such annotations
    is refused in words, as kube-scheduler's verbs would refuse it.
    """
    check_pod(pod)
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    node = spec.get("nodeName") or ""
    if not node:
        problems = annotation_problems(pod)
        if problems:
            raise annotation_refusal(problems)
    request = pod_request(pod)
    try:
        forged, kid = _mac_verdict(pod, signer)
    except Exception as e:  # a MAC the check cannot even compare is no MAC of Tessera's: its GPUs are still real
        forged, kid = f"{MAC_ANNOTATION} unreadable ({type(e).__name__}): ignored", ""
    assignment = None
    if not forged:
        try:
            assignment = parse_assignment(pod, request)
        except RequestError as e:
            if not node:
                raise
            forged = f"{e}: ignored"
    try:
        gang = pod_gang(pod)
    except RequestError:
        if not node:
            raise
        gang = None
    try:
        tolerations = pod_tolerations(pod)
    except RequestError:
        if not node:
            raise
        tolerations = NO_TOLERATIONS  # only a pending pod's tolerations matter (bind re-checks them)
    return PodInfo(
        uid=str(meta.get("uid", "")), key=request.name, request=request, node=node, gang=gang,
        assignment=assignment, phase=(pod.get("status") or {}).get("phase", ""), forged=forged, kid=kid,
        tolerations=tolerations,
    )


def node_inventory(node: dict) -> NodeInventory:
    """The extender's view of a node; RequestError in words for anything it cannot honestly read.

    Written by kubelet (status) and the node agent (the inventory annotation): a compromised node
    may write anything there, so every number is type-checked and bounded before it is used.
    """
    if not isinstance(node, dict):
        raise RequestError("a Node must be an object")
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(status, dict):
        raise RequestError("Node.metadata and Node.status must be objects")
    name = _text(meta.get("name") or "", "Node.metadata.name")
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(ann, dict):
        raise RequestError(f"node {name}: labels and annotations must be objects")
    alloc = status.get("allocatable") or status.get("capacity") or {}
    if not isinstance(alloc, dict):
        raise RequestError(f"node {name}: status.allocatable must be an object")
    cpu = _amount(_quantity(alloc.get("cpu", "0"), f"node {name} cpu") * 1000, f"node {name} cpu")
    memory = _amount(_quantity(alloc.get("memory", "0"), f"node {name} memory") / MIB, f"node {name} memory")
    count = int(_quantity(alloc.get(GPU_RESOURCE, "0"), f"node {name} {GPU_RESOURCE}"))
    if count > MAX_GPUS_PER_NODE:
        raise RequestError(f"node {name}: {count} {GPU_RESOURCE}, more than {MAX_GPUS_PER_NODE} on one node")
    model = _text(labels.get(MODEL_LABEL, ""), f"node {name} label {MODEL_LABEL}")
    raw_memory = labels.get(MEMORY_LABEL, "0")
    memory_per_gpu = int(raw_memory) if isinstance(raw_memory, str) and _DIGITS.fullmatch(raw_memory) else 0
    gpus = tuple(GpuInfo(i, model=model, memory_mib=memory_per_gpu) for i in range(count))
    if ann.get(INVENTORY_ANNOTATION):
        gpus = _inventory(name, ann[INVENTORY_ANNOTATION], model)
        if gpus:
            model = gpus[0].model or model
            memory_per_gpu = gpus[0].memory_mib or memory_per_gpu
    reserved = tuple(g.reserved_milli for g in gpus)
    spec = NodeSpec(name=name, cpu_milli=cpu, memory_mib=memory, gpu_count=len(gpus), gpu_model=model,
                    gpu_memory_mib=memory_per_gpu, gpu_reserved=reserved if any(reserved) else ())
    return NodeInventory(spec, gpus, node_taints(node))


def _inventory(name: str, raw, model: str) -> tuple[GpuInfo, ...]:
    """The node agent's per-GPU report, every field checked: its type, and a bound on every number."""
    what = f"node {name}: unreadable {INVENTORY_ANNOTATION}"
    body = _load_json(_text(raw, what, MAX_ANNOTATION_CHARS), what)
    listed = body.get("gpus") if isinstance(body, dict) else None
    if not isinstance(listed, list) or len(listed) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: expected {{\"gpus\": [...]}} with at most {MAX_GPUS_PER_NODE} GPUs")
    gpus = []
    for g in listed:
        if not isinstance(g, dict):
            raise RequestError(f"{what}: each GPU must be an object")
        gpus.append(GpuInfo(
            _int(g.get("index"), 0, MAX_GPUS_PER_NODE - 1, f"{what}: index"),
            _text(g.get("uuid", ""), f"{what}: uuid"), _text(g.get("model", model), f"{what}: model"),
            _int(g.get("memory_mib", 0), 0, MAX_GPU_MEMORY_MIB, f"{what}: memory_mib"),
            _flag(g.get("healthy", True), f"{what}: healthy"),
            _int(g.get("oob_memory_mib", 0), 0, MAX_GPU_MEMORY_MIB, f"{what}: oob_memory_mib"),
        ))
    gpus.sort(key=lambda g: g.index)
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise RequestError(f"node {name}: {INVENTORY_ANNOTATION} must list GPUs 0..n-1")
    return tuple(gpus)


def _flag(value, what: str) -> bool:
    """A JSON boolean; the string "false" is not true (bool("false") would be)."""
    if isinstance(value, bool):
        return value
    raise RequestError(f"{what} must be true or false, got {str(value)[:40]!r}")
