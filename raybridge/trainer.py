"""The trainer actor: one per job pod, on the Ray node of that pod's Kubernetes node.

Holds the model and optimizer; a step computes its share of the step's global batch, averages
gradients with an allreduce among the trainers (never through the driver), and applies them.
Steps are idempotent by number: Ray or the controller may deliver a step twice (at-least-once),
and a second delivery returns the recorded loss instead of stepping again.

Two calls run in their own concurrency group ("control"), beside a step that may be blocked in an
allreduce: `ping` (the controller's proof that this process still runs) and `abort_group` (the
controller knows a peer is gone: leave the allreduce now instead of after the group timeout).
"""

from __future__ import annotations

import io
import os
import time

from .collective import CollectiveBroken, Rendezvous, abort, allreduce_sum, form_group
from .liveness import hold
from .workload import load_entrypoint, shard


class StepOutOfOrder(RuntimeError):
    """The controller asked for a step this trainer cannot take next (its state is behind or ahead)."""


class Trainer:
    """Wrapped with ray.remote by the worker group (placement.py decides the options)."""

    def __init__(self, name: str, entrypoint: str, config: dict, uuids: tuple[str, ...] = (),
                 liveness: tuple[str, int, bytes] | None = None) -> None:
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
        self.generation = ""
        self._stop_generation = ""  # set from the control group: leave this generation's allreduce
        self._abandoned: list = []  # groups left mid-operation: gloo finishes them at their timeout
        self.rank, self.world = 0, 1
        self.group_timeout_s = 10.0
        self._liveness = None
        if liveness:
            self.attach(*liveness)

    def attach(self, host: str, port: int, secret: bytes) -> bool:
        """Hold a connection to the controller's liveness server (a new controller after adoption too)."""
        old, self._liveness = self._liveness, hold(host, port, self.name, secret)
        if old is not None:
            old.close()
        return True

    def ping(self) -> dict:
        """Answered from the control group even while a step is blocked: this process is not frozen."""
        return {"name": self.name, "pid": os.getpid(), "step": self.step, "generation": self.generation}

    def abort_group(self, generation: str) -> bool:
        """A peer is known gone: make a step blocked in generation's allreduce fail now."""
        group = self.group
        if group is None or generation != self.generation:
            return False
        self._stop_generation = generation
        return True

    def ready(self) -> dict:
        import ray

        return {"name": self.name, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "step": self.step, "device": str(self.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def join(self, rv: Rendezvous) -> int:
        """Leave the old group (dropped, not torn down: a dead peer could block a teardown) and form rv's."""
        self._drop_group()
        self.group = form_group(rv)
        self.generation, self.group_timeout_s = rv.prefix, rv.timeout_s
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
            if self.group is None:
                raise CollectiveBroken(f"{self.name}: its group {self.generation} was aborted")
            try:
                allreduce_sum(self.group, flat, self.group_timeout_s,
                              stop=lambda gen=self.generation: self._stop_generation == gen)
            except CollectiveBroken:
                # Drop the group at once: peers still inside this allreduce with us as their
                # neighbour get an error now instead of waiting out the group timeout.
                self._drop_group()
                raise
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

    def _drop_group(self) -> None:
        """Close the group's connections but keep the object until gloo is done with it: destroying a
        group with an operation still waiting inside would block this thread until its timeout."""
        group, self.group = self.group, None
        if group is not None:
            abort(group)
            self._abandoned.append(group)
        del self._abandoned[:-4]  # older ones have long passed their timeout

    def state(self) -> bytes:
        """The whole training state (step, model, optimizer) as bytes: checkpoints and state transfer."""
        buf = io.BytesIO()
        self.torch.save({"step": self.step, "model": self.work.model.state_dict(),
                         "optimizer": self.work.optimizer.state_dict(), "losses": self.losses}, buf)
        return buf.getvalue()

    def load(self, blob: bytes) -> int:
        # tensors, numbers and containers only: a checkpoint file anyone with the volume could write ran os.system
        # through pickle in every trainer that resumed from it
        state = self.torch.load(io.BytesIO(blob), map_location=self.device, weights_only=True)
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
