"""The resource and annotation contract between ML engineers' pods, nodes and Tessera.

Pure functions from Kubernetes objects (plain dicts, camelCase as the API serves them) to the
extender's state (extender/state.py), and from an assignment back to annotations. The annotations
themselves (their keys, one encode and one decode each) are the shared contract, tessera_contract,
which the node agent and the Ray bridge read too; this module is the extender's translator around
it: resources, node status and the pod as a whole. Documented in README.md.

Pods ask for
  * whole GPUs: `nvidia.com/gpu: N` in a container's limits (kube-scheduler checks the node's
    count; Tessera picks which GPUs);
  * a slice of one GPU: `tessera.dev/gpu-milli: M` (1..1000) in a container's limits; the
    scheduler config lists it in managedResources with ignoredByScheduler: true;
  * GPU models: required node affinity (or a nodeSelector) on `nvidia.com/gpu.product`;
  * a gang: annotations `tessera.dev/gang-name` and `tessera.dev/gang-size`, or the label
    `scheduling.x-k8s.io/pod-group` naming a scheduler-plugins PodGroup (membership.py).
Nodes offer `nvidia.com/gpu` capacity, the `nvidia.com/gpu.product` label and optionally
`nvidia.com/gpu.memory` (MiB per GPU); the node agent's `tessera.dev/gpu-inventory` annotation,
when present, adds per-GPU UUIDs, memory and health and wins. It also says how much memory
processes outside any Tessera assignment hold on each GPU (`oob_memory_mib`): that share, as
milli (ceil(oob / memory * 1000)), is withheld from placement, and an unhealthy GPU is withheld
whole.
"""

from __future__ import annotations

import difflib
from decimal import Decimal

from tessera_contract import (  # noqa: F401 (the keys are re-exported: the adapter's callers name them from here)
    ANNOTATION_CATEGORIES,
    ASSIGNMENT_ANNOTATION,
    DOMAIN,
    EXPECTED_RUNTIME_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GPU_RESOURCE,
    INVENTORY_ANNOTATION,
    KNOWN_POD_KEYS,
    MAC_ANNOTATION,
    MEMORY_LABEL,
    MILLI_RESOURCE,
    MODEL_LABEL,
    MOVABLE_ANNOTATION,
    TERMINAL_PHASES,
    VISIBLE_DEVICES_ANNOTATION,
    AnnotationError,
    GpuAssignment,
    decode_assignment,
    decode_expected_runtime,
    decode_gang,
    decode_inventory,
    decode_movable,
    decode_ray_job,
    encode_assignment,
    mac_verdict,
)
from tessera_contract.keyring import AssignmentSigner  # noqa: F401 (re-exported: callers import it from here)
from tessera_contract.keys import (
    CONFIG_ANNOTATION,
    ENTRYPOINT_ANNOTATION,
    MAX_GPUS_PER_NODE,
    MAX_NAME_CHARS,
    REPLACES_ANNOTATION,
    RUNTIME_ANNOTATION,
    USER_POD_KEYS,
)
from tessera_contract.spelling import near_domain
from tessera_contract.values import DIGITS, printable, quantity, text, timestamp, whole

from ..core.model import MILLI_PER_GPU, Assignment, NodeSpec, PodRequest, RequestError
from ..state import Gang, GpuInfo, NodeInventory, NodeTerms, PodInfo, assignment_annotations  # noqa: F401 (re-exported)
from .membership import member_fields, pod_group, pod_group_problems
from .shape import check_pod
from .taints import NO_TOLERATIONS, node_taints, pod_tolerations

MIB = 1024 * 1024
# Any amount once scaled (CPU in milli, memory in MiB, summed over containers): an integer every JSON reader
# holds exactly. A node's "9223372036854775807" CPUs is 9.2e21 milli, past 64 bits: /inspect could not encode it.
MAX_AMOUNT = 2**53
MAX_KEYS_REPORTED = 5  # a pod with 1,000 misspelt keys gets one readable message, not a 100 KiB one


def _container_amount(containers: list, resource: str, scale: int, what: str) -> int:
    total = 0
    for c in containers or []:
        res = (c or {}).get("resources") or {}
        raw = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        if raw is not None:
            try:
                amount = quantity(raw, f"{what} {resource}") * scale
            except RequestError:
                if resource != MILLI_RESOURCE:
                    raise
                amount = Decimal("NaN")  # said below with the slice's own range, not a quantity's 0..2^63
            if resource in (GPU_RESOURCE, MILLI_RESOURCE) and not amount == amount.to_integral_value():
                # the apiserver refuses fractions of an extended resource; read as int(), "0.0001" GPUs was none
                rule = f"a whole number 1..{MILLI_PER_GPU}" if resource == MILLI_RESOURCE else "a whole number of GPUs"
                hint = (" (it counts thousandths of a GPU already: 250, not 250m)"
                        if resource == MILLI_RESOURCE and amount.is_finite() else "")
                raise RequestError(f"pod {what}: {resource} must be {rule}, got {str(raw)[:40]!r}{hint}")
            total += _amount(amount, f"{what} {resource}")
    return total


def _amount(value: Decimal | int, what: str) -> int:
    if value > MAX_AMOUNT:
        raise RequestError(f"{what}: more than anything real holds (over 2^53 once scaled)")
    return int(value)


def _asking(spec: dict, resource: str) -> list[str]:
    """The containers (init containers too) whose requests or limits name `resource`, by name."""
    out = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = (c or {}).get("resources") or {}
        if resource in (res.get("requests") or {}) or resource in (res.get("limits") or {}):
            out.append(_container_name(c, len(out)))
    return out


def names_gpu_resource(pod) -> bool:
    """Whether any container of `pod` names a GPU resource in its requests or limits: kube-scheduler's test for the
    GPU extender entry (its managedResources), read on any JSON, since it is asked of pods that failed their checks."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    for field in ("initContainers", "containers"):
        for c in spec.get(field) if isinstance(spec.get(field), list) else []:
            res = c.get("resources") if isinstance(c, dict) else None
            for part in ("requests", "limits"):
                amounts = res.get(part) if isinstance(res, dict) else None
                if isinstance(amounts, dict) and (GPU_RESOURCE in amounts or MILLI_RESOURCE in amounts):
                    return True
    return False


def _container_name(container: dict, i: int) -> str:
    name = (container or {}).get("name")
    return repr(name[:40]) if isinstance(name, str) and name.isprintable() else f"#{i}"


def _pod_amount(spec: dict, resource: str, scale: int, what: str) -> int:
    """Kubernetes' effective request: the containers and every sidecar together, or an init container with the sidecars
    started before it, whichever is larger.

    A sidecar is an init container with `restartPolicy: Always` (on by default from Kubernetes 1.29): it keeps
    running beside the containers, so the kubelet and the device plugin count it with them. Read as an ordinary init
    container, a sidecar asking 2 GPUs beside a container asking 2 was counted as 2, and Tessera handed out 2 GPUs
    the kubelet had already given away."""
    sidecars, init = 0, 0
    for c in spec.get("initContainers") or []:
        amount = _container_amount([c], resource, scale, what)
        if (c or {}).get("restartPolicy") == "Always":
            sidecars += amount
            init = max(init, sidecars)
        else:
            init = max(init, sidecars + amount)
    main = _container_amount(spec.get("containers"), resource, scale, what) + sidecars
    return _amount(max(main, init), f"{what} {resource}")


MAX_NODE_TERMS = 64  # selector pairs, terms, values per expression: more is no plan's input
# Selector pairs and expressions of every term together: each is one dict or set lookup per node, and a node check
# runs once per node of a plan (`Judge.offered_nodes`) and up to 4,096 times in a held pod's filter (`contested`). Per-list
# caps alone allowed 64 terms x 64 expressions x 64 values: a padded pod made one check 3.1 ms and a held pod's filter
# 12 s under the extender's lock (audit, 2026-12-02). Real affinities use a handful; more is no plan's input either.
MAX_NODE_EXPRESSIONS = 64


def node_terms(spec: dict) -> NodeTerms | None:
    """The pod's nodeSelector and required node affinity (kube-scheduler's NodeAffinity plugin's input); None when
    they are not of a shape read here, or when the pod has constraints Tessera does not read node by node (then no
    node is a candidate for what Tessera plans for the pod).

    kube-scheduler 1.20 stops at a node's first failing filter, and its resource fit comes before volume binding,
    topology spread and inter-pod affinity: a node short of GPUs is reported only as "Insufficient", though the
    pod's anti-affinity or its volume's zone would rule it out too."""
    if _constraints_not_read(spec):
        return None
    selector = spec.get("nodeSelector") or {}
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if not isinstance(selector, dict) or not isinstance(terms, list) or len(selector) > MAX_NODE_TERMS \
            or len(terms) > MAX_NODE_TERMS or not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        return None
    read, budget = [], MAX_NODE_EXPRESSIONS - len(selector)
    for term in terms:
        if term is not None and not isinstance(term, dict):
            return None
        term = term or {}  # a null or empty term matches no node (the API's rule): () below, which admits none
        expressions = [*(term.get("matchExpressions") or []),
                       *({**e, "key": "metadata.name"} for e in term.get("matchFields") or [] if isinstance(e, dict))]
        budget -= len(expressions)
        if budget < 0:
            return None
        one = []
        for e in expressions:
            values = e.get("values") or [] if isinstance(e, dict) else None
            if not isinstance(e, dict) or not isinstance(e.get("key"), str) or not isinstance(values, list) \
                    or len(values) > MAX_NODE_TERMS or not all(isinstance(v, str) for v in values):
                return None
            operator = str(e.get("operator"))  # In and NotIn look a label up in a set: one step however many values
            one.append((e["key"], operator, frozenset(values) if operator in ("In", "NotIn") else tuple(values)))
        read.append(tuple(one))
    return NodeTerms(tuple(sorted(selector.items())), tuple(read))


MAX_CONTAINER_STATUSES = 64  # read of a finished pod's status: more containers than any pod runs
MAX_MODELS = 64  # GPU models a pod may name; no cluster has more, and each is checked on every node at filter


def _constraints_not_read(spec: dict) -> bool:
    """Required inter-pod (anti-)affinity, a DoNotSchedule topology spread, or a volume bound to where its claim is."""
    affinity = spec.get("affinity") or {}
    if any(((affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution"))
           for kind in ("podAffinity", "podAntiAffinity")):
        return True
    spread = spec.get("topologySpreadConstraints") or []
    if not isinstance(spread, list) or any(not isinstance(c, dict) or c.get("whenUnsatisfiable", "DoNotSchedule")
                                           == "DoNotSchedule" for c in spread):
        return True
    volumes = spec.get("volumes") or []
    return not isinstance(volumes, list) or any(not isinstance(v, dict) or "persistentVolumeClaim" in v
                                                or "ephemeral" in v for v in volumes)


def _models(spec: dict, what: str) -> frozenset[str]:
    """The GPU models the pod's nodeSelector or required affinity allows (empty: any), each a printable label value.

    kube-apiserver 1.20 checks only the keys of a node affinity expression, not its values: 40,000 values held the
    extender's lock 22 s in one filter over 1000 nodes and echoed control characters into Events."""
    models = _model_values(spec)
    if len(models) > MAX_MODELS:
        raise RequestError(f"{what}: names {len(models)} GPU models ({MODEL_LABEL}); at most {MAX_MODELS}")
    for model in models:
        printable(model, f"{what}: GPU model ({MODEL_LABEL})", 63)  # a label value's longest
    return models


def _model_values(spec: dict) -> frozenset[str]:
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
        raise AnnotationError("bad-value", f"pod {key}: {MILLI_RESOURCE} must be a whole number 1..{MILLI_PER_GPU} (one GPU "
                              f"at most), got {milli}")
    return PodRequest(
        name=key,
        cpu_milli=_pod_amount(spec, "cpu", 1000, key),
        memory_mib=_pod_amount(spec, "memory", 1, key) // MIB,
        gpu_count=gpus or (1 if milli else 0),
        gpu_milli=MILLI_PER_GPU if gpus else milli,
        gpu_models=_models(spec, f"pod {key}"),
    )


def _bound_request(pod: dict) -> PodRequest:
    """A bound pod whose request Tessera would refuse (gpu-milli over 1000, both GPU resources) still holds what the
    kubelet admitted it to: its CPU and memory, and whole GPUs, enough to cover its share (1500 milli: 2). Tessera
    counted such a pod as holding nothing, so it offered GPUs the kubelet had already given away."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    gpus, milli = _pod_amount(spec, GPU_RESOURCE, 1, key), _pod_amount(spec, MILLI_RESOURCE, 1, key)
    count = min(MAX_GPUS_PER_NODE, max(gpus, -(-milli // MILLI_PER_GPU)))
    return PodRequest(name=key, cpu_milli=_pod_amount(spec, "cpu", 1000, key),
                      memory_mib=_pod_amount(spec, "memory", 1, key) // MIB, gpu_count=count,
                      gpu_milli=MILLI_PER_GPU if count else 0)  # bound: its models no longer matter


def _request_words(r: PodRequest) -> str:
    return f"{r.gpu_count} whole GPU{'s' if r.gpu_count != 1 else ''}" if r.gpu_count else "no GPU"


def pod_gang(pod: dict) -> Gang | None:
    meta = pod.get("metadata") or {}
    return decode_gang(meta.get("annotations") or {}, meta.get("namespace", "default"))


def annotation_problems(pod: dict) -> list[AnnotationError]:
    """Every tessera.dev/ input on the pod that would otherwise be taken silently, in words ([] when none).

    Unknown keys (misspellings, under tessera.dev/ or of the domain itself: `tesera.dev/gang-name`;
    tessera_contract/spelling.py says what counts as a slip), a gang half specified (a size without
    a name would bind the pod alone; a name without a size cannot be waited for), values out of
    range, and a gpu-milli of 0 (which would bind the pod with no GPU at all). A pending pod with
    any of these is refused by pod_info; a bound one keeps what it holds and gets a Warning Event
    (kube/cache.py).
    Assumes check_pod passed (annotations are a map of strings).
    """
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ann = meta.get("annotations") or {}
    out: list[AnnotationError] = []
    out += _unknown_keys(ann)
    out += _misplaced_keys(meta, spec)[:MAX_KEYS_REPORTED] + _shared_slice(spec)
    if ann.get(GANG_SIZE_ANNOTATION) and not ann.get(GANG_NAME_ANNOTATION):
        out.append(AnnotationError(
            "half-gang", f"{GANG_SIZE_ANNOTATION} {str(ann[GANG_SIZE_ANNOTATION])[:40]!r} without {GANG_NAME_ANNOTATION}: "
            f"Tessera cannot tell which gang the pod is in, so it does not place it; add {GANG_NAME_ANNOTATION} "
            f"(or remove {GANG_SIZE_ANNOTATION})"))
    try:
        pod_gang(pod)
    except AnnotationError as e:
        out.append(e)
    except RequestError as e:
        out.append(AnnotationError("bad-value", str(e)))
    try:
        decode_expected_runtime(ann)
    except AnnotationError as e:
        out.append(e)
    try:
        decode_movable(ann)
    except AnnotationError as e:
        out.append(e)
    try:
        decode_ray_job(ann)
    except AnnotationError as e:
        out.append(e)
    out += _replaces_problem(meta) + pod_group_problems(meta)
    try:
        request = pod_request(pod)
    except AnnotationError as e:
        out.append(e)
    except RequestError:
        pass  # not a tessera.dev/ problem: pod_info refuses it in its own words
    else:
        if request.gpu_count == 0 and _asking(spec, MILLI_RESOURCE):
            out.append(AnnotationError(
                "zero-gpu-milli", f"{MILLI_RESOURCE} is 0: the pod would be bound with no GPU at all; "
                f"ask for 1..1000 (or remove {MILLI_RESOURCE} for a pod without a GPU)"))
    return out


def _unknown_keys(ann: dict) -> list[AnnotationError]:
    """Unknown tessera.dev/ keys and keys that miss the domain by a slip (tessera_contract/spelling.py says which),
    together in key order, at most MAX_KEYS_REPORTED of them named and the rest counted.

    Every key is looked at (a pod may carry thousands): a prefix test, or spelling's length tests and a few slices."""
    found: list[tuple[str, str, bool]] = []  # (the key as written, the tessera.dev/ key it reads as, missed the domain)
    for key in ann:
        if not isinstance(key, str):
            continue
        if key.startswith(DOMAIN):
            if key not in KNOWN_POD_KEYS:
                found.append((key, key, False))
        elif (reads_as := near_domain(key)) is not None:
            found.append((key, reads_as, True))
    found.sort()
    out = [AnnotationError("unknown-key", _unknown_key_words(*f)) for f in found[:MAX_KEYS_REPORTED]]
    if len(found) > MAX_KEYS_REPORTED:
        more = len(found) - MAX_KEYS_REPORTED
        missed = " or keys that miss it by a slip" if any(f[2] for f in found[MAX_KEYS_REPORTED:]) else ""
        out.append(AnnotationError("unknown-key", f"and {more} more unknown tessera.dev/ keys{missed}"))
    return out


# What the pod would be, read without the user key it meant to write: said when that key missed the domain
_WITHOUT = {GANG_NAME_ANNOTATION: "the pod would be placed alone, not as a gang",
            GANG_SIZE_ANNOTATION: "the pod would be placed alone, not as a gang",
            EXPECTED_RUNTIME_ANNOTATION: "the pod would declare no run time", MOVABLE_ANNOTATION: "the pod would never be moved",
            RUNTIME_ANNOTATION: "the pod would be no Ray job", ENTRYPOINT_ANNOTATION: "the pod would be no Ray job",
            CONFIG_ANNOTATION: "the pod would be no Ray job"}


def _unknown_key_words(key: str, reads_as: str, missed_domain: bool) -> str:
    """'unknown annotation K (did you mean tessera.dev/...?)', and for a key that missed the domain, what Tessera read.

    Suggested from what users write only ("gpu-mili" was told "did you mean tessera.dev/gpu-node?"), compared by the
    name after the domain: the shared `tessera.dev/` made "junk-1" close to "runtime"."""
    if missed_domain and reads_as in KNOWN_POD_KEYS:
        close = reads_as
    else:
        names = {k.removeprefix(DOMAIN): k for k in (*USER_ANNOTATIONS, MILLI_RESOURCE)}
        match = difflib.get_close_matches(reads_as.removeprefix(DOMAIN), list(names), n=1, cutoff=0.75)
        close = names[match[0]] if match else ""
    if close == MILLI_RESOURCE:
        return (f"annotation {key[:80]} does nothing: {MILLI_RESOURCE} is a resource, asked for in a container's "
                "resources.limits")
    words = f"unknown annotation {key[:80]}" + (f" (did you mean {close}?)" if close else "")
    if not missed_domain:
        return words
    without = _WITHOUT.get(reads_as)
    return (f"{words}: its domain is not {DOMAIN.rstrip('/')}, so Tessera read it as another program's key"
            + (f" and {without}" if without else ""))


# What a user writes as an annotation: set as a label instead, it was ignored without a word
USER_ANNOTATIONS = USER_POD_KEYS


def _shared_slice(spec: dict) -> list[AnnotationError]:
    """A slice asked by more than one container. The assignment names one slice for the pod, and tessera-launch caps
    each container at all of it: two containers asking 300 each could use 600 apiece of one 600-milli slice. A
    problem of the pod, not a refusal of its request: a bound pod so made still holds its summed slice."""
    asking = _asking(spec, MILLI_RESOURCE)
    if len(asking) < 2:
        return []
    return [AnnotationError("bad-value", f"{MILLI_RESOURCE} is asked by {len(asking)} containers "
                                         f"({', '.join(asking[:4])}); a slice is for one container")]


def _misplaced_keys(meta: dict, spec: dict) -> list[AnnotationError]:
    """Tessera's keys where Tessera does not read them: an annotation under a label, a prefix in capitals (the
    apiserver keeps keys as written; Tessera reads `tessera.dev/` only), a `tessera.dev/` resource other than
    gpu-milli in a container (a misspelt gpu-milli made a pod without a GPU, said only as kube's "Insufficient")."""
    ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    out = [AnnotationError("unknown-key", f"{k} is a label on this pod; Tessera reads it only as an annotation")
           for k in USER_ANNOTATIONS if isinstance(labels, dict) and k in labels and k not in ann]
    for where, keys in (("annotation", ann), ("label", labels if isinstance(labels, dict) else {})):
        out += [AnnotationError("unknown-key", f"{where} {k[:80]!r}: write the prefix as {DOMAIN} (lower case), as "
                                               "Tessera reads it") for k in keys
                if isinstance(k, str) and k.lower().startswith(DOMAIN) and not k.startswith(DOMAIN)]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = (c or {}).get("resources") or {}
        names = {*(res.get("requests") or {}), *(res.get("limits") or {})}
        for name in sorted(n for n in names if isinstance(n, str) and n.lower().startswith(DOMAIN) and n != MILLI_RESOURCE):
            out.append(AnnotationError("unknown-key", f"resource {name[:80]!r} is not Tessera's; a slice is asked as "
                                                      f"{MILLI_RESOURCE} (1..1000)"))
    return out


def annotation_refusal(problems: list[AnnotationError]) -> AnnotationError:
    """One error for all of a pod's problems, in the first one's category: what filter says to kube-scheduler."""
    return AnnotationError(problems[0].category, "; ".join(str(p) for p in problems))


BOUND_REASON = "TesseraBound"  # a Normal Event at bind: which GPUs and how much of each (kubectl describe shows it)


def bound_message(a: Assignment, uuids: tuple[str, ...] = ()) -> str:
    """The bind Event's words: the node, which GPUs, how much of each, and their UUIDs when known."""
    if not a.gpus:
        return f"bound to {a.node} with no GPU"
    ids = [uuids[g] for g in a.gpus if g < len(uuids) and uuids[g]]
    many = len(a.gpus) > 1
    return (f"bound to {a.node} GPU{'s' if many else ''} {','.join(map(str, a.gpus))} at {a.milli} milli{' each' if many else ''}"
            + (f" ({', '.join(ids)})" if ids else ""))


def parse_assignment(pod: dict, request: PodRequest) -> Assignment | None:
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    if not ann:
        return None
    a = decode_assignment(ann, f"pod {request.name}")
    return Assignment(pod=request.name, node=a.node, gpus=a.gpus, milli=a.milli,
                      cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, shape=request.shape())


def forged_reason(pod: dict, signer: AssignmentSigner | None) -> str:
    """'' when the pod carries no assignment or one Tessera signed; else why it does not count."""
    return _mac_verdict(pod, signer)[0]


def _mac_verdict(pod: dict, signer: AssignmentSigner | None) -> tuple[str, str]:
    """(why the assignment does not count or '', the key id its MAC names or '')."""
    meta = pod.get("metadata") or {}
    return mac_verdict(meta.get("annotations") or {}, str(meta.get("uid", "")), signer)


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
    try:
        request, overruled = pod_request(pod), ""
    except RequestError as e:
        if not node:
            raise
        request = _bound_request(pod)
        overruled = f"{e}: counted as {_request_words(request)}"
    try:
        forged, kid = _mac_verdict(pod, signer)
    except Exception as e:  # a MAC the check cannot even compare is no MAC of Tessera's: its GPUs are still real
        forged, kid = f"{MAC_ANNOTATION} unreadable ({type(e).__name__}): ignored", ""
    assignment = None
    if overruled:  # what it asked is not Tessera's to give, but the kubelet gave it: counted, never by its assignment
        forged = overruled
    if not forged:
        try:
            assignment = parse_assignment(pod, request)
        except RequestError as e:
            if not node:
                raise
            forged = f"{e}: ignored"
    gang, group, tolerations = _pending_only(pod, meta, node)
    return PodInfo(
        uid=str(meta.get("uid", "")), key=request.name, request=request, node=node, gang=gang,
        assignment=assignment, phase=(pod.get("status") or {}).get("phase", ""), forged=forged, kid=kid,
        tolerations=tolerations, priority=pod_priority(spec, node), terminating=bool(meta.get("deletionTimestamp")),
        nominated_node=_nominated_node(pod.get("status")), kube_refusal=_kube_refusal(pod.get("status")),
        node_terms=None if node else node_terms(spec),
        created_s=timestamp(meta.get("creationTimestamp")), started_s=timestamp((pod.get("status") or {}).get("startTime")),
        expected_runtime_s=pod_expected_runtime(meta.get("annotations") or {}, node), deadline_s=_deadline(spec),
        finished_s=_finished(pod.get("status")),
        movable=pod_movable(meta.get("annotations") or {}), replaces=_replaces(meta),
        pod_group=group, **(member_fields(spec) if (gang is not None or group) and not node else {}),
        preempts=pod_preempts(spec, node), scheduler_name=_scheduler_name(spec),
        controller_uid=_controller_uid(meta), evictable=_evictable(meta),
    )


SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"  # the autoscaler's; Karpenter and others read it too
MAX_OWNER_REFERENCES = 16  # read of metadata.ownerReferences: the API server lets one of them be the controller


def _controller_uid(meta: dict) -> str:
    """The uid of the ownerReference marked `controller: true`, '' with none (or an unreadable one). A tenant can write
    one on a bare pod: it only makes that pod leasable, and a lease ends in its own pod's deletion (drain leases)."""
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return ""
    for ref in refs[:MAX_OWNER_REFERENCES]:
        if isinstance(ref, dict) and ref.get("controller") is True:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) and 0 < len(uid) <= MAX_NAME_CHARS else ""
    return ""


def _evictable(meta: dict) -> bool:
    """False when the owner marked the pod `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`: never leased."""
    value = (meta.get("annotations") or {}).get(SAFE_TO_EVICT_ANNOTATION)
    return not (isinstance(value, str) and value.strip().lower() == "false")


def _finished(status: object) -> float | None:
    """When the pod's last container finished, from the kubelet's container statuses; None while any has not (or
    unreadable). At most MAX_CONTAINER_STATUSES are read: the kubelet writes one per container of the spec."""
    if not isinstance(status, dict) or status.get("phase") not in TERMINAL_PHASES:
        return None
    statuses = status.get("containerStatuses")
    if not isinstance(statuses, list) or not statuses:
        return None
    ends = []
    for entry in statuses[:MAX_CONTAINER_STATUSES]:
        state = entry.get("state") if isinstance(entry, dict) else None
        terminated = state.get("terminated") if isinstance(state, dict) else None
        end = timestamp(terminated.get("finishedAt")) if isinstance(terminated, dict) else None
        if end is None:
            return None
        ends.append(end)
    return max(ends)


def _pending_only(pod: dict, meta: dict, node: str) -> tuple[Gang | None, str, object]:
    """The pod's gang, PodGroup and tolerations: refused in words on a pending pod when unreadable; on a bound pod, which
    holds what it holds, an unreadable gang is forgotten and unreadable tolerations are none (bind re-checks them)."""
    try:
        gang, group = pod_gang(pod), pod_group(meta)
    except RequestError:
        if not node:
            raise
        gang, group = None, ""
    try:
        tolerations = pod_tolerations(pod)
    except RequestError:
        if not node:
            raise
        tolerations = NO_TOLERATIONS
    return gang, group, tolerations


PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")  # core/v1 PreemptionPolicy's two values


def pod_preempts(spec: dict, node: str) -> bool:
    """Whether the pod may have lower-priority pods evicted or moved for it: spec.preemptionPolicy is absent (Kubernetes'
    default) or PreemptLowerPriority, not Never. The Priority admission plugin copies it from the pod's PriorityClass
    (NonPreemptingPriority, beta and on from 1.19); kube-scheduler 1.20's DefaultPreemption skips a Never pod
    (PodEligibleToPreemptOthers). Any other value on a pending pod is refused in words; on a bound pod, which preempts
    nothing any more, it reads as Never."""
    value = spec.get("preemptionPolicy")
    if value is None or value == "PreemptLowerPriority":
        return True
    if value == "Never":
        return False
    if not node:
        got = repr(value[:40]) if isinstance(value, str) else f"a {type(value).__name__}"
        raise RequestError(f"spec.preemptionPolicy must be {' or '.join(PREEMPTION_POLICIES)} (its PriorityClass's), "
                           f"got {got}")
    return False


def _scheduler_name(spec: dict) -> str:
    """spec.schedulerName (the apiserver defaults it to default-scheduler and checks it is a DNS subdomain, at most 253
    characters); '' for anything else, a name no kube-scheduler profile has, so Tessera acts for no such pod."""
    value = spec.get("schedulerName")
    if value is None:
        return "default-scheduler"
    return value if isinstance(value, str) and 0 < len(value) <= 253 else ""


def pod_movable(annotations: dict) -> bool:
    """Whether the owner lets Tessera move the pod; a bound pod's unreadable value is a no (never moved)."""
    try:
        return decode_movable(annotations)
    except RequestError:
        return False


def _replaces_problem(meta: dict) -> list[AnnotationError]:
    """A tessera.dev/replaces that names no pod of the pod's own namespace, in words ([] when fine or absent)."""
    replaces = (meta.get("annotations") or {}).get(REPLACES_ANNOTATION)
    if replaces is None or _replaces(meta):
        return []
    namespace = meta.get("namespace") or "default"
    return [AnnotationError(
        "bad-value", f"{REPLACES_ANNOTATION} {str(replaces)[:80]!r} must name a pod of this namespace as "
        f"{namespace}/NAME: the Ray bridge writes it on a trainer's replacement, which replaces a pod of its own "
        "namespace only")]


def _replaces(meta: dict) -> str:
    """The pod the Ray bridge made this one to replace (namespace/name), only within the pod's own namespace.

    The tenant can write this annotation too: it only steers the pod to the node a move plan named
    for the replaced trainer, room the pod could have taken anyway (extender/moves.py)."""
    value = (meta.get("annotations") or {}).get(REPLACES_ANNOTATION)
    namespace = meta.get("namespace") or "default"
    if not isinstance(value, str) or len(value) > 2 * MAX_NAME_CHARS + 1 or not value.startswith(f"{namespace}/"):
        return ""
    name = value[len(namespace) + 1:]
    return value if name and "/" not in name else ""


def _deadline(spec: dict) -> float | None:
    """spec.activeDeadlineSeconds, the run's bound the kubelet enforces (a positive integer, as the API server
    validates it); None when absent or of any other shape."""
    value = spec.get("activeDeadlineSeconds")
    return float(value) if type(value) is int and value > 0 else None


def _kube_refusal(status: object) -> str:
    """kube-scheduler's message on a pod it marked Unschedulable ('0/3 nodes are available: ...'), else ''."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            message = c.get("message")
            return message[:1000] if isinstance(message, str) else ""
    return ""


def _nominated_node(status: object) -> str:
    """status.nominatedNodeName (kube-scheduler writes it; a node name is at most 253 characters), else ''."""
    value = status.get("nominatedNodeName") if isinstance(status, dict) else None
    return value if isinstance(value, str) and len(value) <= 253 else ""


def pod_expected_runtime(annotations: dict, node: str) -> float | None:
    """The run time the pod declares; unreadable on a bound pod: unknown (pending, annotation_problems refused it)."""
    try:
        return decode_expected_runtime(annotations)
    except RequestError:
        if not node:
            raise
        return None


def pod_priority(spec: dict, node: str) -> int:
    """spec.priority, an int32 (0 when unset, as kube-scheduler reads it); unreadable on a bound pod: 0."""
    value = spec.get("priority")
    if value is None:
        return 0
    try:
        return whole(value, -2**31, 2**31 - 1, "spec.priority")
    except RequestError:
        if not node:
            raise
        return 0


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
    name = text(meta.get("name") or "", "Node.metadata.name")
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(ann, dict):
        raise RequestError(f"node {name}: labels and annotations must be objects")
    alloc = status.get("allocatable") or status.get("capacity") or {}
    if not isinstance(alloc, dict):
        raise RequestError(f"node {name}: status.allocatable must be an object")
    cpu = _amount(quantity(alloc.get("cpu", "0"), f"node {name} cpu") * 1000, f"node {name} cpu")
    memory = _amount(quantity(alloc.get("memory", "0"), f"node {name} memory") / MIB, f"node {name} memory")
    count = int(quantity(alloc.get(GPU_RESOURCE, "0"), f"node {name} {GPU_RESOURCE}"))
    if count > MAX_GPUS_PER_NODE:
        raise RequestError(f"node {name}: {count} {GPU_RESOURCE}, more than {MAX_GPUS_PER_NODE} on one node")
    model = printable(labels.get(MODEL_LABEL, ""), f"node {name} label {MODEL_LABEL}")
    raw_memory = labels.get(MEMORY_LABEL, "0")
    memory_per_gpu = int(raw_memory) if isinstance(raw_memory, str) and DIGITS.fullmatch(raw_memory) else 0
    gpus = tuple(GpuInfo(i, model=model, memory_mib=memory_per_gpu) for i in range(count))
    if ann.get(INVENTORY_ANNOTATION):
        gpus = decode_inventory(ann[INVENTORY_ANNOTATION], name, model)
        if gpus:
            model = gpus[0].model or model
            memory_per_gpu = gpus[0].memory_mib or memory_per_gpu
    reserved = tuple(g.reserved_milli for g in gpus)
    spec = NodeSpec(name=name, cpu_milli=cpu, memory_mib=memory, gpu_count=len(gpus), gpu_model=model,
                    gpu_memory_mib=memory_per_gpu, gpu_reserved=reserved if any(reserved) else ())
    kept = tuple((k, v) for k, v in list(labels.items())[:512] if isinstance(k, str) and isinstance(v, str))
    return NodeInventory(spec, gpus, node_taints(node), kept)
