"""The GPU side of a node: NVML inventory published to Kubernetes, and slices enforced in the container.

  * `tessera agent` (gpu_sharing.cli, .agent): the DaemonSet; backends in .nvml and .static;
  * `tessera-launch -- CMD` (.launch) and `gpu_sharing.apply()` (.apply): enforcement in the pod.
docs/gpu-sharing.md says what each guarantees.
"""


def apply(env=None):
    """Enforce the pod's slice in this Python process (see gpu_sharing.apply.apply)."""
    from .apply import apply as _apply

    return _apply(env)
