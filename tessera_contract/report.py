"""The node agent's GPU report: the one document between two programs that is not an annotation.

The agent (gpu_sharing/agent.py) serves it at `REPORT_PATH` on its metrics port; the extender
(extender/kube/agents.py) pulls it from the agent pod on each node and writes that node's Node.
Both sides live here, as the annotations do (annotations.py): `encode_report` as the agent writes
it, `decode_report` as the extender reads it, distrustfully, because a node's agent is as
trustworthy as the node. A document the decoder refuses raises `BadReport` with the reason in
words and its `result` (the label of `tessera_agent_reports_total`).

Per GPU the report carries the device (`GpuDevice`: index, UUID, model, memory, health, MIG mode,
NVLink peers), the memory per pod UID its processes hold and the memory of processes in no pod. It
does not say what is out-of-band: that needs the pods' assignments and the key that signs them,
which only the extender holds. The `node` field is informational: the extender attributes a report
to the node its agent pod was scheduled on, never to the name the report gives.

Bounds (what the decoder accepts): at most MAX_REPORT_BYTES, MAX_GPUS GPUs listed by index 0..n-1,
MAX_PODS_PER_GPU pod UIDs per GPU, MAX_MIB per figure (the inventory annotation's own bound),
printable text of at most MAX_TEXT characters (a node's words reach Events on other tenants' pods,
logs and admins' terminals).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .keys import MAX_GPU_MEMORY_MIB

REPORT_PATH = "/report"
REPORT_VERSION = 1
MAX_REPORT_BYTES = 1 << 20  # 64 GPUs x 4096 pods fit well below; more is hostile
MAX_GPUS = 64
MAX_PODS_PER_GPU = 4096
MAX_MIB = MAX_GPU_MEMORY_MIB  # 16 TiB per GPU: the inventory annotation's own bound (1 PiB here was published, then
# refused by the extender's own watch, and the node's inventory froze at its last good state)
MAX_TEXT = 256
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_mode: bool = False
    healthy: bool = True
    health_reason: str = ""  # why not healthy, in words ("XID 79", "retired pages pending")
    nvlink_peers: tuple[str, ...] = ()  # UUIDs of GPUs on this node reached by NVLink (or PCI bus ids)


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU as the report carries it."""

    device: GpuDevice
    pods: tuple[tuple[str, int], ...]  # (pod UID, MiB its processes hold), sorted by UID
    unattributed_mib: int  # processes in no pod (host daemons, users on the node)
    memory_used_mib: int = 0  # the whole GPU's, as the agent measured it (written, not read: the extender sums pods)


class BadReport(ValueError):
    """A report the extender will not use, with why, in words, and the result it is counted under."""

    def __init__(self, result: str, why: str) -> None:
        super().__init__(why)
        self.result = result


def encode_report(node: str, gpus: tuple[GpuUse, ...]) -> bytes:
    """The JSON the agent serves at REPORT_PATH."""
    out = []
    for g in gpus:
        d = g.device
        out.append({"index": d.index, "uuid": d.uuid, "model": d.model, "memory_mib": d.memory_mib,
                    "healthy": d.healthy, "health_reason": d.health_reason, "mig_mode": d.mig_mode,
                    "nvlink_peers": list(d.nvlink_peers), "memory_used_mib": g.memory_used_mib,
                    "pods": dict(g.pods), "unattributed_mib": g.unattributed_mib})
    return json.dumps({"version": REPORT_VERSION, "node": node, "gpus": out}, separators=(",", ":"),
                      sort_keys=True).encode()


def _int(value, what: str, hi: int = MAX_MIB) -> int:
    if type(value) is not int or not 0 <= value <= hi:  # bool is no int here; floats and strings are refused
        raise BadReport("invalid", f"{what} must be a whole number 0..{hi}")
    return value


def text(value, what: str) -> str:
    """Printable text of at most MAX_TEXT characters, so a lying node cannot write ESC sequences or fake lines."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isprintable():
        raise BadReport("invalid", f"{what} must be printable text of at most {MAX_TEXT} characters")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadReport("invalid", f"{what} must be true or false")
    return value


def decode_report(body: bytes) -> tuple[GpuUse, ...]:
    """A report's GPUs, checked field by field; BadReport('invalid' or 'too_large', why) otherwise. The whole GPU's
    `memory_used_mib` is not read (0 here): nothing in the extender uses it, so it is no reason to refuse a report."""
    if len(body) > MAX_REPORT_BYTES:
        raise BadReport("too_large", f"report longer than {MAX_REPORT_BYTES} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadReport("invalid", f"not JSON: {str(e)[:80]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise BadReport("invalid", "no gpus list")
    if len(doc["gpus"]) > MAX_GPUS:
        raise BadReport("invalid", f"more than {MAX_GPUS} GPUs")
    return tuple(_gpu(i, g) for i, g in enumerate(doc["gpus"]))


def _gpu(i: int, g) -> GpuUse:
    if not isinstance(g, dict):
        raise BadReport("invalid", f"GPU {i} is not an object")
    where = f"GPU {i}"
    if _int(g.get("index"), f"{where} index", MAX_GPUS) != i:
        raise BadReport("invalid", "GPUs must be listed by index 0..n-1")
    peers = g.get("nvlink_peers", [])
    if not isinstance(peers, list) or len(peers) > MAX_GPUS:
        raise BadReport("invalid", f"{where} nvlink_peers must be a list of at most {MAX_GPUS}")
    memory = _int(g.get("memory_mib"), f"{where} memory_mib")
    if memory == 0:
        raise BadReport("invalid", f"{where} memory_mib must be positive")
    device = GpuDevice(index=i, uuid=text(g.get("uuid"), f"{where} uuid"), model=text(g.get("model"), f"{where} model"),
                       memory_mib=memory, mig_mode=_flag(g.get("mig_mode", False), f"{where} mig_mode"),
                       healthy=_flag(g.get("healthy", True), f"{where} healthy"),
                       health_reason=text(g.get("health_reason", ""), f"{where} health_reason"),
                       nvlink_peers=tuple(text(p, f"{where} nvlink peer") for p in peers))
    pods = g.get("pods", {})
    if not isinstance(pods, dict) or len(pods) > MAX_PODS_PER_GPU:
        raise BadReport("invalid", f"{where} pods must be an object of at most {MAX_PODS_PER_GPU} UIDs")
    for uid in pods:
        if not _UID.match(uid):
            raise BadReport("invalid", f"{where}: {uid[:40]!r} is not a pod UID")
    use = tuple(sorted((uid, _int(mib, f"{where} pod memory")) for uid, mib in pods.items()))
    return GpuUse(device, use, _int(g.get("unattributed_mib", 0), f"{where} unattributed_mib"))
