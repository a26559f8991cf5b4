"""Which pod a process belongs to, from its cgroup path: how the agent tells slices from out-of-band use.

kubelet puts every container in a cgroup under the pod's, whose name carries the pod UID:
  cgroupfs driver:  .../kubepods/burstable/pod0b5c9c4e-2f71-4f3b-9d55-5f7c3c1d8f1a/<container>
  systemd driver:   .../kubepods-burstable-pod0b5c9c4e_2f71_4f3b_9d55_5f7c3c1d8f1a.slice/cri-containerd-<id>.scope
Processes outside any pod (a user on the host, a daemon) have no such component.
"""

from __future__ import annotations

import re
from pathlib import Path

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)")


def pod_uid_from_cgroup(text: str) -> str:
    """The pod UID named in /proc/PID/cgroup's text (v1 or v2), or "" when the process is no pod's."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _POD.search(path)
        if m:
            return m.group(1).replace("_", "-")
    return ""


def pod_uid_of(pid: int, proc: Path = Path("/proc")) -> str:
    """The pod UID of a process on this host ("" when unknown: gone, no permission, or no pod's).

    The agent runs with hostPID so that NVML's PIDs are the ones in its /proc.
    """
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return ""
