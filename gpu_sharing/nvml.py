"""The NVML backend (nvidia-ml-py's `pynvml`): what the driver itself says about the node's GPUs.

Health: a GPU turns unhealthy on a critical XID event (every XID except those an application
causes by itself: 13, 31, 43, 45, 68, 109, which kill the process, not the GPU), on retired pages
or row remaps waiting for a reset, or when NVML reports it lost. Like the NVIDIA device plugin, it
stays unhealthy until the agent restarts (after the node's GPUs were reset or replaced).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .cgroups import pod_uid_of
from .devices import BackendUnavailable, GpuDevice, GpuProcess, GpuSample

log = logging.getLogger(__name__)

MIB = 1024 * 1024
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"

    def __init__(self, proc: Path = Path("/proc"), pod_of: Callable[[int], str] | None = None) -> None:
        try:
            import pynvml
        except ImportError:
            raise BackendUnavailable("nvidia-ml-py (pynvml) is not installed (pip install 'tessera[nvml]')") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise BackendUnavailable(f"NVML cannot start: {e} (no NVIDIA driver on this node?)") from None
        self._pod_of = pod_of or (lambda pid: pod_uid_of(pid, proc))
        self._bad: dict[int, str] = {}  # index -> why it went unhealthy; sticky until restart
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._events = self._register_xids()
        self.driver = _text(pynvml.nvmlSystemGetDriverVersion())

    def close(self) -> None:
        try:
            if self._events is not None:
                self.nv.nvmlEventSetFree(self._events)
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    # -- inventory -------------------------------------------------------------------------------

    def inventory(self) -> tuple[GpuDevice, ...]:
        nv = self.nv
        self._drain_xids()
        buses = {self._bus(h): i for i, h in enumerate(self._handles)}
        uuids = [self._try(lambda h=h: _text(nv.nvmlDeviceGetUUID(h)), "") for h in self._handles]
        out = []
        for i, h in enumerate(self._handles):
            memory = self._try(lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).total // MIB, 0, lost=i)
            self._check_pages(i, h)
            out.append(GpuDevice(
                index=i, uuid=uuids[i], model=self._try(lambda h=h: _text(nv.nvmlDeviceGetName(h)), ""),
                memory_mib=int(memory), mig_mode=self._mig(h), healthy=i not in self._bad,
                health_reason=self._bad.get(i, ""), nvlink_peers=self._peers(h, buses, uuids),
            ))
        return tuple(out)

    def _mig(self, h) -> bool:
        current = self._try(lambda: self.nv.nvmlDeviceGetMigMode(h)[0], 0)
        return current == self.nv.NVML_DEVICE_MIG_ENABLE

    def _bus(self, h) -> str:
        return self._try(lambda: _text(self.nv.nvmlDeviceGetPciInfo(h).busId).lower(), "")

    def _peers(self, h, buses: dict[str, int], uuids: list[str]) -> tuple[str, ...]:
        nv, peers = self.nv, []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                bus = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
            except nv.NVMLError:
                break  # no NVLink, or past the last link
            peer = uuids[buses[bus]] if bus in buses else bus  # an NVSwitch shows as its bus id
            if peer not in peers:
                peers.append(peer)
        return tuple(peers)

    def _check_pages(self, i: int, h) -> None:
        nv = self.nv
        if self._try(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h), 0):
            self._mark(i, "retired pages pending (needs a GPU reset)")
        rows = self._try(lambda: nv.nvmlDeviceGetRemappedRows(h), None)
        if rows is not None and (rows[2] or rows[3]):  # (corrected, uncorrected, pending, failure)
            self._mark(i, "row remapping " + ("failed" if rows[3] else "pending (needs a GPU reset)"))

    # -- health events ---------------------------------------------------------------------------

    def _register_xids(self):
        nv = self.nv
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("XID events unavailable (%s): health comes from page retirement only", e)
            return None
        for i, h in enumerate(self._handles):
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError as e:
                log.warning("GPU %d: XID events unavailable (%s)", i, e)
        return events

    def _drain_xids(self) -> None:
        nv = self.nv
        if self._events is None:
            return
        handles = dict(enumerate(self._handles))
        while True:
            try:
                event = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                return
            xid = int(event.eventData)
            if xid in APPLICATION_XIDS:
                continue
            index = next((i for i, h in handles.items() if self._same(h, event.device)), None)
            if index is None:  # the event names no single GPU: every GPU is suspect
                for i in handles:
                    self._mark(i, f"XID {xid}")
            else:
                self._mark(index, f"XID {xid}")

    def _same(self, handle, device) -> bool:
        try:
            return _text(self.nv.nvmlDeviceGetUUID(handle)) == _text(self.nv.nvmlDeviceGetUUID(device))
        except self.nv.NVMLError:
            return False

    def _mark(self, i: int, why: str) -> None:
        if i not in self._bad:
            log.warning("GPU %d unhealthy: %s", i, why)
            self._bad[i] = why

    def _try(self, fn, default, lost: int | None = None):
        try:
            return fn()
        except self.nv.NVMLError as e:
            if lost is not None and getattr(e, "value", None) == self.nv.NVML_ERROR_GPU_IS_LOST:
                self._mark(lost, "GPU lost (fell off the bus)")
            return default

    # -- samples ---------------------------------------------------------------------------------

    def sample(self) -> tuple[GpuSample, ...]:
        nv = self.nv
        out = []
        for i, h in enumerate(self._handles):
            util = self._try(lambda h=h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu), 0.0, lost=i)
            used = self._try(lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used // MIB, 0, lost=i)
            procs: dict[int, int] = {}
            for fn in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
                for p in self._try(lambda h=h, fn=fn: fn(h), []):
                    mib = (p.usedGpuMemory or 0) // MIB  # None under MIG or without permission
                    procs[p.pid] = max(procs.get(p.pid, 0), mib)
            out.append(GpuSample(i, util, int(used), tuple(
                GpuProcess(pid, mib, self._pod_of(pid)) for pid, mib in sorted(procs.items()))))
        return tuple(out)
