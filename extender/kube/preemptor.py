"""Tessera's own preemption: for a GPU pod kube-scheduler left waiting, delete the fewest lower-priority pods that make room.

Why Tessera acts itself: kube-scheduler 1.20.2 never calls an extender's preempt verb (its
frameworks are built without the extenders: docs/wire-protocol.md §7), and its own dry run
ignores `tessera.dev/gpu-milli`, so it nominates a 600-milli pod to a node whose GPU holds two
500-milli pods with no victim at all, and the pod waits for ever. Measured on the e2e control
plane before this module: nominated in 0.2 ms, never bound.

What it does, off the watch thread (the watch only offers; an offer waits in a bounded, fair set, retries.py):
1. The watch sees a pending GPU pod marked Unschedulable. Kubernetes' rules decide whether anything may be evicted or
   moved for it at all (`Extender.displace_refusal`): not for a gang member (kube-scheduler preempts for one pod at a
   time, and evicting for one member promises the gang nothing), not for a pod whose `spec.preemptionPolicy` is Never
   (its PriorityClass lets it jump the queue, never evict: kube-scheduler 1.20's DefaultPreemption skips it in
   PodEligibleToPreemptOthers), and only for a pod of a schedulerName Tessera serves (`tessera serve
   --scheduler-name`): a pod another scheduler places, or none does, gets nothing.
2. The cheap check (`Extender.room_possible`): the pod must fit one of the nodes a plan weighs once every pod the
   plan may take there is gone; one that does not spends no plan and is not planned for.
3. `Extender.plan_preemption` picks the node and victims (extender/preemption.py: lower priority
   only, fewest, kube-scheduler's ranking, nothing when no set helps).
4. Disruption budgets: the victims' PodDisruptionBudgets are read; a victim whose budget allows
   no more disruptions is marked protected and the plan is redone (at most BUDGET_ROUNDS times),
   so protected pods go only when nothing else helps, as kube-scheduler does (it honours budgets
   where it can and still preempts when it cannot).
5. `Extender.nominate` records the plan, so the room stays the preemptor's (nominations.py);
   then each victim is deleted with a UID precondition (a new pod of the same name is never hit)
   and its own grace period, and both pods get an Event saying who and why.

With moves on (`tessera serve --moves on`), step 3 first asks for a move plan (extender/moves.py):
trainers of elastic Ray jobs whose owner opted in, of any priority, moved rather than evicted. A
trainer a PodDisruptionBudget protects is never moved. Each moved trainer's pod is deleted the same
way (UID precondition, its own grace period): its job shrinks around it, the Ray bridge creates its
replacement and filter sends that to the destination the plan names. Preemption is tried only when no
move helps. The rules of step 1 hold for moves too.

Drain leases (queue_reservations.py): each step first deletes the pods whose lease on a drain-pool or reserved node
lapsed while a reservation holds that node (queue_reservations.py renews the others), the same way (UID
precondition, own grace period, an Event on the pod), unless a disruption budget protects the pod: then it stays, is
asked again LEASE_RETRY_S later, and after the reservations' grace its end counts as unknown, so its node leaves the
pool.

Bounds: PLANS_PER_MINUTE plans (each runs under the extender's lock, up to ~0.3 s at worst), of which one
namespace gets PLANS_PER_NAMESPACE, one plan per pod per RETRY_S. A pod that may not be planned for yet (no plan
of the minute or of its namespace's share left, planned under RETRY_S ago, this replica does not bind, the API
failed) waits in the set (retries.py: RETRY_SET pods, each once) and the timer offers it again when it may be:
before, such an offer was dropped, and kube-scheduler retrying the pod with the same message made no watch event to
offer it again (issue 35 saw none for 150 s), so another tenant's priority-1000 pod waited unplanned behind five
namespaces' never-fitting pods. A pod that could displace nobody (no bound pod of lower priority, no movable trainer of
no higher) or that fits nowhere even with every such pod gone (the cheap check) spends no plan: a tenant's 60
never-fitting pods, re-offered each minute, had taken every plan. Only the replica that may bind acts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import orjson

from ..nominations import Nomination
from ..service import Extender
from ..state import PodInfo
from .retries import MinuteBudget, RetrySet
from .waiting import unschedulable

log = logging.getLogger(__name__)

PREEMPTING_REASON = "TesseraPreempting"
PREEMPTED_REASON = "Preempted"  # kube-scheduler's own reason on a victim: what `kubectl describe` readers know
MOVING_REASON = "TesseraMoving"  # on the waiting pod: which trainers leave its node, and to where
MOVED_REASON = "TesseraMoved"  # on a moved trainer
LEASE_ENDED_REASON = "TesseraLeaseEnded"  # on a pod deleted at the end of its drain lease (queue_reservations.py)
PLANS_PER_MINUTE = 60
PLANS_PER_NAMESPACE = 12  # a fifth: five namespaces' pods at once are planned at full speed
# The cheap checks before a plan (`Extender.room_possible`: one filter over the cluster and a trial fit per candidate
# node, under the extender's lock): twice the plans, and one namespace's share is a tenth, so ten namespaces' pods at
# once are checked at full speed and six flooding ones leave half the checks to everyone else.
CHECKS_PER_MINUTE = 120
CHECKS_PER_NAMESPACE = 12
RETRY_S = 10.0  # kube-scheduler's longest backoff: a pod still waiting after it gets another plan
RETRY_TICK_S = 1.0  # the timer that re-offers the pods whose wait is over (retries.py)
STEP_GAP_S = 0.05  # least time between two passes over the waiting set
TRIED = 10_000  # pods whose last check is remembered before the old ones are forgotten
BUDGET_ROUNDS = 3
MAX_SELECTOR_TERMS = 64  # a budget's matchLabels + matchExpressions read; a longer one is not understood and protects
# Budgets read per namespace; a namespace with more protects every pod in it (erring as an unreadable selector does).
# A tenant's 5,000 budgets of 64 terms made each plan list 50 MB per victim namespace and spend 15 s on the
# preemptor's one thread, and every other tenant's preemption waited behind it.
MAX_BUDGETS = 256
BUDGETS_TTL_S = 1.0  # one plan's rounds read a namespace's budgets once


def selector_matches(selector: object, labels: dict[str, str], empty_matches_all: bool) -> bool:
    """A label selector against a pod's labels. policy/v1 reads an empty selector as every pod,
    policy/v1beta1 (Kubernetes 1.20) as none. One Tessera cannot read (wrong types, an unknown
    operator, too long) matches, so the budget errs towards protecting."""
    if selector is None:  # a null selector matches no pod in either version
        return False
    if not isinstance(selector, dict):
        return True
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, dict) or not isinstance(expressions, list) \
            or len(match_labels) + len(expressions) > MAX_SELECTOR_TERMS:
        return True
    if not match_labels and not expressions:
        return empty_matches_all
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in expressions:
        if not isinstance(e, dict):
            return True
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not isinstance(values, list):
            return True
        if op == "In" and labels.get(key) not in values or op == "NotIn" and labels.get(key) in values \
                or op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return True
    return True


def _bounded(listed: object, v1: bool) -> list[tuple[dict, bool]] | None:
    items = listed.get("items") if isinstance(listed, dict) else None
    items = items if isinstance(items, list) else []
    more = ((listed.get("metadata") or {}) if isinstance(listed, dict) else {}).get("continue")
    if len(items) > MAX_BUDGETS or more:
        return None
    return [(b, v1) for b in items if isinstance(b, dict)]


class DisruptionBudgets:
    """Which planned victims a PodDisruptionBudget protects, read from the API for each plan."""

    def __init__(self, api, policy_api, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.policy_api, self.clock = api, policy_api, clock
        self._read: dict[str, tuple[float, list[tuple[dict, bool]] | None]] = {}  # namespace -> (when, budgets)

    def protected(self, victims: dict[str, str]) -> frozenset[str]:
        """Keys (namespace/name) of victims past what their budgets allow, counted in the order given."""
        budgets: dict[str, list[tuple[dict, bool]] | None] = {}
        allowed: dict[int, int] = {}
        out = set()
        for key in victims.values():
            namespace, _, name = key.partition("/")
            if namespace not in budgets:
                budgets[namespace] = self._recent_budgets(namespace)
            if budgets[namespace] is None:  # more budgets than Tessera reads: all of the namespace is protected
                out.add(key)
                continue
            labels = self._labels(namespace, name)
            for budget, v1 in budgets[namespace]:
                spec, status = budget.get("spec") or {}, budget.get("status") or {}
                if not selector_matches(spec.get("selector"), labels, empty_matches_all=v1):
                    continue
                left = allowed.setdefault(id(budget), _int(status.get("disruptionsAllowed")))
                allowed[id(budget)] = left - 1
                if left <= 0:
                    out.add(key)
        return frozenset(out)

    def _recent_budgets(self, namespace: str) -> list[tuple[dict, bool]] | None:
        now = self.clock()
        when, budgets = self._read.get(namespace, (-BUDGETS_TTL_S, None))
        if now - when >= BUDGETS_TTL_S:
            budgets = self._budgets(namespace)
            self._read = {ns: got for ns, got in self._read.items() if now - got[0] < BUDGETS_TTL_S}
            self._read[namespace] = (now, budgets)
        return budgets

    def _budgets(self, namespace: str) -> list[tuple[dict, bool]] | None:
        """The namespace's budgets, policy/v1 where served (1.21+), else policy/v1beta1 (1.20), with which; None when
        it has more than MAX_BUDGETS (the list asks for one more, so its size is bounded either way)."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.policy_api.list_namespaced_pod_disruption_budget(namespace, limit=MAX_BUDGETS + 1,
                                                                         _preload_content=False)
            return _bounded(orjson.loads(resp.data), True)
        except ApiException as e:
            if e.status != 404:
                raise
        client = self.policy_api.api_client
        method, url, headers, _, _ = client.param_serialize(
            "GET", "/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", path_params={"namespace": namespace},
            query_params=[("limit", MAX_BUDGETS + 1)], header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        resp = client.call_api(method, url, header_params=headers)
        resp.read()
        return _bounded(orjson.loads(resp.data), False)

    def _labels(self, namespace: str, name: str) -> dict[str, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = orjson.loads(self.api.read_namespaced_pod(name, namespace, _preload_content=False).data)
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(labels, dict) else {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Preemptor:
    """Fed by the watch (offer), plans and deletes on its own thread (run), which also re-offers the pods that wait."""

    def __init__(self, extender: Extender, api, budgets: DisruptionBudgets, events, may_act: Callable[[], bool],
                 per_minute: int = PLANS_PER_MINUTE, clock: Callable[[], float] = time.monotonic,
                 preempt: bool = True, waiting: RetrySet | None = None, checks_per_minute: int = CHECKS_PER_MINUTE) -> None:
        self.extender, self.api, self.budgets, self.events, self.preempt = extender, api, budgets, events, preempt
        self.may_act, self.clock = may_act, clock
        self.waiting = waiting or RetrySet()  # every offer waits here until due (retries.py): none is dropped for a rate
        self.plans = MinuteBudget(per_minute, PLANS_PER_NAMESPACE)
        self.checks = MinuteBudget(checks_per_minute, CHECKS_PER_NAMESPACE)  # the cheap checks (each one filter's cost)
        self._wake = threading.Event()
        self._tried: dict[str, float] = {}  # uid -> when it was last checked
        self.deferred = self.skipped = self.evicted = self.moved = self.leases_ended = 0

    @property
    def dropped(self) -> int:
        """Offers let go for good: the waiting set was full (retries.py); each is offered again on its next update."""
        return self.waiting.dropped

    def offer(self, info: PodInfo, pod: dict) -> None:
        """A pending GPU pod kube-scheduler marked Unschedulable waits to be planned for, if a rule lets anything be
        evicted or moved for it (displacement.py `refusal`: not a gang member, not preemptionPolicy Never, a
        schedulerName Tessera serves)."""
        if info.node or not info.request.gpu_count or not unschedulable(pod) or self.extender.displace_refusal(info):
            return
        if self.waiting.add(info.uid, info.key.partition("/")[0], self.clock()):
            self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(RETRY_TICK_S)
            self._wake.clear()
            self.step()
            stop.wait(STEP_GAP_S)  # offers arriving meanwhile are taken together: one pass over the set per step

    def step(self) -> int:
        """End the drain leases that lapsed; then handle every waiting pod that is due, in the set's fair order
        (namespaces with fewer checks this minute first); how many were handled. A pod bound, gone or leaving meanwhile
        is let go; one the API failed for waits RETRY_S and is tried again."""
        handled = 0
        if self.may_act() and (ended := [lease for lease in self.extender.drain_leases() if self._end_lease(lease)]):
            self.extender.drain_leases(ended)
        now = self.clock()
        for uid, _ in self.waiting.take_due(now, lambda namespace: self.checks.used(namespace, now)):
            info = self.extender.pods.get(uid)  # as the watch shows it now (a dict read: no lock needed)
            if info is None or info.node or info.terminating:
                continue
            handled += 1
            try:
                self.handle(info)
            except Exception as e:  # the API refused or vanished
                log.warning("preemption for %s failed: %s", info.key, e)
                self._defer(info, self.clock() + RETRY_S)
        return handled

    def handle(self, info: PodInfo) -> Nomination | None:
        """Check, plan, check budgets, nominate and delete for one waiting pod; the nomination acted on, or None.

        A pod that may not be handled yet (this replica does not bind; checked under RETRY_S ago; no check or plan of
        the minute, or of its namespace's share, left) waits in the set until it may. A pod no plan could help (no pod
        it may displace: free; or none whose removal makes room: the cheap check, which spends a check) spends no plan."""
        now = self.clock()
        namespace = info.key.partition("/")[0]
        wait = RETRY_S if not self.may_act() else max(self._tried.get(info.uid, -RETRY_S) + RETRY_S - now,
                                                      self.checks.wait(namespace, now), self.plans.wait(namespace, now))
        if wait > 0:
            self._defer(info, now + wait)
            return None
        if not self.extender.may_displace(info, self.preempt):  # one pass over the pods: free
            self.skipped += 1
            return None
        self.checks.spend(namespace, now)
        self._tried[info.uid] = now
        if len(self._tried) > TRIED:
            self._tried = {u: t for u, t in self._tried.items() if now - t < RETRY_S}
        if not self.extender.room_possible(info, self.preempt):
            self.skipped += 1
            return None
        self.plans.spend(namespace, now)
        plan = self._move_plan(info)
        if plan is None and self.preempt:
            plan = self._plan(info)
        if plan is None or not self.extender.nominate(plan):
            return None
        self._delete(info, plan)
        return plan

    def _end_lease(self, lease) -> bool:
        """Delete the pod whose drain lease lapsed (queue_reservations.py), unless a disruption budget protects it (then
        asked again later) or it is leaving already; with a UID precondition, so a new pod of the name is never hit."""
        from kubernetes.client.exceptions import ApiException

        info = self.extender.pods.get(lease.uid)
        if info is None or info.terminating:
            return False
        namespace, _, name = lease.key.partition("/")
        try:
            if self.budgets.protected({lease.uid: lease.key}):
                return False
            self.api.delete_namespaced_pod(name, namespace, body={"preconditions": {"uid": lease.uid}},
                                           _preload_content=False)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("ending the drain lease of %s failed: %s", lease.key, e)
                return False
        except Exception as e:  # the API vanished: asked again after the retry interval
            log.warning("ending the drain lease of %s failed: %s", lease.key, e)
            return False
        self.leases_ended += 1
        log.info("tessera: drain lease of %s on %s ended", lease.key, lease.node)
        self.events.offer("Pod", namespace, name, lease.uid, "", f"ran past its drain lease on {lease.node} (a node kept "
                          "for the largest pods, lent to it because no other node took it): deleted; its controller's "
                          "next pod is not lent such a node again", LEASE_ENDED_REASON)
        return True

    def _defer(self, info: PodInfo, due: float) -> None:
        self.deferred += 1
        self.waiting.add(info.uid, info.key.partition("/")[0], due)

    def _move_plan(self, info: PodInfo) -> Nomination | None:
        """Trainers to move for the pod (None with moves off); none a disruption budget protects."""
        plan = self.extender.plan_move(info)
        if plan is None or self.budgets.protected(plan.victims):
            return None
        return plan

    def _plan(self, info: PodInfo) -> Nomination | None:
        plan = self.extender.plan_preemption(info)
        protected: frozenset[str] = frozenset()
        for _ in range(BUDGET_ROUNDS):
            if plan is None:
                return None
            hit = self.budgets.protected(plan.victims) - protected
            if not hit:
                break
            protected |= hit
            plan = self.extender.plan_preemption(info, protected) or plan  # no plan without them: take them, as kube does
        return plan

    def _delete(self, info: PodInfo, plan: Nomination) -> None:
        """Delete the plan's victims (evicted, or moved trainers), each with its Event, and say so on the waiting pod."""
        from kubernetes.client.exceptions import ApiException

        namespace, _, name = info.key.partition("/")
        keys = sorted(plan.victims.values())  # before any delete: the watch empties plan.victims as they go
        if plan.moves:
            log.info("tessera: moving %s off %s for %s", plan.moves, plan.node, info.key)
            self.events.offer("Pod", namespace, name, info.uid, "", f"moving {len(keys)} trainer"
                              f"{'s' if len(keys) > 1 else ''} of elastic jobs off {plan.node} to make room: "
                              + ", ".join(f"{k} to {plan.moves[k]}" for k in keys), MOVING_REASON)
        else:
            log.info("tessera: preempting %s on %s for %s (priority %d)", keys, plan.node, info.key, info.priority)
            self.events.offer("Pod", namespace, name, info.uid, "", f"preempting {len(keys)} lower-priority "
                              f"pod{'s' if len(keys) > 1 else ''} on {plan.node} ({', '.join(keys)}) to make room",
                              PREEMPTING_REASON)
        for uid, key in list(plan.victims.items()):  # the watch drops victims from it as they go
            v_namespace, _, v_name = key.partition("/")
            try:
                self.api.delete_namespaced_pod(v_name, v_namespace, body={"preconditions": {"uid": uid}},
                                               _preload_content=False)
                if plan.moves:
                    self.moved += 1
                else:
                    self.evicted += 1
            except ApiException as e:
                if e.status not in (404, 409):  # gone already, or another pod now has the name: nothing to take
                    self.extender.drop_nomination(info.uid)
                    raise
            if plan.moves:
                self.events.offer("Pod", v_namespace, v_name, uid, "", f"moved to {plan.moves[key]} to make room on "
                                  f"{plan.node} for {info.key}: the job shrinks by one and regrows when its replacement "
                                  "starts there", MOVED_REASON)
            else:
                self.events.offer("Pod", v_namespace, v_name, uid, "", f"preempted by {info.key} (priority "
                                  f"{info.priority}) to make GPU room on {plan.node}", PREEMPTED_REASON)
