"""The cluster's free capacity, and the one place that changes it.

`Cluster` owns every `NodeState`. Placing and releasing go through it, so the invariant
"no GPU ever gives out more than 1000 milli" is checked in exactly one spot, and every change
bumps the node's `version` so that caches keyed on it (scores, fragmentation) stay correct.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from .model import MILLI_PER_GPU, Assignment, NodeSpec, PodRequest, RequestError


class PlacementError(RuntimeError):
    """A placement that would over-commit a node or GPU, or name something unknown."""


class NodeState:
    """Free capacity of one node. Mutated only by `Cluster`."""

    __slots__ = ("spec", "index", "cpu_free", "memory_free", "gpu_free", "version", "shapes", "pods", "tally")

    def __init__(self, spec: NodeSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.cpu_free = spec.cpu_milli
        self.memory_free = spec.memory_mib
        self.gpu_free = [spec.gpu_open(g) for g in range(spec.gpu_count)]
        self.version = 0
        self.shapes: Counter[str] = Counter()  # GPU shapes of the pods here (Clustering policy)
        self.pods: dict[str, Assignment] = {}
        self.tally = (0, 0, 0)  # what this node adds to the cluster's totals (Cluster._retally)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free)

    @property
    def full_gpus_free(self) -> int:
        return sum(1 for r in self.gpu_free if r == MILLI_PER_GPU)

    def __repr__(self) -> str:
        return f"NodeState({self.name}, cpu={self.cpu_free}, gpu={self.gpu_free})"


def fit_reason(pod: PodRequest, node: NodeState) -> str | None:
    """Why `pod` cannot run on `node` right now, in words; None when it fits."""
    if pod.cpu_milli > node.cpu_free:
        return "insufficient cpu"
    if pod.memory_mib > node.memory_free:
        return "insufficient memory"
    if pod.gpu_count == 0:
        return None
    if node.spec.gpu_count == 0:
        return "node has no GPU"
    if pod.gpu_models and node.spec.gpu_model not in pod.gpu_models:
        return f"GPU model {node.spec.gpu_model} not in {_few(pod.gpu_models)}"
    if pod.gpu_count > node.spec.gpu_count:
        return f"node has {node.spec.gpu_count} GPUs, pod needs {pod.gpu_count}"
    d = pod.gpu_milli
    if sum(1 for r in node.gpu_free if r >= d) < pod.gpu_count:
        if pod.is_slice:
            return f"no GPU has {d} milli free (largest free share {max(node.gpu_free)})"
        return f"only {node.full_gpus_free} whole GPUs free, pod needs {pod.gpu_count}"
    return None


def _few(models: frozenset[str], shown: int = 4) -> str:
    """A few of the pod's models, in a reason kept on every node and echoed into the pod's event."""
    names = sorted(models)
    return "|".join(names[:shown]) + (f" (and {len(names) - shown} more)" if len(names) > shown else "")


def grouped(reason: str) -> str:
    """`reason` without what differs from node to node (the largest free share, the whole GPUs free), so
    kube-scheduler can count equal reasons: it joins one entry per distinct reason into the pod's
    FailedScheduling event, and past 1024 characters the apiserver refuses the event (945 refused in
    one bench/kube_timeline.py run on 100 nodes), so the user saw no reason at all."""
    head = reason.split(" (largest free share ")[0]
    body = head.removeprefix("tessera: ")
    if body.startswith("only ") and " whole GPUs free, pod needs " in body:
        return f"{head[:len(head) - len(body)]}fewer than {body.rsplit(' ', 1)[-1]} whole GPUs free"
    return head


def never_fits(pod: PodRequest, spec: NodeSpec) -> bool:
    """True when the pod could not run on this node even if it were empty (preemption cannot help)."""
    return fit_reason(pod, NodeState(spec, -1)) is not None


def scratch_without(node: NodeState, gone: frozenset[str]) -> Cluster:
    """A one-node copy of `node` with the pods named (namespace/name) gone: trial fits change nothing live.

    Preemption (victims) and defragmentation (core/defrag.py: trainers to move) both ask "would it fit
    once these left", so it lives here, in the core both may import.
    """
    trial = Cluster([node.spec])
    for a in node.pods.values():
        if a.pod not in gone:
            trial.adopt(a)
    return trial


class Cluster:
    """All nodes and the assignments on them."""

    def __init__(self, specs: Iterable[NodeSpec]) -> None:
        self.nodes: list[NodeState] = []
        self.by_name: dict[str, NodeState] = {}
        self.assignments: dict[str, Assignment] = {}
        self._listeners: list[Callable[[NodeState], None]] = []
        self._next_index = 0  # NodeState.index: unique for the cluster's life, never reused
        # totals kept as nodes change, so a gang's size is checked against the cluster in O(1):
        # milli placement may hand out (healthy, not held out-of-band), milli free now, whole GPUs free now
        self.open_milli = 0
        self.free_milli = 0
        self.whole_gpus_free = 0
        for spec in specs:
            self.add_node(spec)

    def add_node(self, spec: NodeSpec) -> NodeState:
        if spec.name in self.by_name:
            raise RequestError(f"duplicate node {spec.name}")
        state = NodeState(spec, self._next_index)
        self._next_index += 1
        self.nodes.append(state)
        self.by_name[spec.name] = state
        self._retally(state)
        self._notify(state)
        return state

    def upsert_node(self, spec: NodeSpec) -> NodeState:
        """Add a node, or give an existing one a new spec; its pods stay and free is recounted.

        A node that shrank below what its pods hold shows negative free CPU or memory (or a GPU
        with less than nothing free) and so takes no new pods until they leave. The same holds
        for a GPU whose reserved milli (out-of-band memory, ill health) grew under its pods.
        """
        node = self.by_name.get(spec.name)
        if node is None:
            return self.add_node(spec)
        if node.spec == spec:
            return node
        node.spec = spec
        node.cpu_free = spec.cpu_milli - sum(a.cpu_milli for a in node.pods.values())
        node.memory_free = spec.memory_mib - sum(a.memory_mib for a in node.pods.values())
        node.gpu_free = [spec.gpu_open(g) for g in range(spec.gpu_count)]
        for a in node.pods.values():
            for g in a.gpus:
                if g < spec.gpu_count:
                    node.gpu_free[g] -= a.milli
        self._changed(node)
        return node

    def remove_node(self, name: str) -> list[Assignment]:
        """Forget a node; returns the assignments that were on it (now dropped)."""
        node = self.by_name.pop(name, None)
        if node is None:
            return []
        self.nodes.remove(node)
        dropped = list(node.pods.values())
        for a in dropped:
            del self.assignments[a.pod]
        node.pods.clear()
        self._changed(node)  # listeners see a node no longer in `by_name`
        return dropped

    def on_change(self, listener: Callable[[NodeState], None]) -> None:
        """Call `listener(node)` after every change to a node, its addition and its removal.

        Incremental measures and indexes hook here; a removed node is no longer in `by_name`.
        """
        self._listeners.append(listener)

    @property
    def gpu_capacity_milli(self) -> int:
        return sum(n.spec.gpu_count for n in self.nodes) * MILLI_PER_GPU

    @property
    def gpu_free_milli(self) -> int:
        """Free milli a new pod could get: a GPU over-committed by its reserve (unhealthy under pods) adds 0, not less."""
        return self.free_milli

    def place(self, pod: PodRequest, node_name: str, gpus: tuple[int, ...]) -> Assignment:
        """Commit `pod` to `gpus` of `node_name`, or raise PlacementError and change nothing."""
        if pod.name in self.assignments:
            raise PlacementError(f"pod {pod.name} is already placed on {self.assignments[pod.name].node}")
        node = self.by_name.get(node_name)
        if node is None:
            raise PlacementError(f"unknown node {node_name}")
        reason = fit_reason(pod, node)
        if reason is not None:
            raise PlacementError(f"pod {pod.name} does not fit {node_name}: {reason}")
        if len(gpus) != pod.gpu_count or len(set(gpus)) != len(gpus):
            raise PlacementError(f"pod {pod.name} needs {pod.gpu_count} distinct GPUs, got {gpus}")
        for g in gpus:
            if not 0 <= g < node.spec.gpu_count:
                raise PlacementError(f"node {node_name} has no GPU {g}")
            if node.gpu_free[g] < pod.gpu_milli:
                raise PlacementError(f"GPU {g} of {node_name} has {node.gpu_free[g]} milli free, pod needs {pod.gpu_milli}")
        assignment = Assignment(
            pod=pod.name, node=node_name, gpus=tuple(gpus), milli=pod.gpu_milli,
            cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, shape=pod.shape(),
        )
        self._apply(node, assignment, +1)
        return assignment

    def release(self, pod_name: str) -> Assignment:
        """Give back everything `pod_name` held."""
        assignment = self.assignments.get(pod_name)
        if assignment is None:
            raise PlacementError(f"unknown pod {pod_name}")
        self._apply(self.by_name[assignment.node], assignment, -1)
        return assignment

    def adopt(self, assignment: Assignment) -> Assignment:
        """Record an assignment made elsewhere (read back from a pod's annotation on restart).

        Refused, changing nothing, if it would over-commit a GPU: a slice is never given twice.
        The GPU's reserved milli do not count here: they are withheld from new placements, but
        a pod that got its slice before the out-of-band use appeared (or the GPU failed) holds it.
        """
        if assignment.pod in self.assignments:
            raise PlacementError(f"pod {assignment.pod} is already placed on {self.assignments[assignment.pod].node}")
        node = self.by_name.get(assignment.node)
        if node is None:
            raise PlacementError(f"unknown node {assignment.node}")
        for g in assignment.gpus:
            if not 0 <= g < node.spec.gpu_count or node.gpu_free[g] + MILLI_PER_GPU - node.spec.gpu_open(g) < assignment.milli:
                raise PlacementError(f"GPU {g} of {assignment.node} cannot hold {assignment.milli} more milli")
        self._apply(node, assignment, +1)
        return assignment

    def _apply(self, node: NodeState, a: Assignment, sign: int) -> None:
        node.cpu_free -= sign * a.cpu_milli
        node.memory_free -= sign * a.memory_mib
        for g in a.gpus:
            if g < len(node.gpu_free):  # a node that shrank under its pods (upsert_node counts only what is left):
                node.gpu_free[g] -= sign * a.milli  # releasing a pod on a GPU now gone must not fail half done
        if sign > 0:
            node.shapes[a.shape] += 1
            node.pods[a.pod] = a
            self.assignments[a.pod] = a
        else:
            node.shapes[a.shape] -= 1
            if node.shapes[a.shape] <= 0:
                del node.shapes[a.shape]
            del node.pods[a.pod]
            del self.assignments[a.pod]
        self._changed(node)

    def _changed(self, node: NodeState) -> None:
        node.version += 1
        self._retally(node)
        self._notify(node)

    def _retally(self, node: NodeState) -> None:
        """Replace the node's share of the totals (none once it is removed): O(its GPUs)."""
        old = node.tally
        if self.by_name.get(node.name) is node:
            spec = node.spec
            new = (sum(spec.gpu_open(g) for g in range(spec.gpu_count)), sum(f for f in node.gpu_free if f > 0),
                   sum(1 for f in node.gpu_free if f == MILLI_PER_GPU))
        else:
            new = (0, 0, 0)
        node.tally = new
        self.open_milli += new[0] - old[0]
        self.free_milli += new[1] - old[1]
        self.whole_gpus_free += new[2] - old[2]

    def _notify(self, node: NodeState) -> None:
        for listener in self._listeners:
            listener(node)
