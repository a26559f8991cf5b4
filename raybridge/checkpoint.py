"""Checkpoints: an in-memory replica held by an actor on another node, and durable files.

The replica is for speed (a restart loads bytes from memory, not from storage); the files survive
the whole Ray cluster. Both are newest-wins by step number. `CheckpointManager` is the job
controller's one door to them: when a checkpoint is due, saving one off the step path, and finding
the newest to restore from.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_NAME = re.compile(r"^step-(\d{8})\.pt$")


class CheckpointStore:
    """Wrapped with ray.remote; holds the newest checkpoint bytes of one job."""

    def __init__(self) -> None:
        self.step, self.blob = -1, b""

    def put(self, step: int, blob: bytes) -> int:
        if step > self.step:
            self.step, self.blob = step, blob
        return self.step

    def latest(self) -> tuple[int, bytes] | None:
        return (self.step, self.blob) if self.step >= 0 else None


def write_durable(directory: str, step: int, blob: bytes, keep: int = 2) -> str:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    final = path / f"step-{step:08d}.pt"
    tmp = path / f".step-{step:08d}.pt.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    for old in sorted(p for p in path.iterdir() if _NAME.match(p.name))[:-keep]:
        old.unlink(missing_ok=True)
    return str(final)


def newest_durable(directory: str | None) -> tuple[int, bytes] | None:
    if not directory or not Path(directory).is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in Path(directory).iterdir() if (m := _NAME.match(p.name)))
    if not found:
        return None
    step, p = found[-1]
    return step, p.read_bytes()


class CheckpointManager:
    """One job's checkpoints, for its controller: every `every` steps a member's state goes to the in-memory replica
    (an actor kept on the controller's node, detached with the job so a restarted bridge finds it) and, with a
    `directory`, to a durable file the member writes itself; neither waits on the step."""

    def __init__(self, ray, job: str, every: int, directory: str | None, keep: int, detached: bool) -> None:
        if every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.every, self.directory, self.keep = ray, every, directory, keep
        here = ray.get_runtime_context().get_node_id()
        naming = ({"name": f"tessera-replica:{job}", "namespace": "tessera", "lifetime": "detached", "get_if_exists": True}
                  if detached else {})
        self.replica = ray.remote(CheckpointStore).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True), **naming).remote()

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, step: int, source) -> None:
        """The state of `source` (a member's actor) at `step`: to the replica, and to a file when configured."""
        self.replica.put.remote(step, source.state.remote())
        if self.directory:
            source.save_durable.remote(self.directory, self.keep)

    def newest(self) -> tuple[int, object]:
        """The in-memory replica if it is there and newest, else the durable file, as an object ref; (0, None) for a
        new job."""
        found = []
        try:
            latest = self.ray.get(self.replica.latest.remote(), timeout=30)
            if latest:
                found.append(latest)
        except Exception:  # the replica's node is gone too
            pass
        durable = newest_durable(self.directory)
        if durable:
            found.append(durable)
        if not found:
            return 0, None
        step, blob = max(found, key=lambda x: x[0])
        return step, self.ray.put(blob)

    def durable(self) -> tuple[int, object]:
        """The newest durable file only (the DDP way restores from storage), as an object ref; (0, None) if none."""
        found = newest_durable(self.directory)
        return (found[0], self.ray.put(found[1])) if found else (0, None)
