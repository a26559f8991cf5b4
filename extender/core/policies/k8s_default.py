"""`k8s-default`: what stock Kubernetes does with GPUs.

The device plugin hands out whole `nvidia.com/gpu` only, so a fractional pod takes a whole
GPU; kube-scheduler's default scoring (LeastAllocated + BalancedAllocation on CPU and memory)
spreads pods; the device plugin gives the lowest-indexed free GPUs.
"""

from __future__ import annotations

from dataclasses import replace

from ..cluster import NodeState
from ..kube_scores import default_plugins_score
from ..model import MILLI_PER_GPU, PodRequest
from ..policy import NodeScore, Policy, lowest_gpus, register


@register
class K8sDefault(Policy):
    name = "k8s-default"
    uses_extender = False

    def request_for(self, pod: PodRequest) -> PodRequest:
        if pod.is_slice:
            return replace(pod, gpu_milli=MILLI_PER_GPU)
        return pod

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        return NodeScore(default_plugins_score(pod, node), lowest_gpus(node, pod))

    def extender_scores(self, scores):
        return [0] * len(scores)
