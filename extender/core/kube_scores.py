"""kube-scheduler 1.20's default score plugins that depend on node state (cpu and memory).

NodeResourcesLeastAllocated and NodeResourcesBalancedAllocation, 0..100 each, computed on the
node's requested resources *including the pod being scheduled*, as in 1.20's
`pkg/scheduler/framework/plugins/noderesources`. Extended resources (GPUs) are not counted by
default. Used by `k8s-default` and by the simulator's kube-scheduler replay.
"""

from __future__ import annotations

from .cluster import NodeState
from .model import PodRequest

NONZERO_CPU_MILLI = 100  # kube-scheduler scores a pod with no CPU request as 100m
NONZERO_MEMORY_MIB = 200  # ... and no memory request as 200 MiB
MAX_PLUGINS_SCORE = 200  # the two plugins' scores, 0..100 each, summed


def least_allocated(pod: PodRequest, node: NodeState) -> int:
    cpu_cap, mem_cap = node.spec.cpu_milli, node.spec.memory_mib
    cpu_req = cpu_cap - node.cpu_free + (pod.cpu_milli or NONZERO_CPU_MILLI)
    mem_req = mem_cap - node.memory_free + (pod.memory_mib or NONZERO_MEMORY_MIB)
    return (_least(cpu_req, cpu_cap) + _least(mem_req, mem_cap)) // 2


def _least(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * 100 // capacity


def balanced_allocation(pod: PodRequest, node: NodeState) -> int:
    cpu_cap, mem_cap = node.spec.cpu_milli, node.spec.memory_mib
    if cpu_cap == 0 or mem_cap == 0:
        return 0
    cpu_frac = (cpu_cap - node.cpu_free + (pod.cpu_milli or NONZERO_CPU_MILLI)) / cpu_cap
    mem_frac = (mem_cap - node.memory_free + (pod.memory_mib or NONZERO_MEMORY_MIB)) / mem_cap
    if cpu_frac >= 1 or mem_frac >= 1:
        return 0
    return int((1 - abs(cpu_frac - mem_frac)) * 100)


def default_plugins_score(pod: PodRequest, node: NodeState) -> int:
    """The state-dependent part of 1.20's default score total (weight 1 each)."""
    return least_allocated(pod, node) + balanced_allocation(pod, node)
