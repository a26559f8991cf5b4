"""Checkpoints: an in-memory replica held by an actor on another node, and durable files.

The replica is for speed (a restart loads bytes from memory, not from storage); the files survive
the whole Ray cluster. Both are newest-wins by step number.
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
