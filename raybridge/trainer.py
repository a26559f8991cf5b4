"""The trainer actor: one per job pod, on the Ray node of that pod's Kubernetes node.

Holds the model and optimizer; a step computes its share of the step's global batch, averages
gradients with an allreduce among the trainers (never through the driver), and applies them.
Steps are idempotent by number: Ray or the controller may deliver a step twice (at-least-once),
and a second delivery returns the recorded loss instead of stepping again.
"""

from __future__ import annotations

import io
import os
import time

from .collective import CollectiveBroken, Rendezvous, allreduce_sum, form_group
from .workload import load_entrypoint, shard


class StepOutOfOrder(RuntimeError):
    """The controller asked for a step this trainer cannot take next (its state is behind or ahead)."""


class Trainer:
    """Wrapped with ray.remote by the worker group (placement.py decides the options)."""

    def __init__(self, name: str, entrypoint: str, config: dict, uuids: tuple[str, ...] = ()) -> None:
        if uuids:  # the pod's GPUs as Tessera assigned them, before anything touches CUDA
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        import torch

        torch.set_num_threads(int(config.get("threads", 1)))
        self.torch = torch
        self.name = name
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.work = load_entrypoint(entrypoint)(config)
        self.work.model.to(self.device)
        self.params = [p for p in self.work.model.parameters() if p.requires_grad]
        self.step = 0
        self.losses: dict[int, float] = {}
        self.group = None
        self.rank, self.world = 0, 1

    def ready(self) -> dict:
        import ray

        return {"name": self.name, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "step": self.step, "device": str(self.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def join(self, rv: Rendezvous) -> int:
        """Leave the old group (dropped, not torn down: a dead peer could block a teardown) and form rv's."""
        self.group = None
        self.group = form_group(rv)
        self.rank, self.world = rv.rank, rv.world
        return self.step

    def train_step(self, step: int, samples=None) -> tuple[int, float]:
        if step <= self.step:
            if step in self.losses:
                return step, self.losses[step]
            raise StepOutOfOrder(f"{self.name}: step {step} is done but its loss is no longer kept")
        if step != self.step + 1:
            raise StepOutOfOrder(f"{self.name}: at step {self.step}, asked for step {step}")
        torch, work = self.torch, self.work
        if samples is None:
            samples = work.batch(step, *shard(work.global_batch, self.rank, self.world))
        samples = tuple(s.to(self.device) for s in samples)
        work.optimizer.zero_grad(set_to_none=False)
        loss = work.loss_sum(work.model, samples) / work.global_batch
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
                          for p in self.params] + [loss.detach().reshape(1)])
        if self.world > 1:
            allreduce_sum(self.group, flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n
        work.optimizer.step()
        self.step = step
        self.losses[step] = float(flat[-1])
        self.losses.pop(step - 64, None)
        return step, self.losses[step]

    def state(self) -> bytes:
        """The whole training state (step, model, optimizer) as bytes: checkpoints and state transfer."""
        buf = io.BytesIO()
        self.torch.save({"step": self.step, "model": self.work.model.state_dict(),
                         "optimizer": self.work.optimizer.state_dict(), "losses": self.losses}, buf)
        return buf.getvalue()

    def load(self, blob: bytes) -> int:
        state = self.torch.load(io.BytesIO(blob), map_location=self.device, weights_only=False)
        self.work.model.load_state_dict(state["model"])
        self.work.optimizer.load_state_dict(state["optimizer"])
        self.step, self.losses = int(state["step"]), dict(state["losses"])
        return self.step

    def save_durable(self, directory: str, keep: int = 2) -> str:
        """Write step-NNNNNNNN.pt atomically (tmp then rename) and keep the newest `keep`."""
        from .checkpoint import write_durable

        return write_durable(directory, self.step, self.state(), keep)

    def sleep(self, seconds: float) -> float:
        """For tests: hold the actor busy (a frozen peer looks like this from outside)."""
        time.sleep(seconds)
        return seconds


__all__ = ["Trainer", "StepOutOfOrder", "CollectiveBroken"]
