"""The extender's plain state: what it knows of pods and nodes, the errors of a bind, and the binder's interface.

Values only: frozen dataclasses and exceptions, built by the Kubernetes adapter (translate/objects.py
reads API objects into them) and held by the service. This module imports the core's data model and
the shared contract, nothing from the shells (kube/, http/, sim/, serve, cli), so the service and
any module that takes over one of its jobs can use these types without importing the adapter.

Why here and not in extender/core: the core is the placement engine the simulator shares (it
places `PodRequest`s on `NodeSpec`s, knowing nothing of UIDs, MACs, taints or API writes); these
are the server's vocabulary around it. `Gang` and `GpuInfo` are the contract's decoded values
(tessera_contract.annotations), re-exported so the service imports its state from one place.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from tessera_contract import Gang, GpuAssignment, GpuInfo, MacSigner, encode_assignment

from .core.model import Assignment, NodeSpec, PodRequest

__all__ = [
    "BLOCKING_EFFECTS", "NO_TOLERATIONS", "AlreadyBound", "BindError", "BindFailure", "Binder", "Gang", "GpuInfo",
    "NodeInventory", "NodeTerms", "NotReady", "PodGroup", "PodInfo", "Taint", "Tolerations",
]

# --- taints and tolerations (matching: translate/taints.py's docstring) ----------------------------------------

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule is a preference for the scorers


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Tolerations:
    """A pod's tolerations: `exists` holds (key, effect), `equal` (key, value, effect); "" is a wildcard.

    Two sets, so checking one taint is a handful of set lookups however many tolerations a pod
    lists (a hostile pod may list thousands).
    """

    exists: frozenset[tuple[str, str]] = frozenset()
    equal: frozenset[tuple[str, str, str]] = frozenset()

    def tolerates(self, taint: Taint) -> bool:
        k, v, e = taint.key, taint.value, taint.effect
        ex, eq = self.exists, self.equal
        return bool(
            (ex and ((k, e) in ex or (k, "") in ex or ("", e) in ex or ("", "") in ex))
            or (eq and ((k, v, e) in eq or (k, v, "") in eq or ("", v, e) in eq or ("", v, "") in eq))
        )

    def first_untolerated(self, taints: tuple[Taint, ...]) -> Taint | None:
        return next((t for t in taints if not self.tolerates(t)), None)


NO_TOLERATIONS = Tolerations()

# --- nodes and pods ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInventory:
    spec: NodeSpec
    gpus: tuple[GpuInfo, ...]
    taints: tuple[Taint, ...] = ()  # NoSchedule/NoExecute only
    labels: tuple[tuple[str, str], ...] = ()  # the node's labels, for the node selectors kube-scheduler applies


@dataclass(frozen=True, slots=True)
class NodeTerms:
    """Where a pod may go by node labels: every `selector` pair, and (if any `terms`) one term whose every
    (key, operator, values) expression holds; `metadata.name` expressions are matchFields on the node's name."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[tuple[str, str, Collection[str]], ...], ...] = ()  # In / NotIn values: a frozenset

    @property
    def size(self) -> int:
        """Selector pairs and expressions: the lookups `admits` makes on one node, at most (the cost a caller budgets)."""
        return len(self.selector) + sum(map(len, self.terms))

    def admits(self, name: str, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        return not self.terms or any(term and all(_holds(e, name, labels) for e in term) for term in self.terms)


def _holds(expression: tuple[str, str, Collection[str]], name: str, labels: dict[str, str]) -> bool:
    key, op, values = expression
    value = name if key == "metadata.name" else labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            bound = int(next(iter(values)))
            return int(value) > bound if op == "Gt" else int(value) < bound
        except ValueError:
            return False
    return False


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
    kid: str = ""  # the key id its MAC names, valid or not (kube/keyring.py: keys_in_use, check_keys)
    tolerations: Tolerations = NO_TOLERATIONS
    priority: int = 0  # spec.priority, which the priority admission plugin fills from the PriorityClass (preemption)
    terminating: bool = False  # metadata.deletionTimestamp is set: it is leaving (preemption never picks it)
    nominated_node: str = ""  # status.nominatedNodeName, kube-scheduler's own preemption's choice for a pending pod
    kube_refusal: str = ""  # kube-scheduler's Unschedulable message (its PodScheduled condition), at most 1000 chars
    # its nodeSelector and required node affinity, as kube-scheduler's NodeAffinity plugin reads them (node_match)
    node_terms: NodeTerms | None = None
    # Reservations with backfill (queue_reservations.py), epoch seconds: metadata.creationTimestamp (the API
    # server's, not the tenant's), status.startTime (the kubelet's), and the run time the pod declares.
    created_s: float | None = None
    started_s: float | None = None
    expected_runtime_s: float | None = None
    # when its last container finished (status.containerStatuses[].state.terminated.finishedAt, the kubelet's), epoch
    # seconds, on a pod that finished: its run, for the estimates of its namespace's silent pods (run_estimates.py)
    finished_s: float | None = None
    # spec.activeDeadlineSeconds: the kubelet stops the pod that long after it started, so it bounds the run (short_first_queue)
    deadline_s: float | None = None
    # Moves (moves.py, kube/preemptor.py): the owner let Tessera move this trainer of an elastic Ray job; and, on a pod the
    # Ray bridge made, the pod it replaces (namespace/name, same namespace only).
    movable: bool = False
    replaces: str = ""
    # The scheduler-plugins PodGroup the pod's label `scheduling.x-k8s.io/pod-group` names (namespace/name), "" if
    # none: a gang whose size the PodGroup object says (gangs.py), as Kubeflow's training operator and KubeRay make them.
    pod_group: str = ""
    # What kube-scheduler's own filters read of the pod (resources, node selector and affinity, tolerations, pod
    # (anti-)affinity, topology spread, host ports, volumes), as a digest: two members of one gang with the same
    # digest get the same verdict from kube-scheduler on every node at one moment ("" outside gangs; gangs.py).
    kube_shape: str = ""
    # its placement depends on other pods' (pod affinity, anti-affinity, topology spread): kube-scheduler binds it (gangs.py)
    placed_by_peers: bool = False
    # Preemption's rules (displacement.py `refusal`): spec.preemptionPolicy is not Never (the Priority admission
    # plugin copies it from the PriorityClass), and spec.schedulerName, the kube-scheduler profile the pod asked for
    # (the apiserver defaults it to default-scheduler). Tessera evicts and moves pods only for a pod that may preempt
    # and whose scheduler it serves.
    preempts: bool = True
    scheduler_name: str = "default-scheduler"
    # Drain leases (queue_reservations.py): the uid of the pod's controller (its ownerReference marked controller), ""
    # with none, and whether its owner lets it be evicted (cluster-autoscaler.kubernetes.io/safe-to-evict is not
    # "false"). Only a pod with a controller that may be evicted is leased: its controller makes a new pod.
    controller_uid: str = ""
    evictable: bool = True

    @property
    def declared_run_s(self) -> float | None:
        """The run the pod declares to reservations: the shorter of its deadline (the kubelet stops it there) and its
        expected runtime (a hint nothing enforces); None with neither. The deadline is what short-first reads too, so
        one number serves both rules, as in time mode."""
        runs = [r for r in (self.deadline_s, self.expected_runtime_s) if r is not None]
        return min(runs) if runs else None

    @property
    def in_gang(self) -> bool:
        """A member of a gang, by Tessera's annotations or a PodGroup label: placed all together or not at all."""
        return self.gang is not None or bool(self.pod_group)


@dataclass(frozen=True, slots=True)
class PodGroup:
    """scheduler-plugins' PodGroup (`scheduling.x-k8s.io/v1alpha1`) as Tessera reads it: the gang its labelled pods form.

    `min_member` members must be placed together before any is bound; more may exist (an elastic job may start
    with that many and grow). `timeout_s` (spec.scheduleTimeoutSeconds) bounds how long an admitted gang's GPUs are
    held for members not bound yet; None: Tessera's default.
    """

    key: str  # namespace/name
    min_member: int
    timeout_s: float | None = None


# --- binding ----------------------------------------------------------------------------------------------


def refusal_reasons(kube_refusal: str) -> list[str]:
    """kube-scheduler's Unschedulable message ('0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s)
    didn't match node selector.') as its reasons, each with its node count ('2 Insufficient nvidia.com/gpu')."""
    return kube_refusal.partition(": ")[2].rstrip(".").split(", ")


class NotReady(RuntimeError):
    """The cache has not finished its first full sync: answering now would mean an empty cluster."""


class BindError(RuntimeError):
    """A bind that cannot be honoured; the text goes back to kube-scheduler."""


class AlreadyBound(BindError):
    """The pod is bound to the very node the bind names already (Tessera bound a gang member itself first)."""


class BindFailure(RuntimeError):
    """The API refused the bind's write."""

    def __init__(self, message: str, already_on: str = "") -> None:
        super().__init__(message)
        self.already_on = already_on  # the node the API says the pod is bound to (409), if any


class Binder(Protocol):
    """Writes a decision to the API: the Binding, with the assignment annotations merged into the pod."""

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None: ...


def assignment_annotations(a: Assignment, uuids: tuple[str, ...] = (), signer: MacSigner | None = None,
                           uid: str = "") -> dict[str, str]:
    """What bind writes on the pod: which GPUs, milli each, their UUIDs (`uuids` is the node's, per GPU), and a MAC.

    Here, beside the state it encodes, because the bind transaction (extender/binding.py) writes it and
    must not import the Kubernetes adapter (tests/test_import_graph.py)."""
    ids = tuple(uuids[g] if g < len(uuids) and uuids[g] else str(g) for g in a.gpus)
    return encode_assignment(GpuAssignment(a.node, a.gpus, a.milli, ids), signer, uid)
