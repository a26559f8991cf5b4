"""Which pod the kubelet is admitting, read from its PodResources API.

The kubelet 1.20 names no pod in `Allocate` or `GetPreferredAllocation`, so two pods of one shape bound to one
node at once could not be told apart: the plugin took the oldest first, but the kubelet admits the pods of one
batch by creation time at one-second resolution, the rest in the order its watch cache lists them, so the
younger sometimes came first and got the older one's GPUs (seen once in five runs of the install e2e with a
gang's two members). Two facts of the kubelet's code (`pkg/kubelet/kubelet.go` HandlePodAdditions and
`pkg/kubelet/cm/devicemanager/manager.go`) close the gap:

* it adds a pod to its pod manager just before admitting it, one pod at a time, and admission is where it
  asks the device plugins for that pod's devices, outside its device manager's lock;
* its PodResources API (`List`, on `<root-dir>/pod-resources/kubelet.sock`) lists every pod of the pod manager
  with the devices each container holds.

So while the kubelet waits in `Allocate`, the pod being admitted is the one pod it lists that Tessera assigned
GPUs of this resource and that does not yet hold all of them: pods admitted before hold theirs, pods of the
same batch not yet reached are not listed. plugin.py narrows its choice to those.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from . import api

SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")  # the kubelet's default --root-dir
TIMEOUT_S = 2.0  # a local socket answers in milliseconds; the kubelet waits on Allocate meanwhile


class KubeletPods:
    """A client of one kubelet's PodResources `List`: the devices it holds per pod it knows."""

    def __init__(self, socket: Path = SOCKET, timeout_s: float = TIMEOUT_S) -> None:
        self.socket, self.timeout_s = Path(socket), timeout_s
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._list = self._channel.unary_unary(api.PODRESOURCES_LIST,
                                               request_serializer=api.ListPodResourcesRequest.SerializeToString,
                                               response_deserializer=api.ListPodResourcesResponse.FromString)

    def __call__(self, resource: str) -> dict[str, int]:
        """namespace/name -> how many devices of `resource` the kubelet holds for the pod, for every pod it knows
        (0 for one it is admitting or that asks none)."""
        reply = self._list(api.ListPodResourcesRequest(), timeout=self.timeout_s)
        return {f"{p.namespace}/{p.name}": sum(len(d.device_ids) for c in p.containers for d in c.devices
                                                if d.resource_name == resource)
                for p in reply.pod_resources}

    def close(self) -> None:
        self._channel.close()
