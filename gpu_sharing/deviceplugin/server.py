"""The device plugin's gRPC plumbing: serve `DevicePlugin` on a unix socket, register with the kubelet,
start again when the kubelet restarts.

The decisions are GpuPlugin's (plugin.py); this file only moves bytes. What the kubelet 1.20 does, read in its
`pkg/kubelet/cm/devicemanager` and measured in tests/e2e/test_nodes_e2e.py:
* A plugin registers by calling `Registration.Register` on `<dir>/kubelet.sock` with the file name of its own
  socket in the same directory; the kubelet then calls `ListAndWatch` and keeps that stream open: each message
  is the whole device list, and the node's capacity and allocatable for the resource follow it.
* A kubelet that starts deletes every socket in the directory, its peers' included, and makes a new
  kubelet.sock: a plugin must notice its socket gone and register again (here: checked every second).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from tessera_contract import GPU_RESOURCE, MILLI_RESOURCE

from . import api
from .plugin import GpuPlugin, Refused

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
ENDPOINTS = {GPU_RESOURCE: "tessera-gpu.sock", MILLI_RESOURCE: "tessera-gpu-milli.sock"}  # the plugin's socket per resource
CHECK_EVERY_S = 1.0  # how soon a kubelet restart is noticed; a stat per second is nothing


class PluginServer:
    """One plugin's socket, its registration and its restarts."""

    def __init__(self, plugin: GpuPlugin, socket_dir: Path, refresh_every_s: float = 5.0, inventory=None) -> None:
        self.plugin, self.dir, self.refresh_every_s = plugin, Path(socket_dir), refresh_every_s
        self.inventory = inventory  # () -> GpuDevices: re-read for health; None: the plugin's list stays
        self.endpoint = ENDPOINTS[plugin.resource]
        self.socket = self.dir / self.endpoint
        self._server: grpc.Server | None = None
        self._kubelet_inode = 0
        self._stopping = threading.Event()
        self._changed = threading.Condition()
        self.registrations = 0

    # --- DevicePlugin ----------------------------------------------------------------------------------

    def _options(self, request, context):
        return api.DevicePluginOptions(get_preferred_allocation_available=True)

    def _device_list(self):
        return api.ListAndWatchResponse(devices=[api.Device(ID=uuid, health=api.HEALTHY if ok else api.UNHEALTHY)
                                                 for uuid, ok in self.plugin.devices()])

    def _list_and_watch(self, request, context):
        sent = self._device_list()
        yield sent
        while context.is_active() and not self._stopping.is_set():
            with self._changed:
                self._changed.wait(timeout=1.0)
            now = self._device_list()
            if now != sent:
                sent = now
                yield now

    def _preferred(self, request, context):
        out = api.PreferredAllocationResponse()
        for c in request.container_requests:
            try:
                chosen = self.plugin.preferred(c.available_deviceIDs, c.must_include_deviceIDs, c.allocation_size)
            except Refused as e:
                log.warning("%s", e)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            out.container_responses.add(deviceIDs=chosen)
        return out

    def _allocate(self, request, context):
        out = api.AllocateResponse()
        for c in request.container_requests:
            try:
                _, gpus, count = self.plugin.allocate(c.devicesIDs)
            except Refused as e:
                log.warning("%s", e)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            env, nodes = self.plugin.container_devices(gpus, count)
            resp = out.container_responses.add()
            resp.envs.update(env)
            for host, inside in nodes:
                resp.devices.add(host_path=host, container_path=inside, permissions="rw")
        return out

    def _pre_start(self, request, context):
        return api.PreStartContainerResponse()

    def _handler(self):
        def unary(fn, req, resp):
            return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                       response_serializer=resp.SerializeToString)
        return grpc.method_handlers_generic_handler(api.PLUGIN_SERVICE, {
            "GetDevicePluginOptions": unary(self._options, api.Empty, api.DevicePluginOptions),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch, request_deserializer=api.Empty.FromString,
                response_serializer=api.ListAndWatchResponse.SerializeToString),
            "GetPreferredAllocation": unary(self._preferred, api.PreferredAllocationRequest, api.PreferredAllocationResponse),
            "Allocate": unary(self._allocate, api.AllocateRequest, api.AllocateResponse),
            "PreStartContainer": unary(self._pre_start, api.PreStartContainerRequest, api.PreStartContainerResponse),
        })

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve on the socket and register; raises when the kubelet does not take the registration."""
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="device-plugin"))
        server.add_generic_rpc_handlers((self._handler(),))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        kubelet = self.dir / KUBELET_SOCKET
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            register = channel.unary_unary(f"/{api.REGISTRATION_SERVICE}/Register",
                                           request_serializer=api.RegisterRequest.SerializeToString,
                                           response_deserializer=api.Empty.FromString)
            register(api.RegisterRequest(version=api.VERSION, endpoint=self.endpoint, resource_name=self.plugin.resource,
                                         options=api.DevicePluginOptions(get_preferred_allocation_available=True)),
                     timeout=10)
        self._kubelet_inode = os.stat(kubelet).st_ino
        self.registrations += 1
        log.info("registered %s with the kubelet at %s: %d GPUs", self.plugin.resource, kubelet, len(self.plugin.gpus))

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self._stopping.clear()

    def _kubelet_restarted(self) -> bool:
        try:
            inode = os.stat(self.dir / KUBELET_SOCKET).st_ino
        except FileNotFoundError:
            return True
        return not self.socket.exists() or inode != self._kubelet_inode

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: serve, and serve and register again whenever the kubelet restarted."""
        last_refresh = 0.0
        while not stop.is_set():
            if self._server is None or self._kubelet_restarted():
                if self._server is not None:
                    log.info("the kubelet restarted (its socket or ours is gone): registering again")
                    self.stop()
                try:
                    self.start()
                except (grpc.RpcError, OSError) as e:
                    log.warning("registration with the kubelet failed (%s); trying again", e)
                    self.stop()
                    stop.wait(CHECK_EVERY_S)
                    continue
            if self.inventory is not None and time.monotonic() - last_refresh >= self.refresh_every_s:
                last_refresh = time.monotonic()
                if self.plugin.refresh(self.inventory()):
                    with self._changed:
                        self._changed.notify_all()
            stop.wait(CHECK_EVERY_S)
        self.stop()
