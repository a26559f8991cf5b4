"""CPU preprocessing actors feeding the trainers (the "CPU preprocessing + GPU training" split).

Stateless and deterministic in (step, samples): Ray's own restart is enough for them, and a
trainer receives the same samples whichever preprocessor produced them. Placed by their own
resource request (num_cpus), not on the trainers' pods.
"""

from __future__ import annotations

import os

from .workload import load_entrypoint


class Preprocessor:
    def __init__(self, entrypoint: str, config: dict) -> None:
        import torch

        torch.set_num_threads(1)
        self.work = load_entrypoint(entrypoint)(config)
        self.made = 0

    def batch(self, step: int, first: int, stop: int):
        self.made += 1
        return self.work.batch(step, first, stop)

    def where(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "made": self.made}
