"""`tessera bridge`: admitted Ray job pods become trainer actors; lost ones get replacements.

One loop owns everything (no shared mutable state between threads except the pod snapshot):
read the pods, let decide.py say what to do, do it through the job controllers and the API,
run a few training steps of each job, and now and then write phase and progress onto the pods.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from .contract import PHASE_ANNOTATION, JobSpec
from .controller import JobController, JobFailed, Options
from .decide import controlling_owner, decide, group_jobs, replacement_pod
from .metrics import JobMetrics

log = logging.getLogger("tessera.bridge")


@dataclass
class _Job:
    spec: JobSpec
    controller: JobController
    lost: set[str] = field(default_factory=set)
    replaced: set[str] = field(default_factory=set)
    written_at: float = 0.0
    written_shape: tuple = ()  # (phase, world, recoveries) last written
    done: bool = False
    bodies: dict[str, dict] = field(default_factory=dict)  # the last seen pod of each member: the template of its replacement


class Bridge:
    def __init__(self, pods, writer, metrics: JobMetrics | None = None, steps_per_turn: int = 20,
                 progress_every_s: float = 30.0, options: dict | None = None) -> None:
        self.pods, self.writer = pods, writer
        self.metrics = metrics or JobMetrics()
        self.steps_per_turn, self.progress_every_s = steps_per_turn, progress_every_s
        self.options = options or {}
        self.jobs: dict[str, _Job] = {}
        self._reported: set[str] = set()

    def turn(self) -> None:
        snapshot = self.pods.snapshot()
        by_key = {f"{p['metadata'].get('namespace', 'default')}/{p['metadata']['name']}": p for p in snapshot}
        jobs = group_jobs(snapshot)
        for error in jobs.errors:
            if error not in self._reported:
                self._reported.add(error)
                log.warning("%s", error)
        for key in [k for k in self.jobs if k not in jobs.members]:  # every pod of the job is gone
            log.info("job %s: no pods left, stopping its trainers", key)
            self.jobs.pop(key).controller.close()
        for key, members in jobs.members.items():
            job = self.jobs.get(key)
            if job is None and all(_phase(by_key[m.key]) == "Succeeded" for m in members):
                continue  # finished before this bridge started: not started again
            if job is not None and all(m.deleting for m in members):
                log.info("job %s: all its pods are being deleted, stopping its trainers", key)
                self.jobs.pop(key).controller.close()
                continue
            if job is not None:
                job.lost.update(job.controller.take_lost())
            running = None if job is None else frozenset(job.controller.group.actors) | frozenset(job.controller.joining)
            d = decide(members, running, frozenset(job.lost) if job else frozenset(),
                       frozenset(job.replaced) if job else frozenset(), job.done if job else False)
            if d.start:
                job = self._start(members[0].job, dict(d.start), by_key)
            if job is None:
                continue
            job.bodies.update({m.key: by_key[m.key] for m in members})
            for name, s in d.add:
                log.info("job %s: pod %s bound on %s, its trainer joins", key, name, s.node)
                job.controller.add(name, s)
            for name in d.remove:
                job.controller.remove(name)
                job.lost.add(name)
            for name in d.replace:
                self._replace(job, name, by_key)
            for name in d.delete:
                self.writer.delete(name)
        for job in self.jobs.values():
            self._train(job, by_key)

    def _start(self, spec: JobSpec, slices: dict, by_key: dict) -> _Job:
        config = spec.config
        ctl = JobController(spec.key, spec.entrypoint, config, Options.from_config(config, **self.options), self.metrics)
        job = self.jobs[spec.key] = _Job(spec, ctl)
        log.info("job %s: gang of %d bound, starting trainers on %s", spec.key, spec.size,
                 ", ".join(s.node for s in slices.values()))
        ctl.start(slices)
        for name in ctl.group.members:
            how = "TrainerAdopted" if name in ctl.history.adopted else "TrainerStarted"
            self.writer.event(name, by_key[name]["metadata"].get("uid", ""), how,
                              f"trainer rank {ctl.group.members.index(name)} of {ctl.world} on {slices[name].node}, "
                              f"at step {ctl.step_done}")
        self._write(job, by_key, force=True)
        return job

    def _replace(self, job: _Job, name: str, by_key: dict) -> None:
        pod = by_key.get(name) or job.bodies.get(name)  # a deleted pod is replaced from its last seen body
        if pod is None:
            return
        owner = controlling_owner(pod)
        if owner:
            job.replaced.add(name)
            log.info("job %s: pod %s lost; its owner %s recreates it, the job regrows when that pod is bound",
                     job.spec.key, name, owner)
            return
        body = replacement_pod(pod, taken=set(by_key))
        self.writer.create(body)
        job.replaced.add(name)
        new = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
        log.info("job %s: pod %s lost, asked for replacement %s", job.spec.key, name, new)
        self.writer.event(name, pod["metadata"].get("uid", ""), "TrainerLost",
                          f"trainer lost at step {job.controller.step_done}; replacement pod {new} requested", warning=True)

    def _train(self, job: _Job, by_key: dict) -> None:
        if job.done:
            return
        target = job.spec.config.get("steps")
        ctl = job.controller
        try:
            for _ in range(self.steps_per_turn):
                if target is not None and ctl.step_done >= int(target):
                    ctl.run(int(target))  # marks Succeeded
                    job.done = True
                    break
                report = ctl.step()
                if report.recovery:
                    r = report.recovery
                    log.info("job %s: recovered from losing %s in %.3f s, %d step(s) redone, world %d",
                             job.spec.key, ", ".join(r.lost), r.seconds, r.redone, r.world)
        except JobFailed as e:
            log.warning("%s", e)
        self._write(job, by_key, force=job.done)
        if job.done:
            ctl.close()

    def _write(self, job: _Job, by_key: dict, force: bool = False) -> None:
        now = time.monotonic()
        ctl = job.controller
        recs = ctl.history.recoveries
        # every patch is a MODIFIED event for every watcher of pods (each extender replica, agents):
        # a change of phase, world or recoveries is written at once, the step count only now and then
        shape = (ctl.phase, ctl.world, len(recs))
        if not force and shape == job.written_shape and now - job.written_at < self.progress_every_s:
            return
        job.written_at, job.written_shape = now, shape
        progress = {"step": ctl.step_done, "world": ctl.world, "loss": round(ctl.history.losses.get(ctl.step_done, 0.0), 6),
                    "recoveries": len(recs), "steps_redone": sum(r.redone for r in recs),
                    "last_recovery_s": round(recs[-1].seconds, 3) if recs else None}
        for name in set(ctl.group.members) | set(ctl.joining):
            if name in by_key:
                self.writer.annotate(name, ctl.phase, progress)


def _phase(pod: dict) -> str:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(PHASE_ANNOTATION, "")


def serve(api, ray_address: str | None, metrics_listen: str, namespace: str | None = None,
          interval_s: float = 0.05, progress_every_s: float = 30.0) -> None:
    """The `tessera bridge` process: connect to Ray, serve /metrics, run the loop forever."""
    import threading

    import ray
    from prometheus_client import start_http_server

    from .kube import PodWatch, PodWriter

    host, _, port = metrics_listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--metrics-listen wants HOST:PORT, got {metrics_listen!r}")
    metrics = JobMetrics()
    start_http_server(int(port), addr=host.strip("[]"), registry=metrics.registry)
    ray.init(address=ray_address or "auto", include_dashboard=False, log_to_driver=False)
    watch = PodWatch(api, namespace)
    threading.Thread(target=watch.run, daemon=True, name="pod-watch").start()
    watch.synced.wait()
    # Trainers connect back to this process (rendezvous store, liveness): on Kubernetes that is the
    # pod's IP (downward API POD_IP), not loopback.
    host = os.environ.get("TESSERA_BRIDGE_HOST") or os.environ.get("POD_IP") or "127.0.0.1"
    bridge = Bridge(watch, PodWriter(api), metrics, progress_every_s=progress_every_s, options={"rendezvous_host": host})
    log.info("bridge: watching Ray job pods, metrics on %s", metrics_listen)
    while True:
        bridge.turn()
        time.sleep(interval_s)
