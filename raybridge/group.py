"""Who runs: the trainer actors of one job, in rank order, and the generation they train in.

Trainers are named detached actors (`tessera-trainer:<job>:<pod>` in Ray namespace `tessera`): they
outlive the bridge process that started them, so a restarted bridge finds and adopts them instead
of starting the job twice (controller.py). The bridge kills them when their pod or job goes away.
"""

from __future__ import annotations

from .collective import Rendezvous
from .contract import Slice
from .placement import trainer_options
from .trainer import Trainer

RAY_NAMESPACE = "tessera"
CONTROL = "control"  # the trainers' concurrency group for ping / abort_group / attach


def trainer_name(job: str, pod: str) -> str:
    return f"tessera-trainer:{job}:{pod}"


class WorkerGroup:
    """Owns the actor handles; the controller tells it whom to start, drop and group together."""

    def __init__(self, job: str, entrypoint: str, config: dict, store_host: str, store_port: int,
                 group_timeout_s: float, liveness: tuple[str, int, bytes] | None = None, detached: bool = True,
                 secret: bytes = b"") -> None:
        import ray

        self.ray = ray
        self.job, self.entrypoint, self.config = job, entrypoint, config
        self.store_host, self.store_port, self.group_timeout_s = store_host, store_port, group_timeout_s
        self.liveness, self.detached, self.secret = liveness, detached, secret
        self.actors: dict[str, object] = {}
        self.slices: dict[str, Slice] = {}
        self.members: list[str] = []  # the current generation, in rank order
        self.generation = 0
        self._remote = ray.remote(concurrency_groups={CONTROL: 2})(Trainer)

    def spawn(self, name: str, s: Slice):
        """Start the trainer of pod `name` where its slice is; returns the ref of its `ready()`."""
        naming = ({"name": trainer_name(self.job, name), "namespace": RAY_NAMESPACE, "lifetime": "detached"}
                  if self.detached else {})
        handle = self._remote.options(**naming, **trainer_options(s)).remote(
            name, self.entrypoint, self.config, s.uuids, self.liveness)
        self.actors[name], self.slices[name] = handle, s
        return handle.ready.remote()

    def find(self, name: str, s: Slice):
        """The running trainer of pod `name` that an earlier bridge started, or None."""
        if not self.detached:
            return None
        try:
            handle = self.ray.get_actor(trainer_name(self.job, name), namespace=RAY_NAMESPACE)
        except ValueError:  # no such actor
            return None
        self.actors[name], self.slices[name] = handle, s
        return handle

    def control(self, name: str, method: str, *args):
        """Call ping / abort_group / attach beside a step that may be blocked."""
        return getattr(self.actors[name], method).options(concurrency_group=CONTROL).remote(*args)

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
        self.ray.get(list(self.form_refs(names)), timeout=self.group_timeout_s + 30)

    def form_refs(self, names: list[str]) -> dict:
        """Ask `names` to form a new generation (rank = position); join ref -> name (the caller waits)."""
        self.generation += 1
        prefix = f"{self.job}/g{self.generation}/"
        backend = str(self.config.get("backend", "gloo"))
        refs = {self.actors[n].join.remote(Rendezvous(self.store_host, self.store_port, prefix, rank, len(names),
                                                       self.group_timeout_s, backend, self.secret)): n
                for rank, n in enumerate(names)}
        self.members = list(names)
        return refs

    def prefix(self) -> str:
        return f"{self.job}/g{self.generation}/"
