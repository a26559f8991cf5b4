"""Prometheus metrics of the bridge: job phase, steps, recoveries, recovery time, steps redone.

One registry per owner (the bridge process passes its own); nothing global.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class JobPhase(StrEnum):
    """A job's phase: the controller's state, the `tessera_ray_job_phase` gauge's label and the phase annotation on
    the job's pods (a StrEnum, so the annotation and the label carry the plain word)."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


PHASES = tuple(p.value for p in JobPhase)


def listen_address(listen: str) -> tuple[str, int]:
    """HOST:PORT of a /metrics listener, checked before anything slow starts (port 99999 ended in an OverflowError
    only after the bridge's watch synced, and port 0 listened on whatever port the kernel picked)."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics-listen wants HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def serve_metrics(registry: CollectorRegistry, listen: str) -> None:
    """Serve `registry` at http://HOST:PORT/metrics from a daemon thread."""
    from prometheus_client import start_http_server

    host, port = listen_address(listen)
    start_http_server(port, addr=host, registry=registry)


class JobMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.phase = Gauge("tessera_ray_job_phase", "1 for the job's current phase", ["job", "phase"], registry=r)
        self.step = Gauge("tessera_ray_job_step", "last completed training step", ["job"], registry=r)
        self.world = Gauge("tessera_ray_job_world_size", "trainers in the current group", ["job"], registry=r)
        self.loss = Gauge("tessera_ray_job_loss", "loss of the last completed step", ["job"], registry=r)
        self.recoveries = Counter("tessera_ray_job_recoveries_total", "failed steps recovered from", ["job"], registry=r)
        self.redone = Counter("tessera_ray_job_steps_redone_total", "steps run again after a failure", ["job"], registry=r)
        buckets = (0.05, 0.1, 0.2, 0.38, 0.5, 1, 2, 5, 10, 30, 60)
        self.recovery_s = Histogram("tessera_ray_job_recovery_seconds",
                                    "failure (the last proof of life before it) to the next completed step", ["job"],
                                    buckets=buckets, registry=r)
        self.detection_s = Histogram("tessera_ray_job_detection_seconds",
                                     "the last proof of life of a lost trainer to its loss being seen", ["job"],
                                     buckets=buckets, registry=r)
        self.grows = Counter("tessera_ray_job_grows_total", "trainers joined a running job", ["job"], registry=r)

    def set_phase(self, job: str, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        for p in PHASES:
            self.phase.labels(job, p).set(1 if p == phase else 0)
