"""Tessera's GPU-level reason on a pod kube-scheduler left waiting, as an Event on the pod.

kube-scheduler 1.20 asks the extender only about nodes its own plugins passed. When they fail
first (CPU, memory, a taint, `nvidia.com/gpu` count), the pod's FailedScheduling event names
kube's reason and Tessera is never asked, so the GPU-level reason (no GPU with 500 milli free,
no node with that model) is nowhere a user looks. The watch sees the pod marked unschedulable
(condition PodScheduled=False, reason Unschedulable); this module judges it against every cached
node off the watch thread and writes a Warning Event `TesseraWaiting` in words.

Said once, where a user looks (`kubectl describe pod`): when kube-scheduler did ask Tessera about every
node, its FailedScheduling Event already lists Tessera's reason for each ("0/3 nodes are available:
3 tessera: no GPU has 500 milli free."), and a TesseraWaiting Event with the same reasons said them
twice. Then TesseraWaiting says only what kube-scheduler's Event cannot: the preemption that would
make room and the node reserved for the pod; with neither, nothing. The same rule decides the
refusal Event of a pod Tessera cannot read (kube/cache.py, `ApiCache._refused`).

Bounded: a queue of WAITING_QUEUE pods (a full queue drops, the watch never waits), each pod in it once and
one namespace's at most QUEUED_PER_NAMESPACE, at most per_minute judgements (each costs one filter over the
cluster), one namespace's at most JUDGED_PER_NAMESPACE, at most one Event per pod per PER_POD_S and none while
its reason is unchanged, and a remembered-reasons table of MAX_REMEMBERED pods.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ..core.cluster import grouped
from ..service import Extender
from ..state import PodInfo

log = logging.getLogger(__name__)

WAITING_REASON = "TesseraWaiting"
WAITING_QUEUE = 1_000
WAITING_PER_MINUTE = 60
# One namespace's share of both: a tenant's 1,000 unschedulable pods, touched over and over, filled the queue and
# every judgement of the minute, and another tenant's pod got its Event minutes late.
QUEUED_PER_NAMESPACE = 100
JUDGED_PER_NAMESPACE = 12
PER_POD_S = 300.0  # kube-scheduler retries a waiting pod every few seconds to minutes: one word from us is enough
MAX_REMEMBERED = 10_000
EXAMPLES = 3  # reasons shown per message, the most common first
# The start of a message that adds to kube-scheduler's FailedScheduling, which gave Tessera's reason for every node.
# Alone it is remembered as "said by kube-scheduler" and written as no Event.
KUBE_SAID = "on GPUs, kube-scheduler's event gives Tessera's reason for every node; "
# Nodes the pending reason's preemption plan looks at: the plan runs under the extender's lock, up to
# 512 trial fits (~10 ms) per node, so 16 nodes bound it near 160 ms at 60 judged pods a minute at most.
PLAN_NODES = 16
# events.k8s.io/v1 takes an Event's note up to 1 kB: kube-scheduler 1.20 writes its FailedScheduling there, and a
# longer message is refused by the apiserver (its log says "Server rejected event"): the user sees no such Event.
KUBE_EVENT_NOTE_BYTES = 1024
KUBE_MESSAGE_CHARS = 1000  # PodInfo.kube_refusal keeps this much of kube-scheduler's message (translate/objects.py)


def kube_scheduler_message(pod) -> str | None:
    """What kube-scheduler said when it marked the pod unschedulable (the condition PodScheduled=False, reason
    Unschedulable: its FailedScheduling Event's message), '' when it said nothing; None while it has not marked it."""
    status = pod.get("status") if isinstance(pod, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("status") == "False" \
                and c.get("reason") == "Unschedulable":
            message = c.get("message")
            return message if isinstance(message, str) else ""
    return None


def kube_said_tessera_words(message: str) -> bool:
    """Whether kube-scheduler's FailedScheduling Event of this message carries Tessera's filter's words: filter was
    asked (its refusal is the message, "tessera: ...", or the reason of the nodes it refused, "3 tessera: ..."), and
    the Event fit in what the apiserver takes. A refusal's words are the same in filter and in the watch (one
    pod_info), and a pod whose words change is tried again at once (the update moves it to kube-scheduler's active
    queue), so a message from Tessera's filter is taken as saying the pod's current refusal."""
    return "tessera: " in message and len(message.encode()) <= KUBE_EVENT_NOTE_BYTES


def kube_named_every_node(message: str, reasons: dict[str, str], total: int) -> bool:
    """Whether kube-scheduler's message ("0/3 nodes are available: 1 tessera: a, 2 tessera: b.") gives Tessera's
    reason for every one of the `total` nodes: each of Tessera's grouped reasons appears with its count, and the
    counts add up to all the nodes (so kube's own checks refused none). False when in doubt: a message cut to
    KUBE_MESSAGE_CHARS, one too long for kube-scheduler's Event, or another number of nodes."""
    if len(message) >= KUBE_MESSAGE_CHARS or len(message.encode()) > KUBE_EVENT_NOTE_BYTES or len(reasons) != total:
        return False
    head = f"0/{total} nodes are available: "
    if not total or not message.startswith(head) or not message.endswith("."):
        return False
    entries = f", {message[len(head):-1]}, "
    counts: dict[str, int] = {}
    for reason in reasons.values():
        text = grouped(reason)
        counts[text] = counts.get(text, 0) + 1
    return all(f", {n} {text}, " in entries for text, n in counts.items())


def unschedulable(pod: dict) -> bool:
    """kube-scheduler marked the pod unschedulable (its own checks or ours refused every node)."""
    return kube_scheduler_message(pod) is not None


def summary(passed: list[str], reasons: dict[str, str], total: int) -> str:
    """'no node fits on GPUs: 30 nodes: no GPU has 500 milli free; ...' in a bounded length."""
    if passed:
        return (f"on GPUs, {len(passed)} of {total} nodes would fit this pod now (e.g. {passed[0]}): what keeps it "
                "waiting is in kube-scheduler's own reason")
    by_text: dict[str, int] = {}
    for reason in reasons.values():
        text = grouped(reason).removeprefix("tessera: ")  # the figures that differ per node go: group by the reason
        by_text[text] = by_text.get(text, 0) + 1
    ranked = sorted(by_text.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = "; ".join(f"{n} node{'s' if n > 1 else ''}: {text}" for text, n in ranked[:EXAMPLES])
    more = f"; and {len(ranked) - EXAMPLES} other reasons" if len(ranked) > EXAMPLES else ""
    return f"on GPUs, no node of {total} fits this pod: {shown}{more}"[:1000]


def preemption_note(plan: dict[str, list[str]]) -> str:
    """'; preempting 1 lower-priority pod on n1 (ml/a) would make room', or '' when no preemption helps."""
    if not plan:
        return ""
    node, keys = min(plan.items())
    if not keys:
        return ""
    shown = ", ".join(keys[:EXAMPLES]) + (f" and {len(keys) - EXAMPLES} more" if len(keys) > EXAMPLES else "")
    return f"; preempting {len(keys)} lower-priority pod{'s' if len(keys) > 1 else ''} on {node} ({shown}) would make room"


class WaitingReasons:
    """Fed by the watch thread (offer), judged and written by its own thread (run)."""

    def __init__(self, extender: Extender, events, per_minute: int = WAITING_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.extender, self.events, self.per_minute, self.clock = extender, events, per_minute, clock
        self._queue: queue.Queue = queue.Queue(maxsize=WAITING_QUEUE)
        self._judged: list[float] = []
        self._said: OrderedDict[str, tuple[float, str]] = OrderedDict()  # uid -> (when, what)
        self._queued: dict[str, int] = {}  # namespace -> its pods in the queue
        self._queued_uids: set[str] = set()  # a pod is queued once, however often the watch shows it
        self._judged_in: dict[str, list[float]] = {}  # namespace -> its judgements in the last minute
        self._mutex = threading.Lock()  # offer runs on the watch thread, run on this one
        self.dropped = 0

    def offer(self, info: PodInfo, pod: dict, rv: str) -> None:
        if info.node or not info.request.gpu_count or not unschedulable(pod):
            return
        namespace = info.key.partition("/")[0]
        with self._mutex:
            if info.uid in self._queued_uids or self._queued.get(namespace, 0) >= QUEUED_PER_NAMESPACE:
                self.dropped += 1
                return
            try:
                self._queue.put_nowait((info, rv))
            except queue.Full:
                self.dropped += 1
                return
            self._queued_uids.add(info.uid)
            self._queued[namespace] = self._queued.get(namespace, 0) + 1

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                info, rv = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            self._dequeued(info)
            self.judge(info, rv)

    def _dequeued(self, info: PodInfo) -> None:
        namespace = info.key.partition("/")[0]
        with self._mutex:
            self._queued_uids.discard(info.uid)
            left = self._queued.get(namespace, 1) - 1
            if left > 0:
                self._queued[namespace] = left
            else:
                self._queued.pop(namespace, None)

    def judge(self, info: PodInfo, rv: str) -> str:
        """Judge one pod and offer its Event; the message, or '' when nothing was said (rate, repeat, not synced)."""
        now = self.clock()
        last = self._said.get(info.uid)
        if last is not None and now - last[0] < PER_POD_S:
            return ""
        self._judged = [t for t in self._judged if now - t < 60.0]
        self._judged_in = {ns: kept for ns, ts in self._judged_in.items() if (kept := [t for t in ts if now - t < 60.0])}
        mine = self._judged_in.setdefault(info.key.partition("/")[0], [])
        if len(self._judged) >= self.per_minute or len(mine) >= min(self.per_minute, JUDGED_PER_NAMESPACE):
            self.dropped += 1
            return ""
        self._judged.append(now)
        mine.append(now)
        outcome = self.extender.gpu_view(info)
        if outcome is None:
            return ""
        total = len(outcome.passed) + len(outcome.failed) + len(outcome.unresolvable)
        reasons = {**outcome.failed, **outcome.unresolvable}
        notes = ""
        if not outcome.passed and outcome.failed:
            notes = preemption_note(self.extender.preemption_plan(info, list(outcome.failed)[:PLAN_NODES]))
        with self.extender.reading():  # the node reserved for it, if any (queue_reservations.py)
            notes += self.extender.queue_reservations.note(info.key)
        if not outcome.passed and kube_named_every_node(info.kube_refusal, reasons, total):
            # kube-scheduler's Event said every node's reason: only the notes are Tessera's to add (module doc)
            message = f"{KUBE_SAID}{notes.removeprefix('; ')}"[:1000]
        else:
            message = (summary(outcome.passed, reasons, total) + notes)[:1000]
        quiet = message == KUBE_SAID or last is not None and last[1] == message
        self._said.pop(info.uid, None)
        self._said[info.uid] = (now, message)
        while len(self._said) > MAX_REMEMBERED:
            self._said.popitem(last=False)
        if quiet:
            return ""
        namespace, _, name = info.key.partition("/")
        self.events.offer("Pod", namespace, name, info.uid, rv, message, WAITING_REASON)
        return message

    def forget(self, uid: str) -> None:
        self._said.pop(uid, None)
