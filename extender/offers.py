"""Offers: the nodes kube-scheduler let a pod be tried on, as its last filter call named them.

kube-scheduler asks the extender only about nodes its own filters passed (node selector and affinity,
pod affinity, ports, volumes, its own resource count). Two jobs need that list after the call:

  * preemption and moves plan only there: without it, a pod whose nodeSelector matched no node had
    trainers moved and pods evicted for it, round after round, for room it could never take. Kept per
    pod, for pods whose last filter passed no node (`note`, `nodes`).
  * gang admission places a gang's members only where kube-scheduler's own filters let it
    (gangs.py): kept per gang, as node masks (`mask`, `allows`).

A set of nodes is kept as one bit per node: 1000 pods each offered a different 4999 of 5000 nodes kept
513 MB as sets of names, 625 bytes each as bits. Bits of deleted nodes are not reused; past 4 per node
now (64 at least) all are forgotten, and `epoch` says so to whoever keeps masks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from .core.cluster import Cluster

MAX_OFFERED = 4096  # pods whose last filter passed no node, with the nodes kube-scheduler offered

Mask = int | None  # one bit per node; None: every node of the cluster


class Offers:
    """The offer memory; under the extender's lock."""

    def __init__(self, cluster: Cluster, limit: int = MAX_OFFERED) -> None:
        self.cluster, self.limit = cluster, limit
        self.epoch = 0  # bumped whenever the bits are renumbered: masks from an older epoch mean nothing
        self._bit: dict[str, int] = {}  # node name -> its bit
        self._by_pod: OrderedDict[str, tuple[str, Mask]] = OrderedDict()  # uid -> (key, mask), oldest first

    def mask(self, names: Collection[str]) -> Mask:
        """`names` (those in the cluster) as a mask; None when they are every node of the cluster."""
        by_name = self.cluster.by_name
        known = [n for n in names if n in by_name]
        if len(set(known)) >= len(by_name):
            return None
        if len(self._bit) > 4 * max(64, len(by_name)):
            self._bit.clear()
            self._by_pod.clear()  # each pod's offer is noted again at its next filter
            self.epoch += 1
        mask = 0
        bit = self._bit
        for name in known:
            mask |= 1 << bit.setdefault(name, len(bit))
        return mask

    def allows(self, mask: Mask, name: str) -> bool:
        if mask is None:
            return True
        b = self._bit.get(name)
        return b is not None and bool(mask >> b & 1)

    def note(self, uid: str, key: str, names: Iterable[str]) -> None:
        """The pod `uid` (namespace/name `key`) passed none of `names` at its filter: remember where it was offered."""
        self._by_pod[uid] = (key, self.mask(list(names)))
        self._by_pod.move_to_end(uid)
        while len(self._by_pod) > self.limit:
            self._by_pod.popitem(last=False)

    def forget(self, uid: str) -> None:
        self._by_pod.pop(uid, None)

    def offered(self, uid: str, key: str, failed: Iterable[str]) -> list[str] | None:
        """The nodes of `failed` offered to the pod at its last filter that passed none; None when none is remembered."""
        got = self._by_pod.get(uid)
        if got is None or got[0] != key:
            return None
        return [n for n in failed if self.allows(got[1], n)]
