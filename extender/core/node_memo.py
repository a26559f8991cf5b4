"""A small dict per node that is dropped whenever the node changes.

Everything Tessera derives from one node (a policy's verdict, kube-scheduler's plugin scores)
depends only on that node's state and the pod, and a node's state changes only when its
`version` moves, so a memo keyed by node index and checked against the version is always right.
"""

from __future__ import annotations

from .cluster import NodeState


class NodeMemo:
    def __init__(self) -> None:
        self._entries: list[tuple[int, dict]] = []  # by NodeState.index (unique per cluster): (version, memo)

    def of(self, node: NodeState) -> dict:
        """The node's memo for its current state (a fresh one after any change)."""
        entries = self._entries
        if node.index >= len(entries):
            entries.extend([(-1, {})] * (node.index + 1 - len(entries)))  # -1: never a real version
        version, memo = entries[node.index]
        if version != node.version:
            memo = {}
            entries[node.index] = (node.version, memo)
        return memo

    def drop(self, node: NodeState) -> None:
        """Forget a removed node's memo (its index is never reused)."""
        if node.index < len(self._entries):
            self._entries[node.index] = (-1, {})
