"""Ray resources that name a Kubernetes node and a GPU slice, and the actor options built from them.

Kubernetes (with Tessera) decides where a pod runs and which GPU slice it holds; Ray must not
decide again. Each Ray node that runs on Kubernetes node N advertises
  * `tessera-node:N` = NODE_UNITS (one unit per actor: pins actors to that node), and
  * `tessera-gpu:N:i` = 1000 for each GPU i (the slice, in Tessera's milli),
and a trainer asks for `tessera-node:N` = 1, `tessera-gpu:N:i` = milli for each assigned GPU, and
`num_gpus` = GPUs x milli / 1000 so Ray's own GPU count agrees. Ray's logical GPU ids would
overwrite CUDA_VISIBLE_DEVICES; the trainer sets it from the assigned UUIDs instead.
"""

from __future__ import annotations

from .contract import Slice

NODE_UNITS = 1000
NODE_PREFIX = "tessera-node:"
POD_PREFIX = "tessera-pod:"
GPU_PREFIX = "tessera-gpu:"


def node_resource(node: str) -> str:
    return f"{NODE_PREFIX}{node}"


def pod_resource(pod: str) -> str:
    """The resource a member pod's Ray node advertises (raybridge/job.py): `namespace/name` as `ns.name`."""
    return POD_PREFIX + pod.replace("/", ".", 1)


def gpu_resource(node: str, index: int) -> str:
    return f"{GPU_PREFIX}{node}:{index}"


def node_resources(node: str, gpus: int = 0) -> dict[str, float]:
    """What a Ray node on Kubernetes node `node` advertises (`ray start --resources`)."""
    res = {node_resource(node): float(NODE_UNITS)}
    res.update({gpu_resource(node, i): 1000.0 for i in range(gpus)})
    return res


def trainer_options(s: Slice) -> dict:
    """ray.remote options for the trainer of a pod bound with slice `s`."""
    if s.pod:  # in the job's own pods: the member's Ray node advertises only its own assignment
        resources = {pod_resource(s.pod): 1.0}
    else:
        resources = {node_resource(s.node): 1.0}
        resources.update({gpu_resource(s.node, i): float(s.milli) for i in s.gpus})
    opts: dict = {"num_cpus": 0, "resources": resources, "max_restarts": 0, "max_concurrency": 1}
    if s.num_gpus:
        opts["num_gpus"] = s.num_gpus
        # Ray would set CUDA_VISIBLE_DEVICES to its logical ids; Tessera's UUIDs win (trainer.py).
        opts["runtime_env"] = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    return opts
