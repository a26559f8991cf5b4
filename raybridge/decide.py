"""Pure decisions from the pods of Ray jobs (plain dicts), for both sides of the trust boundary.

Kept apart from the Kubernetes and Ray calls so tests drive it with dicts. For each job (a gang of
pods with `tessera.dev/runtime: ray`):
  * `decide` (the job's own runner, raybridge/job.py, inside the job's pods): start the job when
    `size` live pods are bound with a Tessera assignment (the extender binds gangs whole, so this
    is when the gang is admitted); once running, hand new bound pods (replacements) to the
    controller and tell it which of its pods are gone;
  * `repair` (the privileged bridge, raybridge/bridge.py): one replacement per lost or deleted
    pod of a started job (the extender places it), never more live pods than the gang size,
    nothing while the job is finished or being torn down; and which lost pods are candidates for
    deletion (the bridge deletes only those whose UID it recorded creating).
"""

from __future__ import annotations

import copy
from collections.abc import Container
from dataclasses import dataclass

from tessera_contract import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION, VISIBLE_DEVICES_ANNOTATION

from .contract import (
    BRIDGE_MAC_ANNOTATION,
    BRIDGE_NAME,
    CREATED_BY_ANNOTATION,
    LOST_ANNOTATION,
    PHASE_ANNOTATION,
    PROGRESS_ANNOTATION,
    REPLACES_ANNOTATION,
    ContractError,
    JobSpec,
    Member,
    Slice,
    is_ray_pod,
    member,
)


@dataclass(frozen=True, slots=True)
class Jobs:
    members: dict[str, tuple[Member, ...]]  # job key -> its pods, sorted by name
    errors: tuple[str, ...]  # pods that break the contract, in words (they are ignored)


@dataclass(frozen=True, slots=True)
class Decision:
    start: tuple[tuple[str, Slice], ...] = ()  # the job is admitted: start these trainers
    add: tuple[tuple[str, Slice], ...] = ()  # running job: bound pods the controller does not have
    remove: tuple[str, ...] = ()  # running job: the controller's pods that are gone in Kubernetes
    replace: tuple[str, ...] = ()  # lost pods that have no replacement yet
    delete: tuple[str, ...] = ()  # lost pods the bridge itself created (never anyone else's)
    waiting: str = ""  # why a job is not started yet


# Ray pods whose decoding is kept between turns: far above a cluster's Ray pods (a 10,000-GPU cluster
# at one member per GPU), while 50,000 entries of a few hundred bytes each stay under ~25 MiB.
MEMBER_CACHE_MAX = 50_000


class MemberCache:
    """Each pod's decoded member (or its contract error), by (uid, resourceVersion): the bridge's
    0.2-s turn re-decoded every Ray pod's 64-KiB config and progress JSON, 2.3 s a turn for 1,000
    hostile pods. A pod that changes gets a new resourceVersion; entries not used in a turn are
    dropped, and at most MEMBER_CACHE_MAX are kept."""

    def __init__(self, bound: int = MEMBER_CACHE_MAX) -> None:
        self.bound = bound
        self._last: dict[tuple[str, str], Member | str] = {}
        self._this: dict[tuple[str, str], Member | str] = {}

    def member(self, pod: dict) -> Member | str:
        meta = pod.get("metadata") or {}
        ident = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        got = self._last.get(ident) or self._this.get(ident) if all(ident) else None
        if got is None:
            got = _decode(pod)
        if all(ident) and len(self._this) < self.bound:
            self._this[ident] = got
        return got

    def turn_done(self) -> None:
        self._last, self._this = self._this, {}


def _decode(pod: dict) -> Member | str:
    try:
        return member(pod)
    except ContractError as e:
        return str(e)


def group_jobs(pods: list[dict], cache: MemberCache | None = None) -> Jobs:
    by_job: dict[str, list[Member]] = {}
    errors = []
    for pod in pods:
        if not is_ray_pod(pod):
            continue
        m = cache.member(pod) if cache else _decode(pod)
        if isinstance(m, str):
            errors.append(m)
            continue
        by_job.setdefault(m.job.key, []).append(m)
    if cache:
        cache.turn_done()
    specs_disagree = [k for k, ms in by_job.items() if len({(m.job.size, m.job.entrypoint, m.job.config_json) for m in ms}) > 1]
    for k in specs_disagree:
        errors.append(f"job {k}: its pods disagree on gang size, entrypoint or config; not started")
        del by_job[k]
    return Jobs({k: tuple(sorted(v, key=lambda m: m.key)) for k, v in by_job.items()}, tuple(errors))


def decide(members: tuple[Member, ...], running: frozenset[str] | None, lost_in_ray: frozenset[str] = frozenset(),
           replaced: frozenset[str] = frozenset(), done: bool = False) -> Decision:
    """`running`: the pods the job's controller holds (None before start); `lost_in_ray`: pods whose
    trainers died (the controller's take_lost); `replaced`: lost pods whose replacement was already
    requested (the watch may not show it yet); `done`: the job finished, nothing is replaced."""
    if not members:
        return Decision(waiting="no pods")
    job: JobSpec = members[0].job
    superseded = {m.replaces for m in members if m.replaces}  # lost before: a restarted bridge knows it from this
    live = [m for m in members if not m.lost and m.key not in superseded]
    bound = [m for m in live if m.slice is not None]
    if running is None:
        if len(bound) < job.size:
            return Decision(waiting=f"{len(bound)} of {job.size} pods bound with a Tessera assignment")
        return Decision(start=tuple((m.key, m.slice) for m in bound[:job.size]))
    lost = {m.key for m in members if m.lost} | set(lost_in_ray)
    add = tuple((m.key, m.slice) for m in bound if m.key not in running and m.key not in lost)
    remove = tuple(sorted(k for k in running if k in {m.key for m in members if m.lost}
                          or k not in {m.key for m in members}))
    if done or all(m.deleting for m in members):  # finished, or the whole job is being deleted
        return Decision(add=(), remove=remove)
    replaced = {m.replaces for m in members if m.replaces} | set(replaced)
    gone = {k for k in running if k not in {m.key for m in members}}  # deleted (evicted, preempted, by hand)
    replace = tuple(sorted(k for k in lost | gone if k not in replaced))
    mine = {m.key for m in members if m.replaces} & {m.key for m in members if m.lost}
    delete = tuple(sorted(k for k in lost & mine))
    return Decision(add=add, remove=remove, replace=replace, delete=delete)


@dataclass(frozen=True, slots=True)
class Repair:
    replace: tuple[str, ...] = ()  # lost pods to replace now
    delete: tuple[str, ...] = ()  # lost pods marked as the bridge's: deleted only if their UID is on its record
    waiting: str = ""


def repair(members: tuple[Member, ...], gone: frozenset[str] = frozenset(), replaced: frozenset[str] = frozenset()) -> Repair:
    """What the bridge does for one job. `members`: its pods now; `gone`: pods of the job seen before
    and deleted since, and those of the job's own `gone` list the bridge accepts (bridge._claims: the
    list is tenant-written); `replaced`: lost pods whose replacement the bridge already asked for.

    Only a started job is repaired (one of its pods carries a phase the job wrote), none that
    finished (a pod of it says Succeeded, live or not: once the job's driver exits, its Ray head goes
    and every member's `ray start --block` fails, so a finished job's pods end Failed, and were replaced
    over and over, each replacement failing to reach the head: seen on real pods, tests/e2e/
    test_ray_job_e2e.py) or whose pods are all being deleted. Live pods never
    exceed the gang size: a job that marks its pods lost over and over churns them one for one,
    it cannot make the bridge create more."""
    if not members:
        return Repair(waiting="no pods")
    size = members[0].job.size
    if not any(m.job_phase for m in members):
        return Repair(waiting="the job has not started (no pod carries its phase)")
    if all(m.deleting for m in members):
        return Repair(waiting="the job is being deleted")
    superseded = {m.replaces for m in members if m.replaces}
    if any(m.job_phase == "Succeeded" for m in members):
        return Repair(waiting="the job succeeded")
    live = [m for m in members if not m.lost and m.key not in superseded]
    lost = sorted({m.key for m in members if m.lost} | set(gone))
    todo = [k for k in lost if k not in superseded and k not in replaced]
    room = max(0, size - len(live))
    delete = tuple(m.key for m in members if m.lost and m.created_by == BRIDGE_NAME)
    return Repair(replace=tuple(todo[:room]), delete=delete)


def controlling_owner(pod: dict) -> str:
    """'Kind/name' of the controller that owns the pod ('' when none).

    Such a pod (a KubeRay worker, a Job's or a ReplicaSet's pod) is recreated by its owner; a
    replacement from the bridge as well would double it. The bridge then only shrinks the job and
    lets the owner's new pod join when Tessera binds it.
    """
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):  # kind and name are free text the apiserver keeps as written
            return f"{str(ref.get('kind', '?'))[:63]}/{str(ref.get('name', '?'))[:253]}"
    return ""


def slot_of(pod: dict) -> tuple[str, int]:
    """The member slot a pod fills and its replacement number: `w-r3` replacing `w-r2` is (`w`, 3); a pod
    that replaces nothing is its own slot, number 0."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    base, _, n = name.rpartition("-r")
    if (meta.get("annotations") or {}).get(REPLACES_ANNOTATION) and base and n.isdigit():
        return base, int(n)
    return name, 0


def replacement_pod(pod: dict, taken: Container[str], first: int = 1) -> dict:
    """A new pod like `pod` (same spec, labels, gang and job annotations), unbound, with a fresh name.

    Tessera's per-bind annotations and the job's progress are dropped; `tessera.dev/replaces`
    names the lost pod and `tessera.dev/created-by` marks it as the bridge's (bridge.py adds its MAC
    and records the new pod's UID: only that makes it deletable). The name search starts at `first`
    (the slot's highest number seen plus one): from -r1 each time, the 20,000th replacement of a
    crash-looping member tried 20,000 names.
    """
    meta = pod.get("metadata") or {}
    base, _ = slot_of(pod)
    ns = meta.get("namespace", "default")
    n = first
    while f"{ns}/{base}-r{n}" in taken:  # taken: namespace/name keys
        n += 1
    name = f"{base}-r{n}"
    ann = {k: v for k, v in (meta.get("annotations") or {}).items()
           if k not in (ASSIGNMENT_ANNOTATION, VISIBLE_DEVICES_ANNOTATION, MAC_ANNOTATION, PHASE_ANNOTATION,
                        PROGRESS_ANNOTATION, LOST_ANNOTATION, BRIDGE_MAC_ANNOTATION, CREATED_BY_ANNOTATION)}
    ann[REPLACES_ANNOTATION] = f"{ns}/{meta['name']}"
    ann[CREATED_BY_ANNOTATION] = BRIDGE_NAME
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)
    new_meta = {"name": name, "namespace": ns, "annotations": ann,
                "labels": dict(meta.get("labels") or {})}
    if meta.get("ownerReferences"):
        new_meta["ownerReferences"] = copy.deepcopy(meta["ownerReferences"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": new_meta, "spec": spec}
