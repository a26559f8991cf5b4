"""Who decides: the job controller. It owns one job's worker group and drives its steps.

Membership changes only at step boundaries: a lost trainer shrinks the group to the survivors
at once (policy.py decides the state source and the steps redone), and a replacement, once its
actor is warm (torch imported, model built), joins at the next boundary by loading the state of
a member. Nothing here waits for Kubernetes: the bridge (bridge.py) tells the controller about
new pods with `add` and asks it with `take_lost` which pods need a replacement.
Single-threaded: the owner calls `step` in a loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .checkpoint import CheckpointManager
from .collective import host_store
from .contract import Slice
from .group import WorkerGroup
from .liveness import LivenessServer
from .metrics import JobMetrics, JobPhase
from .policy import Outcome, Plan, plan_recovery
from .preprocess import Preprocessor
from .secure import new_secret
from .stepwatch import unanswered, wait_all, watch_step
from .workload import shard


class JobFailed(RuntimeError):
    """No trainer is left (or the job is not elastic); it goes on once replacements are added."""


@dataclass(frozen=True, slots=True)
class Options:
    group_timeout_s: float = 10.0  # a frozen peer blocks a step this long (docs/ray-notes.md §6: gloo's default is 30 min)
    # stepwatch.py: when a step fails or runs longer than probe_after_s, the trainers that have not
    # answered are pinged; a ping unanswered for probe_timeout_s fences a frozen trainer.
    probe_after_s: float = 1.0
    probe_timeout_s: float = 3.0
    detached: bool = True  # trainers outlive the bridge process, so a restarted bridge adopts them
    checkpoint_every: int = 10
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 2
    elastic: bool = True  # False: any loss fails the step (the DDP way; bench/recovery.py's baseline)
    rendezvous_host: str = "127.0.0.1"
    preprocess_actors: int = 0
    preprocess_cpus: float = 1.0
    start_timeout_s: float = 300.0

    @staticmethod
    def from_config(config: dict, **overrides) -> Options:
        names = ("group_timeout_s", "probe_after_s", "probe_timeout_s", "checkpoint_every", "checkpoint_dir", "keep_checkpoints",
                 "preprocess_actors", "preprocess_cpus")
        known = {k: config[k] for k in names if k in config}
        return Options(**{**known, **overrides})


@dataclass(frozen=True, slots=True)
class Recovery:
    failed_step: int
    lost: tuple[str, ...]
    redone: int
    seconds: float  # failure seen by the controller to the next completed step
    world: int  # after the shrink
    # the last moment every member was known alive (its liveness connection open, or its step or join
    # done) to the failure being seen: an upper bound on detection, as the failure itself is not observable
    detection_s: float = 0.0

    @property
    def total_s(self) -> float:
        """From the failure (at the latest: the last proof of life) to the next completed step."""
        return self.detection_s + self.seconds


@dataclass(frozen=True, slots=True)
class StepReport:
    step: int
    loss: float
    world: int
    recovery: Recovery | None = None
    joined: tuple[str, ...] = ()


@dataclass
class _Pending:
    failed_step: int
    lost: tuple[str, ...]
    redone: int
    seen_at: float
    alive_at: float = 0.0  # the last proof of life before it


@dataclass
class History:
    """Every completed step's loss, and every recovery: what tests and the bench read."""

    losses: dict[int, float] = field(default_factory=dict)
    recoveries: list[Recovery] = field(default_factory=list)
    restored_from: list[int] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # trainers found running (a restarted bridge)
    fenced: list[str] = field(default_factory=list)  # frozen trainers killed: their ping went unanswered


class JobController:
    def __init__(self, job: str, entrypoint: str, config: dict, options: Options | None = None,
                 metrics: JobMetrics | None = None) -> None:
        import ray

        self.ray = ray
        self.job, self.entrypoint, self.config = job, entrypoint, dict(config)
        self.options = options or Options.from_config(config)
        o = self.options
        self.checkpoints = CheckpointManager(ray, job, o.checkpoint_every, o.checkpoint_dir, o.keep_checkpoints, o.detached)
        self.metrics = metrics or JobMetrics()
        self.global_batch = int(self.config.get("global_batch", 32))
        # the job's own secret: its rendezvous store and liveness server answer no one without it; the
        # trainers get it through the job's own Ray cluster (authenticated by its Ray token)
        self.secret = new_secret()
        self._store_server = host_store(self.secret, self.options.rendezvous_host)
        self.liveness = LivenessServer(self.secret, self.options.rendezvous_host)
        self.group = WorkerGroup(job, entrypoint, self.config, self.options.rendezvous_host, self._store_server.port,
                                 self.options.group_timeout_s, (*self.liveness.address, self.secret), self.options.detached,
                                 self.secret)
        self.preprocessors = [
            ray.remote(Preprocessor).options(num_cpus=self.options.preprocess_cpus, max_restarts=-1,
                                             max_task_retries=-1).remote(entrypoint, self.config)
            for _ in range(self.options.preprocess_actors)
        ]
        self.step_done = 0
        self.history = History()
        self._joining: dict[str, object] = {}  # name -> ready() ref
        self._lost: list[str] = []
        self._pending: _Pending | None = None
        self._alive_at = time.monotonic()  # when every member last answered (a step or a join completed)
        # tests: called at the moments a member can die outside a step ("admit", "form", "shrink",
        # "checkpoint"), so a kill lands exactly there
        self.on_moment = None
        self.phase = JobPhase.PENDING
        self._set_phase(JobPhase.PENDING)

    # --- membership, from the bridge -------------------------------------------------------------
    def add(self, name: str, s: Slice) -> None:
        """A pod bound for this job: start its trainer; it joins at a step boundary once warm."""
        if name in self.group.actors:
            return
        self._joining[name] = self.group.spawn(name, s)

    def remove(self, name: str) -> None:
        """A pod that went away without its node failing (deleted, preempted): shrink without it."""
        if name in self.group.members or name in self._joining:
            self._joining.pop(name, None)
            self.group.drop(name)
            self._lost.append(name)
            if self.group.members:
                self._moment("shrink")
                self._form(list(self.group.members))

    def abandon(self, name: str) -> None:
        """A pod bound for the job that no kubelet took (its node is down): its trainer never started, so the
        group is unchanged; the job marks the pod lost and the bridge replaces it (raybridge/job.py)."""
        if name in self.group.members:
            self.remove(name)
        elif self._joining.pop(name, None) is not None:
            self.group.drop(name)

    @property
    def has_lost(self) -> bool:
        """Lost trainers not yet taken: the job marks their pods at once so replacements start sooner."""
        return bool(self._lost)

    def _mark_alive(self) -> None:
        """Every member's liveness connection is open now: the latest moment before a failure that the
        controller can vouch for (a dead process's kernel closes its connection within milliseconds;
        a frozen one is caught by pings, and its recovery then counts from here too)."""
        gone = self.liveness.gone()
        if not any(n in gone for n in self.group.members):
            self._alive_at = time.monotonic()

    def _moment(self, what: str) -> None:
        if self.on_moment is not None:
            self.on_moment(what)

    def _note_loss(self, names: list[str], seen: float) -> None:
        """Members lost outside a step (while admitting, forming, shrinking): a recovery like any other,
        recorded when the next step completes."""
        if not names:
            return
        if self._pending is None:
            self._pending = _Pending(self.step_done + 1, tuple(names), 0, seen, self._alive_at)
        else:
            self._pending.lost += tuple(n for n in names if n not in self._pending.lost)
        self._set_phase(JobPhase.RECOVERING)

    def take_lost(self) -> list[str]:
        """Pods whose trainers are gone since the last call: the bridge replaces them."""
        lost, self._lost = self._lost, []
        return lost

    @property
    def world(self) -> int:
        return len(self.group.members)

    @property
    def joining(self) -> tuple[str, ...]:
        return tuple(self._joining)

    def start(self, slices: dict[str, Slice]) -> None:
        """Start the whole job, wait for every trainer, restore the newest checkpoint, form the group.

        Trainers an earlier bridge started (named detached actors) are adopted, not started again:
        the one furthest ahead gives its state to the others and the job goes on from its step."""
        self._set_phase(JobPhase.STARTING)
        found = [name for name, s in slices.items() if self.group.find(name, s) is not None]
        for name, s in slices.items():
            if name not in found:
                self.add(name, s)
        if found:
            self._adopt(found)
        self.ray.get(list(self._joining.values()), timeout=self.options.start_timeout_s)
        self._admit_joiners()
        self._set_phase(JobPhase.RUNNING)

    def _adopt(self, names: list[str]) -> None:
        """Point found trainers at this controller, settle any step an earlier one left in flight, and
        group them around the one furthest ahead."""
        alive: dict[str, int] = {}
        for n in names:
            try:
                self.ray.get(self.group.control(n, "attach", *self.liveness.address, self.secret),
                             timeout=self.options.probe_timeout_s)
                gen = self.ray.get(self.group.control(n, "ping"), timeout=self.options.probe_timeout_s)["generation"]
                self.group.control(n, "abort_group", gen)  # a step the dead bridge left waiting ends now
                alive[n] = self.ray.get(self.group.actors[n].ready.remote(), timeout=self.options.group_timeout_s + 5)["step"]
            except Exception:  # gone, or frozen: replaced like any lost trainer
                self.group.drop(n)
                self._lost.append(n)
        if not alive:
            return
        source = max(alive, key=lambda n: alive[n])
        lagging = [n for n in alive if alive[n] != alive[source]]
        if lagging:
            blob = self.group.actors[source].state.remote()
            self.ray.get([self.group.actors[n].load.remote(blob) for n in lagging])
        self.step_done = alive[source]
        self.history.adopted.extend(alive)
        self._form(list(alive))

    def close(self) -> None:
        """Kill every actor of the job (trainers, replica, preprocessors) and stop serving rendezvous."""
        for name in list(self.group.actors) + list(self._joining):
            self.group.drop(name)
        for actor in [self.checkpoints.replica, *self.preprocessors]:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.liveness.close()
        self._store_server.close()

    def wait_joiners(self, timeout: float) -> None:
        if self._joining:
            self.ray.wait(list(self._joining.values()), num_returns=len(self._joining), timeout=timeout)

    # --- training ------------------------------------------------------------------------------------
    def step(self) -> StepReport:
        joined = self._admit_joiners()
        if not self.group.members:
            self._set_phase(JobPhase.RECOVERING)
            raise JobFailed(f"job {self.job}: no trainer left at step {self.step_done}; waiting for replacements")
        s = self.step_done + 1
        self._mark_alive()
        outcomes, losses, seen = self._run_step(s)
        if all(o is Outcome.DONE for o in outcomes.values()):
            return self._commit(s, losses, joined)
        steps = {n: (s if o is Outcome.DONE else s - 1) for n, o in outcomes.items()}
        plan = plan_recovery(s, outcomes, {n: steps[n] for n in outcomes if outcomes[n] in (Outcome.DONE, Outcome.BROKEN)})
        self._apply(plan, s, seen)
        if plan.survivors and plan.resume_step == s and self.options.elastic:  # a survivor completed s before the loss
            self.history.losses[s] = losses[plan.source]
        if not self.options.elastic:
            self._set_phase(JobPhase.RECOVERING)
            raise JobFailed(f"job {self.job}: lost {', '.join(plan.lost) or 'a peer'} at step {s} (not elastic)")
        if not self.group.members:
            self._set_phase(JobPhase.RECOVERING)
            raise JobFailed(f"job {self.job}: every trainer lost at step {s}; waiting for replacements")
        return self.step()

    def run(self, until_step: int, on_step=None) -> None:
        while self.step_done < until_step:
            report = self.step()
            if on_step:
                on_step(report)
        self._set_phase(JobPhase.SUCCEEDED)

    def _samples(self, s: int, rank: int, world: int):
        if not self.preprocessors:
            return None
        first, stop = shard(self.global_batch, rank, world)
        return self.preprocessors[rank % len(self.preprocessors)].batch.remote(s, first, stop)

    def _run_step(self, s: int) -> tuple[dict[str, Outcome], dict[str, float], float]:
        """Ask every member for step s; what each call ended in (stepwatch.py has the rules)."""
        world = self.world
        refs = {self.group.actors[n].train_step.remote(s, self._samples(s, r, world)): n
                for r, n in enumerate(self.group.members)}
        result = watch_step(self.group, self.liveness, refs, self.options.probe_after_s, self.options.probe_timeout_s,
                            self.options.group_timeout_s)
        self.history.fenced.extend(result.fenced)
        return result.outcomes, result.losses, result.seen

    def _commit(self, s: int, losses: dict[str, float], joined: tuple[str, ...]) -> StepReport:
        loss = losses[self.group.members[0]]
        self._alive_at = time.monotonic()
        self.step_done = s
        self.history.losses[s] = loss
        m, job = self.metrics, self.job
        m.step.labels(job).set(s)
        m.loss.labels(job).set(loss)
        recovery = None
        if self._pending is not None:
            p, self._pending = self._pending, None
            recovery = Recovery(p.failed_step, p.lost, p.redone, time.monotonic() - p.seen_at, self.world,
                                max(0.0, p.seen_at - p.alive_at) if p.alive_at else 0.0)
            self.history.recoveries.append(recovery)
            m.recoveries.labels(job).inc()
            m.redone.labels(job).inc(p.redone)
            m.recovery_s.labels(job).observe(recovery.total_s)
            m.detection_s.labels(job).observe(recovery.detection_s)
            self._set_phase(JobPhase.RUNNING)
        if self.checkpoints.due(s):
            self._moment("checkpoint")
            self.checkpoints.save(s, self.group.actors[self.group.members[0]])
        return StepReport(s, loss, self.world, recovery, joined)

    def _apply(self, plan: Plan, s: int, seen: float) -> None:
        for name in plan.lost:
            self.group.drop(name)
            self._lost.append(name)
        if self._pending is None:
            self._pending = _Pending(s, plan.lost, 0, seen or time.monotonic(), self._alive_at)
        else:  # a second failure before the first recovery completed: one recovery, all losses
            self._pending = _Pending(self._pending.failed_step, self._pending.lost + plan.lost,
                                     self._pending.redone, self._pending.seen_at, self._pending.alive_at)
        self._set_phase(JobPhase.RECOVERING)
        if not plan.survivors or not self.options.elastic:
            return
        if plan.lagging:
            blob = self.group.actors[plan.source].state.remote()
            failed = self._wait([blob], [plan.source])
            if not failed:
                loads = [self.group.actors[n].load.remote(blob) for n in plan.lagging]
                failed = self._wait(loads, list(plan.lagging))
            if failed:
                # the source or a lagging survivor died meanwhile: settle, and plan again
                dead = self._settle(list(plan.survivors))
                self._note_loss(dead, time.monotonic())
                alive = [n for n in plan.survivors if n not in dead]
                if not alive:
                    return
                steps = self.ray.get([self.group.actors[n].ready.remote() for n in alive], timeout=self.options.group_timeout_s)
                done = {n: r["step"] for n, r in zip(alive, steps, strict=True)}
                again = plan_recovery(s, {n: Outcome.BROKEN for n in alive}, done)
                self._apply(again, s, seen)
                return
        self.step_done = plan.resume_step
        self._pending.redone += plan.redone
        self._form(list(plan.survivors))

    def _form(self, names: list[str]) -> None:
        """A new generation among `names`. A member that dies while it forms (its liveness connection
        closes, or Ray names it dead) is dropped and recorded as lost, the waits of the others are cut
        short (the store fails them) and the generation is formed again without it."""
        futile = 0
        while names:
            self._mark_alive()
            self._moment("form")
            refs = self.group.form_refs(names)
            prefix = self.group.prefix()
            failed = self._wait(list(refs), names)
            if not failed:
                self._alive_at = time.monotonic()
                break
            self._store_server.cancel(prefix)
            dead = self._settle(names)
            self._note_loss(dead, failed)
            names = [n for n in names if n not in dead]
            futile = 0 if dead else futile + 1
            if futile >= 3:  # everyone answers pings, yet the group does not form: not a loss we can fix
                raise RuntimeError(f"job {self.job}: {len(names)} live trainers failed to form a group 3 times")
        self.metrics.world.labels(self.job).set(self.world)

    def _wait(self, refs: list, names: list[str]) -> float:
        """0 when every call on the trainers `names` succeeded; else when the failure was seen (stepwatch.wait_all)."""
        return wait_all(self.ray, self.liveness, refs, names, self.options.group_timeout_s + 30)

    def _settle(self, names: list[str]) -> list[str]:
        """Which of `names` are dead (stepwatch.unanswered): dropped, handed to the bridge as lost, and returned."""
        dead = unanswered(self.ray, self.group, self.liveness, names, self.options.probe_timeout_s)
        for n in dead:
            self.group.drop(n)
            self._joining.pop(n, None)
            if n not in self._lost:
                self._lost.append(n)
        return dead

    def _admit_joiners(self) -> tuple[str, ...]:
        """Warm joiners take a member's state (or the newest checkpoint when none is left) and join."""
        if not self._joining:
            return ()
        ready = set(self.ray.wait(list(self._joining.values()), num_returns=len(self._joining), timeout=0)[0])
        names = [n for n, ref in self._joining.items() if ref in ready]
        if not names:
            return ()
        from ray.exceptions import RayActorError

        fresh = []
        for n in names:
            ref = self._joining.pop(n)
            try:
                self.ray.get(ref)
                fresh.append(n)
            except RayActorError:  # died while starting
                self.group.drop(n)
                self._lost.append(n)
        if not fresh:
            return ()
        # Any member or joiner can die here (the member whose state they copy, another one, a
        # joiner): the dead are settled and recorded as lost, and the joiners copy a living member.
        for _ in range(len(self.group.members) + len(fresh) + 1):
            self._mark_alive()
            self._moment("admit")
            if self.group.members:
                blob = self.group.actors[self.group.members[0]].state.remote()
                resume = self.step_done
            else:
                resume, blob = self.checkpoints.newest()
            if blob is None:
                break
            source = self.group.members[:1]
            # the state first, then the loads: a load sent with the state of a source that then dies
            # would hold the joiner's queue until Ray's own verdict (its node's health check)
            failed = self._wait([blob], source) if source else 0.0
            if not failed:
                loads = [self.group.actors[n].load.remote(blob) for n in fresh]
                failed = self._wait(loads, fresh)
            if not failed:
                steps = self.ray.get(loads)
            else:
                members = list(self.group.members)
                dead = self._settle(members + fresh)
                self._note_loss([n for n in dead if n in members], failed)
                fresh = [n for n in fresh if n not in dead]
                if not fresh:
                    return ()
                continue
            if any(x != resume for x in steps):
                raise RuntimeError(f"job {self.job}: joiners loaded steps {steps}, expected {resume}")
            break
        if not self.group.members:
            if self._pending is not None:  # the completed steps after the checkpoint, and the step that failed
                self._pending.redone += self.step_done - resume + 1
            self.step_done = max(resume, 0)
            self.history.restored_from.append(self.step_done)
        self._form(self.group.members + fresh)
        if self.phase == JobPhase.RUNNING or self._pending is None:
            self.metrics.grows.labels(self.job).inc(len(fresh))
        return tuple(fresh)

    def restart_from_durable(self, slices: dict[str, Slice]) -> float:
        """The DDP way (the baseline): tear every trainer down, start all anew, load the durable checkpoint."""
        t0 = time.monotonic()
        for name in list(self.group.actors):
            self.group.drop(name)
        self.group.members = []
        lost_step = self.step_done
        for name, s in slices.items():
            self.add(name, s)
        self.ray.get(list(self._joining.values()), timeout=self.options.start_timeout_s)
        resume, blob = self.checkpoints.durable()
        names = list(self._joining)
        self._joining.clear()
        if blob is not None:
            self.ray.get([self.group.actors[n].load.remote(blob) for n in names])
        self.step_done = resume
        self.history.restored_from.append(resume)
        self._pending = _Pending(lost_step + 1, (), lost_step - resume + 1, self._pending.seen_at if self._pending else t0)
        self._form(names)
        return time.monotonic() - t0

    def _set_phase(self, phase: JobPhase) -> None:
        self.phase = phase
        self.metrics.set_phase(self.job, phase)
        self.metrics.world.labels(self.job).set(len(self.group.members) if hasattr(self, "group") else 0)

