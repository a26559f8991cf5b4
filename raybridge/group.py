"""Who runs: the trainer actors of one job, in rank order, and the generation they train in."""

from __future__ import annotations

from .collective import Rendezvous
from .contract import Slice
from .placement import trainer_options
from .trainer import Trainer


class WorkerGroup:
    """Owns the actor handles; the controller tells it whom to start, drop and group together."""

    def __init__(self, job: str, entrypoint: str, config: dict, store_host: str, store_port: int,
                 group_timeout_s: float) -> None:
        import ray

        self.ray = ray
        self.job, self.entrypoint, self.config = job, entrypoint, config
        self.store_host, self.store_port, self.group_timeout_s = store_host, store_port, group_timeout_s
        self.actors: dict[str, object] = {}
        self.slices: dict[str, Slice] = {}
        self.members: list[str] = []  # the current generation, in rank order
        self.generation = 0
        self._remote = ray.remote(Trainer)

    def spawn(self, name: str, s: Slice):
        """Start the trainer of pod `name` where its slice is; returns the ref of its `ready()`."""
        handle = self._remote.options(name=None, **trainer_options(s)).remote(name, self.entrypoint, self.config, s.uuids)
        self.actors[name], self.slices[name] = handle, s
        return handle.ready.remote()

    def drop(self, name: str) -> None:
        """Kill (a frozen trainer must not come back as a second copy) and forget."""
        handle = self.actors.pop(name, None)
        self.slices.pop(name, None)
        if name in self.members:
            self.members.remove(name)
        if handle is not None:
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                pass

    def form(self, names: list[str]) -> None:
        """A new generation among `names` (rank = position); raises what a failed join raised."""
        self.generation += 1
        prefix = f"{self.job}/g{self.generation}/"
        backend = str(self.config.get("backend", "gloo"))
        refs = [self.actors[n].join.remote(Rendezvous(self.store_host, self.store_port, prefix, rank, len(names),
                                                      self.group_timeout_s, backend))
                for rank, n in enumerate(names)]
        self.members = list(names)
        self.ray.get(refs, timeout=self.group_timeout_s + 30)
