"""A real multi-node Ray cluster on one machine, its nodes named like Kubernetes nodes.

For tests and benchmarks (`ray.cluster_utils.Cluster`). Every node advertises the resources
placement.py names (`tessera-node:<name>`, `tessera-gpu:<name>:<i>`) and fake GPUs, so trainers
land exactly where the Kubernetes side put their pods. The environment follows
docs/ray-notes.md §2-§5: no usage stats, no auth token, loopback addresses, fast health checks (a
killed node is declared dead in under a second, §4), no dashboard. `add_node` must run in the main thread.
"""

from __future__ import annotations

import os
import signal

from .placement import node_resources

ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "TESSERA_GLOO_HOST": "127.0.0.1",
    "RAY_DEDUP_LOGS": "1",
}
FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 200, "health_check_timeout_ms": 500,
               "health_check_failure_threshold": 3}


def ray_missing() -> str:
    """Why Ray training cannot run here ('' when it can): for skips with a reason.

    Sets ENV first: Ray reads some of it (the loopback address) when it is imported."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    try:
        import numpy  # noqa: F401
        import ray  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return f"the ray extra is not installed ({e.name} missing): pip install -e '.[ray]'"
    return ""


class LocalRayCluster:
    """Head (runs the driver's helpers) plus one Ray node per named Kubernetes node."""

    def __init__(self, head_cpus: int = 1, gpus_per_node: int = 2, node_cpus: int = 1) -> None:
        ray_missing()
        from ray.cluster_utils import Cluster

        self.gpus_per_node, self.node_cpus = gpus_per_node, node_cpus
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=head_cpus, num_gpus=0, include_dashboard=False, object_store_memory=150 * 1024 * 1024,
            _system_config=FAST_HEALTH))
        self.nodes: dict[str, object] = {}

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, name: str, gpus: int | None = None, cpus: int | None = None) -> None:
        gpus = self.gpus_per_node if gpus is None else gpus
        self.nodes[name] = self.cluster.add_node(num_cpus=self.node_cpus if cpus is None else cpus, num_gpus=gpus,
                                                 resources=node_resources(name, gpus),
                                                 object_store_memory=100 * 1024 * 1024)
        self.cluster.wait_for_nodes()

    def kill(self, name: str, whole_node: bool = True) -> None:
        """SIGKILL the node's processes, as a lost Kubernetes node (or a killed pod) would: no graceful exit.

        `whole_node`: the raylet and every process under it (its workers: the trainers) die at the
        same instant, as on a machine that goes away. cluster_utils alone kills only the raylet and its
        helpers; its workers notice 0.3-0.9 s later and exit by themselves (`whole_node=False`)."""
        node = self.nodes.pop(name)
        if whole_node:
            raylet = [p.process.pid for p in node.all_processes.get("raylet", [])]
            for pid in descendants(raylet):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.cluster.remove_node(node, allow_graceful=False)

    def connect(self):
        import ray

        ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
        return ray

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def descendants(roots: list[int]) -> list[int]:
    """Every process below `roots` (Linux /proc), children first, then the roots' own children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
