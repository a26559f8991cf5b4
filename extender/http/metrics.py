"""Cluster gauges computed at scrape time from the extender's cache (no background work), and the
fixed set of filter-reason labels.

A reason is free text that can carry what a pod wrote (its GPU models, its gang's name), so used
as a label it would make one time series per distinct text: a client could grow the metrics
without bound. `reason_category` maps every reason to one of REASON_CATEGORIES.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tessera_contract import ANNOTATION_CATEGORIES

from ..core.fragmentation import FragmentationMeasure
from ..service import Extender

# (category, how the reason reads after "tessera: "), first match wins; the texts are
# core/cluster.py's fit_reason, service.py's NOT_CACHED, gang and taint reasons
_PREFIXES = (
    ("cpu", "insufficient cpu"), ("memory", "insufficient memory"), ("no-gpu", "node has no GPU"),
    ("gpu-model", "GPU model "), ("gpu-model", "no node has GPU model "), ("taint", "node has taint "),
    ("gpu-count", "node has "), ("gpu-free", "no GPU has "),
    ("gpu-free", "only "), ("gang", "gang "), ("gang", "PodGroup "), ("gang", "the members of "),
    ("gang", "held for this pod on "), ("not-cached", "node not in its cache"),
    ("reserved", "node reserved for "),
)
REASON_CATEGORIES = tuple(dict.fromkeys(c for c, _ in _PREFIXES)) + ("other",)


def reason_category(reason: str) -> str:
    """One of REASON_CATEGORIES for a filter reason, whatever text it carries."""
    text = reason.removeprefix("tessera: ")
    return next((category for category, prefix in _PREFIXES if text.startswith(prefix)), "other")


def reason_counts(reasons: Iterable[str]) -> Counter[str]:
    """Nodes refused per category; distinct texts are few (5000 nodes share a handful), so each is mapped once."""
    out: Counter[str] = Counter()
    for reason, n in Counter(reasons).items():
        out[reason_category(reason)] += n
    return out


class ClusterCollector:
    def __init__(self, extender: Extender) -> None:
        self.extender = extender

    def collect(self):
        ex = self.extender
        with ex.reading():
            measure = FragmentationMeasure(ex.policy.ctx.workload)
            frag = sum(measure.of(n) for n in ex.cluster.nodes)
            capacity = ex.cluster.gpu_capacity_milli
            free, alloc = defaultdict(int), defaultdict(int)
            for n in ex.cluster.nodes:
                model = n.spec.gpu_model or "unknown"
                f = sum(max(0, r) for r in n.gpu_free)
                free[model] += f
                alloc[model] += n.spec.gpu_count * 1000 - f
            pending = len(ex.bind_holds)
            nominations = len(ex.nominations.by_uid)
            queued, queued_share = len(ex.queue_reservations.backfill), ex.queue_reservations.held_share()
            forged = len(ex.forged)
            synced = ex.synced
            moved, steering, short_waiting = ex.moves.made, len(ex.moves.dests), ex.short_first.counted()
            q = ex.queue_reservations
            leases = (len(q.leases), q.leases_ended, q.leases_renewed)
            gangs_waiting, gangs_admitted = ex.gangs.counts()
        g = GaugeMetricFamily("tessera_fragmentation_milli", "FGD fragmentation F(M) of the cluster, milli-GPU")
        g.add_metric([], frag)
        yield g
        g = GaugeMetricFamily("tessera_fragmentation_ratio", "F(M) / GPU capacity")
        g.add_metric([], frag / capacity if capacity else 0.0)
        yield g
        fm = GaugeMetricFamily("tessera_gpu_free_milli", "Free milli-GPU by model", labels=["model"])
        am = GaugeMetricFamily("tessera_gpu_allocated_milli", "Allocated milli-GPU by model", labels=["model"])
        for model in sorted(free):
            fm.add_metric([model], free[model])
            am.add_metric([model], alloc[model])
        yield fm
        yield am
        yield from _holds(pending, nominations, queued, queued_share, short_waiting, gangs_waiting, gangs_admitted)
        yield _one(CounterMetricFamily, "tessera_trainer_moves", "Trainers of elastic Ray jobs moved to make room (moves.py)",
                   moved)
        yield from _leases(*leases)
        yield _one(GaugeMetricFamily, "tessera_trainer_moves_in_flight", "Moved trainers whose replacement is not placed yet",
                   steering)
        yield _one(GaugeMetricFamily, "tessera_forged_assignments", "Pods whose assignment annotation Tessera did not sign",
                   forged)
        yield _one(GaugeMetricFamily, "tessera_synced", "1 once the cache finished its first full sync", 1 if synced else 0)
        health = ex.watch_health  # by kind only: a label per object would let tenants grow the series
        c = CounterMetricFamily("tessera_bad_objects", "Object states the watch could not read and skipped", labels=["kind"])
        g = GaugeMetricFamily("tessera_bad_objects_listed", "Objects whose latest state was skipped", labels=["kind"])
        for kind, n in sorted(health.bad_counts().items()):
            g.add_metric([kind], n)
        for kind, n in sorted(health.bad_totals().items()):
            c.add_metric([kind], n)
        yield c
        yield g
        c = CounterMetricFamily("tessera_pod_annotation_problems", "Pod states whose tessera.dev/ input does nothing "
                                "or is refused, by category", labels=["category"])
        totals = health.annotation_totals()
        for category in ANNOTATION_CATEGORIES:  # the fixed set, zeros included: dashboards see every series
            c.add_metric([category], totals.get(category, 0))
        yield c


def _leases(leased: int, ended: int, renewed: int):
    """Drain leases (queue_reservations.py): running now, ended with their pod deleted, renewed at their end."""
    yield _one(GaugeMetricFamily, "tessera_drain_leases", "Pods running on a drain-pool or reserved node on a lease", leased)
    yield _one(CounterMetricFamily, "tessera_drain_leases_ended", "Pods deleted at the end of their drain lease", ended)
    yield _one(CounterMetricFamily, "tessera_drain_leases_renewed",
               "Drain leases renewed at their end: no reservation held their node", renewed)


def _one(family, name: str, doc: str, value: float):
    """A metric family of one unlabelled sample."""
    metric = family(name, doc)
    metric.add_metric([], value)
    return metric


def _holds(binds: int, nominations: int, queued: int, queued_share: float, short_waiting: int, gangs_waiting: int,
           gangs_admitted: int):
    """What the extender holds for pods not yet running: bind holds, preemption nominations, queue reservations, the
    short pods that hold longer runs back, and the gangs waiting or being bound."""
    for name, doc, value in (
            ("tessera_gangs_waiting", "Gangs not admitted yet: members missing, or no room for all at once (gangs.py)",
             gangs_waiting),
            ("tessera_gangs_admitted", "Gangs admitted whose members are still being bound (their GPUs held)",
             gangs_admitted),
            ("tessera_reservations", "Binds not yet confirmed by the watch", binds),
            ("tessera_preemption_nominations", "Nodes being cleared for a preemptor (room held for it)", nominations),
            ("tessera_queue_reservations", "Nodes reserved for pods that waited past their bound "
             "(reservations with backfill; bind's holds are tessera_reservations)", queued),
            ("tessera_queue_reserved_gpu_share", "Share of GPU capacity the queue reservations wait for", queued_share),
            ("tessera_short_first_waiting_pods", "Short GPU pods waiting that hold longer runs back (shortest runs first, "
             "--short-first on; 0 when off)", short_waiting)):
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g
