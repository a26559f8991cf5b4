"""Gangs: pods placed all together or not at all, admitted as one once they all exist and fit.

Two sources make a gang: Tessera's annotations (`tessera.dev/gang-name` and `-size`, every member
saying the size) and scheduler-plugins' PodGroup (pods labelled `scheduling.x-k8s.io/pod-group`; the
PodGroup object says `minMember`), which Kubeflow's training operator and KubeRay create
(docs/gangs-ecosystem.md).

The model is the coscheduling plugin's PreFilter and Permit, fitted to an extender that must answer
every call at once (docs/architecture.md, "Gangs"):

1. Members check in. A member's filter call names the nodes kube-scheduler's own filters passed for
   it. The gang keeps the newest such list per *kube shape* (`PodInfo.kube_shape`: members built from
   one template get the same verdict from kube-scheduler on every node at one moment, so one call
   speaks for all of them).
2. Admission. Once the gang has its required members (the size, or minMember) and each one still to
   place has checked in, they are placed on the live cluster by the policy: per shape, the nodes are
   ranked once by the policy's score and filled in that order, so a gang packs onto few nodes. Enough
   fit: their GPUs stay held for them, and the gang is admitted. Too few: all of it is given back at
   once, nothing stays held, and the member is refused in words.
3. Binding. The member whose filter admitted the gang passes only its held node, so kube-scheduler
   binds it as any pod; Tessera binds the others itself at once (kube/gang_binder.py). No member waits
   in kube-scheduler's unschedulable queue for its 60-s flush, and no bind waits for another; except a
   member placed by its peers (anti-affinity, topology spread), which only kube-scheduler may bind: its
   GPUs are held until that flush brings it back (PEER_HOLD_S).
4. Holds lapse. What is held for members not bound within the gang's timeout (60 s, or the PodGroup's
   scheduleTimeoutSeconds) is given back, and the gang waits out a backoff before it is admitted again.

Once its required members are placed a gang runs: further members (an elastic job above minMember, a
replacement of a lost member) are placed one at a time like any pod. A gang that waits for room past the
reservations' bound drains the nodes it needs (gang_drains.py, with `--reservations on`).

Bounded work: an admission is one ranking per member shape (a pass over the nodes the policy already
keeps current) and a walk down it that never steps back, so O(nodes + members) fit checks; a failed
admission is not planned again until a node or an offer changes (bench/gang_bound.py has the figures).
All of it under the extender's lock; the Extender holds this object and delegates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera_contract import GANG_SIZE_ANNOTATION, TERMINAL_PHASES

from .core.cluster import Cluster
from .core.model import Assignment
from .core.placer import Placer
from .gang_drains import GangDrains
from .gang_plan import MAX_KINDS, Blocked, Closed, GangPlan  # noqa: F401 (MAX_KINDS: the bound, named where gangs are)
from .offers import Mask, Offers
from .state import PodGroup, PodInfo

GangKey = tuple[str, str]  # (source, namespace/name): two sources' gangs of one name are two gangs
TESSERA, PODGROUP = "tessera", "podgroup"

# How long an admitted gang's GPUs are held for members not bound yet. Tessera binds them within a second
# of admission (kube/gang_binder.py), so this bounds only failures: binds the API refuses, a leader that
# stepped down. scheduler-plugins' coscheduling waits 60 s by default in Permit; a PodGroup may say its own.
DEFAULT_TIMEOUT_S = 60.0
# A member placed by its peers (anti-affinity, topology spread) is bound by kube-scheduler only, and a member refused
# before its gang was whole sits in kube-scheduler 1.20's unschedulable queue: nothing in the gang's own binds moves
# it (AssignedPodAdded moves a pod only when its required pod *affinity* matches the bound pod), so it is tried again
# at the queue's flush, which runs every 30 s and takes pods that waited over 60 s: up to 90 s after its refusal. Its
# GPUs are held at least this long, or they lapse just before it comes back and the gang waits out a backoff and
# another flush (in CI a two-member gang that keeps apart was not bound after 120 s).
PEER_HOLD_S = 120.0
# After holds lapsed with the gang not running, it is not admitted again for this long, doubling to the most:
# each admission holds GPUs others could use for up to the timeout.
BACKOFF_S, BACKOFF_MAX_S = 10.0, 300.0
# kube-scheduler binds the member whose filter admitted the gang; Tessera binds it too only after this long.
TRIGGER_GRACE_S = 2.0
# Gangs tried again off the request path per round (a PodGroup created late, holds that lapsed): oldest first.
RETRIES_PER_ROUND = 8
# A refusal is said again without a second look while nothing changed (no node, member or offer) for this long:
# every member of a waiting gang of 512 is filtered again at each cluster event, and planning each cost 2.5 ms on
# 5,000 nodes. Time matters too (a backoff running out, a drain coming due), so the words live a few seconds.
REFUSAL_MEMO_S = 5.0

Release = Callable[[str, str], None]  # give back what the pod (uid, key) holds


def key_of(info: PodInfo | None) -> GangKey | None:
    if info is None:
        return None
    if info.gang is not None:
        return TESSERA, info.gang.name
    return (PODGROUP, info.pod_group) if info.pod_group else None


def title(key: GangKey) -> str:
    return f"gang {key[1]}" if key[0] == TESSERA else f"PodGroup {key[1]}"


@dataclass(slots=True)
class GangState:
    key: GangKey
    members: set[str] = field(default_factory=set)  # uids of its watched pods
    offers: dict[str, tuple[int, int, Mask]] = field(default_factory=dict)  # kube shape -> (epoch, names' hash, mask)
    held: dict[str, str] = field(default_factory=dict)  # uid -> node: admitted, not bound yet
    deadline: float = 0.0  # when what `held` holds goes back
    trigger: str = ""  # the member whose filter admitted it: kube-scheduler binds that one
    admitted_s: float = 0.0
    backoff_until: float = 0.0
    backoff_s: float = 0.0
    lapsed: str = ""  # why the last admission lapsed, while its backoff runs
    version: int = 0  # bumped whenever a member, an offer or its PodGroup changes
    live: tuple[int, list[PodInfo]] = (-1, [])  # (version, its live members then): each filter reads them 3 times
    failed: tuple = ()  # (node generation, version, when) of the last refusal
    failed_words: tuple[str, bool] = ("", False)
    waiting_since: float = 0.0  # order of retries: oldest first


@dataclass(frozen=True, slots=True)
class Verdict:
    """What filter says of a gang member: `passed` its held node, or every node refused in `words`."""

    passed: str = ""
    words: str = ""
    never: bool = False  # no room ever (the cluster is too small): kube-scheduler must not preempt for it
    individual: bool = False  # the gang runs: judge the member as any pod


class Gangs:
    """Every gang the watch shows, its admission and what admission holds; under the extender's lock."""

    def __init__(self, cluster: Cluster, placer: Placer, pods: dict[str, PodInfo], offers: Offers,
                 release: Release, blocked: Blocked, closed: Closed, clock: Callable[[], float],
                 drains: GangDrains) -> None:
        self.cluster, self.placer, self.pods, self.offers = cluster, placer, pods, offers
        self.release, self.clock = release, clock
        self.plan = GangPlan(cluster, placer, offers, blocked, closed)  # where members go (gang_plan.py)
        self.drains = drains  # the nodes gangs that waited past their bound hold while they drain
        self.states: dict[GangKey, GangState] = {}
        self.groups: dict[str, PodGroup] = {}  # namespace/name -> the PodGroup object, as the watch shows it
        self.groups_missing = ""  # why the API serves no PodGroups, "" while it does
        self.admitted: set[GangKey] = set()  # gangs holding GPUs for members not bound yet
        self.dirty: set[GangKey] = set()  # gangs to try again off the request path
        self.wake = threading.Event()  # set when members wait to be bound (kube/gang_binder.py waits on it)

    # --- the watch ---------------------------------------------------------------------------------

    def watched(self, info: PodInfo, old: PodInfo | None) -> None:
        key, was = key_of(info), key_of(old)
        if was is not None and was != key:
            self._leave(was, info.uid, to=key)
        if key is None:
            return
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = GangState(key, waiting_since=self.clock())
        st.version += 1
        if info.uid not in st.members:
            st.members.add(info.uid)
            self.dirty.add(key)  # it may be the member the gang waited for
        if info.node or info.phase in TERMINAL_PHASES or info.terminating:
            self._unhold(st, info.uid)

    def gone(self, uid: str, info: PodInfo | None) -> None:
        key = key_of(info)
        if key is not None:
            self._leave(key, uid)

    def upsert_group(self, group: PodGroup) -> None:
        if self.groups.get(group.key) != group:
            self.groups[group.key] = group
            self.dirty.add((PODGROUP, group.key))
            if (st := self.states.get((PODGROUP, group.key))) is not None:
                st.version += 1

    def delete_group(self, key: str) -> None:
        self.groups.pop(key, None)

    def _leave(self, key: GangKey, uid: str, to: GangKey | None = None) -> None:
        st = self.states.get(key)
        if st is None:
            return
        st.members.discard(uid)
        st.version += 1
        self._unhold(st, uid)
        if to is not None and st.backoff_until > self.clock():  # renamed to escape a backoff: it goes along
            new = self.states.setdefault(to, GangState(to, waiting_since=self.clock()))
            new.backoff_until, new.backoff_s, new.lapsed = max(new.backoff_until, st.backoff_until), st.backoff_s, st.lapsed
        if not st.members:
            del self.states[key]
            self.admitted.discard(key)
            self.dirty.discard(key)
            self.drains.release(key)

    def _unhold(self, st: GangState, uid: str) -> None:
        if st.held.pop(uid, None) is not None and not st.held:
            self.admitted.discard(st.key)

    # --- filter and bind ---------------------------------------------------------------------------

    def filter(self, info: PodInfo, names: list[str]) -> Verdict | None:
        """What filter answers a gang member now, admitting its gang if it can; None for a pod in no gang.

        Only a pod the watch shows (same UID, name and gang) moves anything: any other is told in words why
        its gang waits, and nothing is held or remembered for it (a verb never invents pods).
        """
        key = key_of(info)
        if key is None:
            return None
        known = self.pods.get(info.uid)
        if known is None or known.key != info.key or key_of(known) != key or known.node:
            return self.view(info)
        st = self.states[key]
        held = self.cluster.assignments.get(known.key)
        if held is not None:
            return self._held_verdict(st, known, held, names)
        self._check_in(st, known, names)  # even while it cannot be admitted: a PodGroup made later finds it ready
        words, never = self._why_not(st, known)
        if words:
            return Verdict(words=words, never=never)
        if self._running(st):
            return Verdict(individual=True)
        words, never = self._admit(st, trigger=known, names=names)
        if words:
            return Verdict(words=words, never=never)
        held = self.cluster.assignments.get(known.key)
        return Verdict(passed=held.node) if held is not None else Verdict(individual=True)

    def view(self, info: PodInfo) -> Verdict | None:
        """filter's words for a gang member, changing nothing (the waiting-reason writer, /inspect, unknown pods)."""
        key = key_of(info)
        if key is None:
            return None
        st = self.states.get(key)
        known = self.pods.get(info.uid)
        if st is None or known is None or known.key != info.key or key_of(known) != key:
            return Verdict(words=f"tessera: {title(key)}: {info.key} was not seen through the API watch as its member; "
                                 "a gang is admitted from the members the watch shows (kube-scheduler will retry)")
        held = self.cluster.assignments.get(info.key)
        if held is not None and not known.node:
            return Verdict(passed=held.node)
        words, never = self._why_not(st, known)
        if words:
            return Verdict(words=words, never=never)
        if self._running(st):
            return Verdict(individual=True)
        words, never = self._waiting_words(st, info)
        return Verdict(words=words, never=never)

    def bind_refusal(self, info: PodInfo, node: str) -> str:
        """'' when bind may place the watched member on `node` now (its gang runs, or it is admitted here with
        `node` for this member); else why not. Binds reach here only for members not held already."""
        key = key_of(info)
        if key is None:
            return ""
        st = self.states.get(key)
        if st is None:
            return f"tessera: {title(key)} is not known yet"
        words, _ = self._why_not(st)
        if words:
            return words
        if self._running(st):
            return ""
        words, _ = self._admit(st, trigger=info, names=[node], pinned=True)
        if words:
            return words
        held = self.cluster.assignments.get(info.key)
        return "" if held is not None and held.node == node else (
            f"tessera: {title(key)} was admitted, but {info.key} fits the gang only elsewhere than {node}")

    def binding(self, uid: str) -> bool:
        """Whether `uid` is held by its gang's admission (its bind takes those GPUs)."""
        info = self.pods.get(uid)
        st = self.states.get(key_of(info)) if info is not None else None
        return st is not None and uid in st.held

    def _held_verdict(self, st: GangState, info: PodInfo, held: Assignment, names: list[str]) -> Verdict:
        if held.node in names or info.uid not in st.held:
            return Verdict(passed=held.node) if held.node in names else Verdict(
                words=f"tessera: {info.key} holds GPUs on {held.node}, which kube-scheduler did not offer it now")
        # kube-scheduler's own filters no longer pass the node admission chose: place it again where they do
        self.cluster.release(held.pod)
        placed = self.plan.place([info], {info.kube_shape: self.offers.mask(names)}, title(st.key))
        if placed and not isinstance(placed, str):
            st.held[info.uid] = placed[0][1].node
            return Verdict(passed=placed[0][1].node)
        self.cluster.adopt(held)
        return Verdict(words=f"tessera: held for {info.key} on {held.node} ({title(st.key)} was admitted there), which "
                             "kube-scheduler's own checks do not pass now; no other offered node fits it")

    # --- admission ---------------------------------------------------------------------------------

    def _required(self, st: GangState, info: PodInfo | None = None) -> tuple[int, float, str]:
        """(members required, hold timeout, why the gang cannot be admitted at all now or ''); `info`: the pod asking."""
        kind, name = st.key
        if kind == TESSERA:
            sizes = sorted({i.gang.size for i in self._live(st) if i.gang is not None})
            if len(sizes) > 1:
                mine = info.gang.size if info is not None and info.gang is not None else None
                others = [str(n) for n in sizes if n != mine][:4]
                said = f"this pod says {mine}, other members say" if mine in sizes else "members say"
                return 0, DEFAULT_TIMEOUT_S, (
                    f"tessera: the members of gang {name} disagree on {GANG_SIZE_ANNOTATION}: {said} {', '.join(others)}"
                    "; give every member the same size")
            return (sizes[0] if sizes else 0), DEFAULT_TIMEOUT_S, ""
        group = self.groups.get(name)
        if group is None:
            why = f"; {self.groups_missing}" if self.groups_missing else ""
            return 0, DEFAULT_TIMEOUT_S, (f"tessera: PodGroup {name} (the pod's label scheduling.x-k8s.io/pod-group) does "
                                          f"not exist{why}; its pods wait for it, as scheduler-plugins' coscheduling does")
        return group.min_member, group.timeout_s or DEFAULT_TIMEOUT_S, ""

    def _live(self, st: GangState) -> list[PodInfo]:
        """Its members that can still run (a copy: callers extend it)."""
        if st.live[0] != st.version:
            pods = self.pods
            st.live = (st.version, [i for u in st.members if (i := pods.get(u)) is not None
                                    and i.phase not in TERMINAL_PHASES and not (i.terminating and not i.node)])
        return list(st.live[1])

    def _placed(self, live: list[PodInfo]) -> list[PodInfo]:
        assigned = self.cluster.assignments
        return [i for i in live if i.node or i.key in assigned]

    def _running(self, st: GangState) -> bool:
        required, _, _ = self._required(st)
        return required > 0 and len(self._placed(self._live(st))) >= required

    def _why_not(self, st: GangState, info: PodInfo | None = None) -> tuple[str, bool]:
        """Why the gang cannot be admitted whatever fits: members disagree, no PodGroup, a backoff runs."""
        _, _, problem = self._required(st, info)
        if problem:
            return problem, False
        left = st.backoff_until - self.clock()
        if left > 0 and not self._running(st):
            return f"{st.lapsed}; admitted again in {left:.0f} s", False
        return "", False

    def _check_in(self, st: GangState, info: PodInfo, names: list[str]) -> None:
        seen = hash(tuple(names))  # the same names as last time (the usual case): no mask to make again
        got = st.offers.get(info.kube_shape)
        if got is None or got[:2] != (self.offers.epoch, seen):
            mask = self.offers.mask(names)
            st.offers[info.kube_shape] = (self.offers.epoch, seen, mask)
            if got is None or got[0] != self.offers.epoch or got[2] != mask:
                st.version += 1

    def _offer(self, st: GangState, shape: str) -> Mask | bool:
        """The nodes kube-scheduler offered members of this kube shape (None: all), or False if it offered none yet."""
        got = st.offers.get(shape)
        if got is None or got[0] != self.offers.epoch:
            return False
        return got[2]

    def _admit(self, st: GangState, trigger: PodInfo | None, names: list[str] | None,
               pinned: bool = False) -> tuple[str, bool]:
        """Admit the gang now if its required members all exist, have checked in and fit: ('', False), GPUs held.
        Else (why not, never fits) with nothing held. `pinned`: the trigger may go only to `names` (a bind)."""
        if not pinned and st.failed[:2] == (self.placer.generation, st.version) \
                and self.clock() - st.failed[2] < REFUSAL_MEMO_S:
            return st.failed_words  # nothing changed since it was refused: the same words, no second look
        words, never = self._try(st, trigger, names, pinned)
        if words and not pinned:  # the generation after the attempt: a plan that failed gave everything back
            st.failed, st.failed_words = (self.placer.generation, st.version, self.clock()), (words, never)
        return words, never

    def _try(self, st: GangState, trigger: PodInfo | None, names: list[str] | None, pinned: bool) -> tuple[str, bool]:
        required, timeout, _ = self._required(st)
        live = self._live(st)
        placed = self._placed(live)
        if len(placed) >= required:
            return "", False
        if trigger is not None and trigger.uid not in {i.uid for i in live}:
            live.append(trigger)
        todo = [i for i in live if not i.node and i.key not in self.cluster.assignments]
        never = self.plan.never(title(st.key), todo, required - len(placed))
        if never:
            return never, True
        if len(placed) + len(todo) < required:
            missing = required - len(placed) - len(todo)
            return (f"tessera: {title(st.key)} has {len(live)} of its {required} members; it waits for the other "
                    f"{missing} to be created, and binds none before all {required} can be placed together"), False
        offers = {shape: self._offer(st, shape) for shape in {i.kube_shape for i in todo}}
        pin = (trigger.uid, self.offers.mask(names or [])) if pinned and trigger is not None else None
        ready = [i for i in todo if offers[i.kube_shape] is not False or (pin and i.uid == pin[0])]
        # the member kube-scheduler is placing now first (it passes its node), then the oldest: a plan that places only
        # some (minMember below the pods there are) is the same whatever order the watch delivered them in
        first = trigger.uid if trigger is not None else ""
        ready.sort(key=lambda i: (i.uid != first, i.created_s or 0.0, i.key))
        if len(placed) + len(ready) < required:
            unseen = required - len(placed) - len(ready)
            return (f"tessera: {title(st.key)} has all {required} members, but kube-scheduler has not yet offered nodes "
                    f"to {unseen} of them (its own checks may refuse them every node: see their events); none is bound "
                    f"before all {required} can be placed together"), False
        drain = self.drains.by_gang.get(st.key)
        done = self.plan.place(ready, offers, title(st.key), pin, prefer=drain.nodes if drain is not None else frozenset())
        if isinstance(done, str):
            return done, False
        if len(placed) + len(done) >= required:
            now = self.clock()
            st.held = {i.uid: a.node for i, a in done}
            peers = any(i.placed_by_peers and i.uid != first for i, _ in done)
            st.deadline, st.admitted_s = now + (max(timeout, PEER_HOLD_S) if peers else timeout), now
            st.trigger = trigger.uid if trigger is not None and not pinned else ""
            st.failed, st.lapsed = (), ""
            self.drains.release(st.key)
            self.admitted.add(st.key)
            self.dirty.discard(st.key)
            self.wake.set()
            return "", False
        for _, a in done:
            self.cluster.release(a.pod)
        return (f"tessera: {title(st.key)} needs {required} pods placed together; only {len(placed) + len(done)} fit "
                f"now, waiting for room for the whole gang{self._drain(st, live, ready, offers)}"), False

    def _drain(self, st: GangState, live: list[PodInfo], ready: list[PodInfo], offers: dict[str, Mask | bool]) -> str:
        """Drain nodes for a gang that waited for room past its bound (gang_drains.py); what its words add."""
        drain = self.drains.by_gang.get(st.key)
        created = [i.created_s for i in live if i.created_s is not None]
        if drain is None and created and self.drains.due(st.key, self.drains.clock() - max(created)):
            drain = self.drains.drain(st.key, title(st.key), [self.placer.request_for(i.request) for i in ready],
                                      self.plan.candidates(ready, offers), max(i.priority for i in live))
        if drain is not None:
            shown = sorted(drain.nodes)
            more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
            return f"; nodes {', '.join(shown[:4])}{more} are held for it as they drain"
        refused = self.drains.refused.get(st.key)
        return f"; {refused.removeprefix(title(st.key) + ' ')}" if refused else ""

    def _waiting_words(self, st: GangState, info: PodInfo) -> tuple[str, bool]:
        """(why the gang waits, whether no room could ever take it), as filter last said it, read without planning."""
        required, _, _ = self._required(st)
        live = self._live(st)
        if info.uid not in {i.uid for i in live}:
            live.append(info)
        placed = self._placed(live)
        never = self.plan.never(title(st.key), [i for i in live if i not in placed], required - len(placed))
        if never:
            return never, True
        if len(live) < required:
            return (f"tessera: {title(st.key)} has {len(live)} of its {required} members; it waits for the other "
                    f"{required - len(live)} to be created, and binds none before all {required} can be placed "
                    "together"), False
        if st.failed_words[0]:
            return st.failed_words
        return (f"tessera: {title(st.key)} has all {required} members; it is admitted when the last is tried by "
                "kube-scheduler"), False

    # --- time and the binder -----------------------------------------------------------------------

    def tick(self, binding: set[str]) -> None:
        """Give back what admitted gangs hold past their timeout (not while a member's bind call is in flight)."""
        now = self.clock()
        released = False
        self.drains.expire()
        for key in [k for k in self.admitted if self.states[k].deadline <= now]:
            st = self.states[key]
            required, _, _ = self._required(st)
            waiting = [u for u in st.held if u not in binding]
            for uid in waiting:
                info = self.pods.get(uid)
                if info is not None and not info.node:
                    self.release(uid, info.key)
                del st.held[uid]
            if not st.held:
                self.admitted.discard(key)
            released = released or bool(waiting)
            if waiting and not self._running(st):
                bound = sum(1 for i in self._live(st) if i.node)
                st.backoff_s = min(2 * st.backoff_s, BACKOFF_MAX_S) if st.backoff_s else BACKOFF_S
                st.backoff_until = now + st.backoff_s
                st.lapsed = (f"tessera: {title(key)} was admitted, but only {bound} of its {required} members were bound "
                             f"within {st.deadline - st.admitted_s:.0f} s; the GPUs held for the others went back")
        if released:  # room came back that kube-scheduler does not know of: waiting gangs may fit now
            self.dirty.update(k for k, s in self.states.items() if not s.held)

    def to_bind(self, binding: set[str]) -> list[tuple[str, str, str]]:
        """(uid, namespace/name, node) of each admitted member Tessera binds itself now (kube/gang_binder.py). Not a
        member placed by its peers (pod affinity, anti-affinity, topology spread): only kube-scheduler can judge it
        against the siblings bound meanwhile. A sibling's bind moves it back to kube-scheduler's active queue only
        when its required pod affinity matches the sibling (kube-scheduler 1.20's AssignedPodAdded); otherwise the
        queue's flush brings it back within 90 s, which its hold outlasts (PEER_HOLD_S). If its held node no longer
        passes then, its filter moves the hold to one that does."""
        now = self.clock()
        out = []
        for key in self.admitted:
            st = self.states[key]
            for uid, node in st.held.items():
                if uid in binding or (uid == st.trigger and now - st.admitted_s < TRIGGER_GRACE_S):
                    continue
                info = self.pods.get(uid)
                if info is not None and not info.node and not info.placed_by_peers:
                    out.append((uid, info.key, node))
        return out

    def retry(self, limit: int = RETRIES_PER_ROUND) -> int:
        """Try to admit up to `limit` gangs marked dirty, oldest first, with the offers they have; returns how many."""
        tried = 0
        for key in sorted(self.dirty, key=lambda k: self.states[k].waiting_since if k in self.states else 0.0):
            self.dirty.discard(key)
            st = self.states.get(key)
            if st is None or st.held or self._why_not(st)[0] or self._running(st):
                continue
            self._admit(st, trigger=None, names=None)
            tried += 1
            if tried >= limit:
                break
        return tried

    def status(self, info: PodInfo) -> tuple[int, int, int, str]:
        """(members placed, members seen, members required, why it waits or '') for /inspect."""
        key = key_of(info)
        st = self.states.get(key) if key is not None else None
        if st is None:
            return 0, 0, 0, ""
        required, _, _ = self._required(st)
        live = self._live(st)
        verdict = self.view(info)
        return len(self._placed(live)), len(live), required, verdict.words if verdict is not None else ""

    def drained_nodes(self) -> set[str]:
        return set().union(*(d.nodes for d in self.drains.by_gang.values()))

    def counts(self) -> tuple[int, int]:
        """(gangs waiting to be admitted, gangs admitted with members still to bind), for /metrics."""
        waiting = sum(1 for st in self.states.values() if not st.held and not self._running(st))
        return waiting, len(self.admitted)
