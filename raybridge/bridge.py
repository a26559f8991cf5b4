"""`tessera bridge`: the one privileged piece of the Ray integration. It speaks only Kubernetes.

Why so little: its ServiceAccount can create and delete pods in each namespace an admin enabled for Ray jobs
(a RoleBinding of the ClusterRole tessera-bridge-jobs there; docs/admin-guide.md), so it must never run, import or
unpickle anything a tenant made. It never writes in Kubernetes' own namespaces (kube-system above all) whatever
RBAC allows, and says in words, once per namespace, when the apiserver refuses its pod writes (not enabled).
Each job's Ray cluster, trainers and controller run inside the job's own pods under the job's own ServiceAccount
(raybridge/job.py); the job writes its phase and progress on its own pods, and marks a member whose trainer it
lost (`tessera.dev/ray-lost`). The job's Role patches every pod of its namespace (RBAC cannot narrow it to some
fields or to the job's own pods), so a namespace is one job's (docs/raybridge.md "One namespace per job"): where the
bridge sees Ray pods of more than one job in a namespace, or a pod that changed jobs, it acts there no more until
every pod that lived there meanwhile is gone, and says so once. The bridge reads those pods as JSON objects and does
what needs cluster rights:
  * creates one replacement pod per lost or deleted member of a started job, in the job's
    namespace, from that pod's own spec (plain pods only: an owner recreates its own pods), never
    more live pods than the gang size;
  * deletes a lost pod only when it created it: the UID returned by its own create call is on its
    record (in memory, and an HMAC under the bridge's key on the pod for a restarted bridge: a
    `created-by` annotation alone proves nothing, tenants can write it), and the delete carries
    that UID as a precondition (the MAC binds namespace, name, the replaced pod and the job's gang, not the UID,
    which the create returns after the MAC is written, so it counts only on pods created before this bridge started);
  * writes an Event on the lost pod.
It holds no Ray connection, no rendezvous store, no liveness channel.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections import deque
from dataclasses import dataclass, field

from .contract import BRIDGE_MAC_ANNOTATION, GANG_NAME_ANNOTATION, REPLACES_ANNOTATION, is_ray_pod
from .decide import MemberCache, controlling_owner, group_jobs, repair, replacement_pod, slot_of

log = logging.getLogger("tessera.bridge")

KEY_MIN_BYTES = 32  # HMAC-SHA256's own output size: a shorter key is easier to guess than the MAC it makes
MAC_HEX_LEN = 64  # hex digits of an HMAC-SHA256: any other value on a pod is not the bridge's
_HEX = frozenset("0123456789abcdef")
# Replacement pods created in one 0.2-s turn: one 8-GPU node's members lost at once are all replaced in
# the same turn; a job's `gone` list made the bridge create 9,996 pods in one turn (/tmp/h6/bridge_gone_flood.py)
# One job per namespace (below): the job's cap is its namespace's too
MAX_CREATES_PER_JOB_TURN = 8
EVENTS_PER_MINUTE = 60  # Warning Events the bridge writes, all tenants together: the extender's own cap
# A member whose container fails at once was replaced 20,000 times in 67 minutes (/tmp/h6/bridge_crashloop.py).
# A slot's first replacement is at once (recovery time); each next one waits 10 s, doubling to 10 min.
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 600.0
BACKOFF_RESET_S = 2 * BACKOFF_MAX_S  # a slot with no replacement for this long starts over: its last one ran
# Replacements per job in any 10 minutes (four 8-GPU nodes' members lost at once fit); beyond it the bridge
# replaces nothing of the job until the window frees, and says so in an Event
REPLACEMENTS_PER_WINDOW = 32
WINDOW_S = 600.0
# Replacements per namespace in any 10 minutes, kept apart from any job: a job is keyed by its gang name, which the
# tenant writes, so renaming the gang every turn made a new job with a fresh window each time and 300 pods in a
# minute (audit, 2026-12-02). Two jobs' worth of the per-job window.
REPLACEMENTS_PER_NAMESPACE_WINDOW = 2 * REPLACEMENTS_PER_WINDOW
EVENTS_PER_NAMESPACE_MINUTE = 12  # one tenant's share of EVENTS_PER_MINUTE: its churn leaves the others theirs
# Namespaces the bridge never creates or deletes pods in, whatever RBAC allows (a RoleBinding made there by
# mistake): Kubernetes' own. A pod in kube-system may run as any of its ServiceAccounts (the controllers'), so a
# replacement made there would be cluster-admin; nothing of a job there is followed, and it is said once.
NEVER_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
# A namespace where the apiserver's RBAC refused a pod create or delete (not enabled for Ray jobs) gets no pod write
# for a minute, then one, doubling to 10 min: enabling it later takes effect without a restart, and a namespace never
# enabled costs one refused call per 10 min instead of one per 0.2-s turn.
REFUSED_RETRY_FIRST_S = 60.0
REFUSED_RETRY_MAX_S = 600.0
# A namespace holding Ray pods of more than one job (each job's Role patches all of them, so any job's code may have
# marked any of them lost): its jobs named in the one line that says so, and an Event on a pod of each of them; a
# tenant's 500 gangs in one namespace are counted, not listed
SHARED_JOBS_SAID = 4
ENABLE_HINT = ("kubectl -n {ns} create rolebinding tessera-bridge-jobs --clusterrole=tessera-bridge-jobs "
               "--serviceaccount=tessera-system:tessera-bridge")


class Forbidden(Exception):
    """The apiserver's authorizer refused the bridge's pod `verb` (create, delete) in `namespace`: a 403 that names
    the bridge's missing right, not admission's or a quota's (raybridge/kube.py tells them apart)."""

    def __init__(self, namespace: str, verb: str, message: str = "") -> None:
        super().__init__(f"pods {verb} in namespace {namespace} forbidden: {message}")
        self.namespace, self.verb, self.message = namespace, verb, message


def pod_mac(key: bytes, namespace: str, name: str, replaces: str, gang: str) -> str:
    """The bridge's HMAC on a pod it creates: over its namespace, name, the pod it replaces and its job (gang name), so
    that a pod of its own renamed into another gang is no pod of that job's to delete, for a restarted bridge too
    (which never saw it move). JSON: a gang name is any printable text, "|" included."""
    text = json.dumps(["tessera-bridge-pod", namespace, name, replaces, gang])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


@dataclass
class _Slot:
    """One member slot's replacements in a row (`w`, `w-r1`, `w-r2`, ...) and when the last was asked for."""

    tries: int = 0
    last: float = 0.0

    def wait_s(self, now: float) -> float:
        if not self.tries or now - self.last >= BACKOFF_RESET_S:
            return 0.0
        return self.last + min(BACKOFF_FIRST_S * 2 ** min(self.tries - 1, 16), BACKOFF_MAX_S) - now

    def record(self, now: float) -> None:
        self.tries = 1 if now - self.last >= BACKOFF_RESET_S else self.tries + 1
        self.last = now


@dataclass
class _Refused:
    """A namespace whose pod writes the apiserver refused: no write before `until`, then one."""

    until: float
    verb: str  # the write refused: only that one passing again ends the refusal
    tries: int = 1

    def again(self, now: float) -> None:
        self.tries += 1
        self.until = now + min(REFUSED_RETRY_FIRST_S * 2 ** min(self.tries - 1, 16), REFUSED_RETRY_MAX_S)


class _Budget:
    """At most `n` uses in any `per_s` seconds (a sliding window)."""

    def __init__(self, n: int, per_s: float) -> None:
        self.n, self.per_s, self._at = n, per_s, deque()

    def take(self, now: float) -> bool:
        while self._at and now - self._at[0] >= self.per_s:
            self._at.popleft()
        if len(self._at) >= self.n:
            return False
        self._at.append(now)
        return True

    def full(self, now: float) -> bool:
        """Whether `take` would refuse now (and nothing is taken)."""
        return len(self._at) >= self.n and now - self._at[0] < self.per_s

    def idle(self, now: float) -> bool:
        """Whether every use has left the window (so the budget can be forgotten)."""
        return not self._at or now - self._at[-1] >= self.per_s

    def free_at(self) -> float:
        return self._at[0] + self.per_s if self._at else 0.0


@dataclass
class _Job:
    bodies: dict[str, dict] = field(default_factory=dict)  # the last seen pod of each member: its replacement's template
    replaced: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # names this job's pods carried while followed (and the bridge's own)
    numbers: dict[str, int] = field(default_factory=dict)  # slot -> the highest replacement number seen: names only grow
    slots: dict[str, _Slot] = field(default_factory=dict)
    window: _Budget = field(default_factory=lambda: _Budget(REPLACEMENTS_PER_WINDOW, WINDOW_S))
    paused: bool = False  # over REPLACEMENTS_PER_WINDOW: said once per pause

    def see(self, pods: dict) -> None:
        self.bodies.update(pods)
        self.seen.update(pods)
        for pod in pods.values():
            slot, n = slot_of(pod)
            self.numbers[slot] = max(n, self.numbers.get(slot, 0))

    def prune(self, members, now: float) -> None:
        """Keep only names some pod of the job still names (its key, `replaces` or `gone`), or the bridge still
        needs: `replaced` kept every name ever tried, 29,988 after three rewrites of a hostile `gone` list."""
        named = set(self.bodies) | {m.key for m in members} | {m.replaces for m in members}
        named |= {k for m in members for k in m.gone}
        self.replaced &= named
        self.seen &= named
        slots = {slot_of(p)[0] for p in self.bodies.values()}
        self.numbers = {k: n for k, n in self.numbers.items() if k in slots}
        self.slots = {k: s for k, s in self.slots.items() if now - s.last < BACKOFF_RESET_S}


class Bridge:
    def __init__(self, pods, writer, key: bytes | None = None, clock=time.monotonic, started_s: float | None = None) -> None:
        self.pods, self.writer, self.clock = pods, writer, clock
        # wall time this bridge started: a pod created since is its own only by the UID its create returned, never by
        # a MAC (a MAC copied onto a later pod of the same name had that pod deleted, audit 2026-12-02)
        self.started_s = time.time() if started_s is None else started_s
        self.key = key or secrets.token_bytes(32)  # a random key: a restarted bridge then deletes none of the old pods
        self.jobs: dict[str, _Job] = {}
        self.created: dict[str, str] = {}  # namespace/name -> UID of each pod this bridge created (or verified)
        self.replacements = 0
        self.deletes = 0
        self._reported: set[str] = set()
        self._members = MemberCache()
        self.job_errors = 0  # turns in which one job's handling raised (the others went on)
        self.turn_errors = 0  # turns that raised outside any one job
        self._failing: dict[str, str] = {}  # job key -> its last error, logged once while it lasts
        self._events = _Budget(EVENTS_PER_MINUTE, 60.0)
        self._ns_events: dict[str, _Budget] = {}  # per namespace, within the cluster's budget
        self._ns_window: dict[str, _Budget] = {}  # replacements per namespace in WINDOW_S, whatever the jobs are called
        self._deleting: set[str] = set()  # UIDs this bridge asked to delete: one delete each, while the pod lingers
        self._ns_paused: set[str] = set()  # namespaces told their window is full: said once per namespace and pause
        self.events_dropped = 0
        self._taken: set[str] = set()  # names no replacement may take this turn: built once per turn
        self._refused: dict[str, _Refused] = {}  # namespace -> its 403s: said once while it lasts, writes spaced out
        self._never_said: set[str] = set()  # NEVER_NAMESPACES with a job in them: said once per namespace
        self._gang_of: dict[str, str] = {}  # UID -> the gang name its Ray pod carried last turn: a rename is a move
        # namespace -> the UIDs of the Ray pods that lived there while it held more than one job: no pod write there
        # while one of them lives (any job's code may have marked it lost, or written its `gone` list)
        self._shared: dict[str, set[str]] = {}

    def safe_turn(self) -> None:
        """One turn that never ends the process: the bridge serves every tenant, so nothing one of
        them writes may stop it (a non-ASCII MAC raised out of turn() and the bridge crash-looped)."""
        try:
            self.turn()
        except Exception:
            self.turn_errors += 1
            log.exception("bridge turn failed; next turn in the usual interval")

    def turn(self) -> None:
        snapshot = self.pods.snapshot()
        by_key = {f"{(p.get('metadata') or {}).get('namespace', 'default')}/{(p.get('metadata') or {}).get('name', '')}": p
                  for p in snapshot}
        jobs = group_jobs(snapshot, self._members)
        for error in jobs.errors:
            if error not in self._reported:
                log.warning("%s", error)
        # each said once while it lasts, and forgotten with its pod: 20,000 churned bad pods kept 20,000 messages
        self._reported = set(jobs.errors)
        for key in [k for k in self.created if k not in by_key]:  # gone: after a restart the MAC still proves ours
            del self.created[key]
        for key in [k for k in self.jobs if k not in jobs.members]:  # every pod of the job is gone
            del self.jobs[key]
        for key in [k for k in self._failing if k not in jobs.members]:
            del self._failing[key]
        live_uids = {(p.get("metadata") or {}).get("uid") for p in snapshot}
        self._deleting &= live_uids
        now = self.clock()
        self._ns_window = {ns: w for ns, w in self._ns_window.items() if not w.idle(now)}
        self._ns_events = {ns: e for ns, e in self._ns_events.items() if not e.idle(now)}
        self._ns_paused &= self._ns_window.keys()
        self._taken = set(by_key).union(*(set(j.bodies) | j.replaced for j in self.jobs.values()))
        spaces = {k.split("/", 1)[0] for k in jobs.members}
        self._refused = {ns: r for ns, r in self._refused.items() if ns in spaces}  # said again for a later job
        self._follow_sharing(snapshot)
        for key, members in jobs.members.items():
            if key.split("/", 1)[0] in NEVER_NAMESPACES:
                self._never(key)
                continue
            if key.split("/", 1)[0] in self._shared:
                self.jobs.pop(key, None)  # what its pods say there is not the job's own word: nothing of it is kept
                continue
            try:
                self._turn_job(key, members, by_key)
                self._failing.pop(key, None)
            except Exception as e:  # one job's pods never stop the others' repairs
                self._job_failed(key, e)

    def _job_failed(self, key: str, e: Exception) -> None:
        """Counted every turn, logged once per job and error: a job that fails each 0.2-s turn
        would otherwise log 18,000 tracebacks an hour."""
        self.job_errors += 1
        said = f"{type(e).__name__}: {e}"
        if self._failing.get(key) != said:
            self._failing[key] = said
            log.error("job %s: not repaired this turn: %s", key, said, exc_info=e)

    def _never(self, job_key: str) -> None:
        """A job in one of NEVER_NAMESPACES: nothing of it is followed, created, deleted or written; said once."""
        namespace = job_key.split("/", 1)[0]
        if namespace not in self._never_said:
            self._never_said.add(namespace)
            log.warning("job %s is in namespace %s: the bridge never creates or deletes pods there, whatever RBAC "
                        "allows (a pod there may run as any of its ServiceAccounts); its lost pods are not replaced. "
                        "Run Ray jobs in a namespace enabled for them (docs/admin-guide.md)", job_key, namespace)

    def _follow_sharing(self, snapshot: list[dict]) -> None:
        """One job per namespace: a namespace whose Ray pods name more than one gang, or hold a pod whose gang changed
        since the last turn, is shared; every Ray pod that lives there while it is shares the taint, and the namespace
        gets no pod write while a tainted pod lives (after the other job's pods go, the marks its code wrote stay).
        The gang names are read raw (a pod that breaks the contract is still another job's); one pass over the
        snapshot, and the memory is the live Ray pods' UIDs."""
        gangs: dict[str, dict[str, tuple[str, str]]] = {}  # namespace -> gang -> its first pod's (key, uid)
        uids: dict[str, set[str]] = {}
        moved: dict[str, str] = {}  # namespace -> a pod that changed jobs, in words
        gang_of: dict[str, str] = {}
        for p in snapshot:
            if not is_ray_pod(p):
                continue
            meta = p.get("metadata") or {}
            ns, uid = str(meta.get("namespace") or "default"), str(meta.get("uid") or "")
            if ns in NEVER_NAMESPACES:  # nothing there is followed at all
                continue
            key, gang = f"{ns}/{meta.get('name', '')}", str((meta.get("annotations") or {}).get(GANG_NAME_ANNOTATION) or "")
            first = gangs.setdefault(ns, {})
            if gang and (gang not in first or key < first[gang][0]):
                first[gang] = (key, uid)
            if uid:
                uids.setdefault(ns, set()).add(uid)
                gang_of[uid] = gang
                if self._gang_of.get(uid, gang) != gang:
                    moved.setdefault(ns, f"pod {key} was in job {self._gang_of[uid][:63]!r}, now {gang[:63]!r}")
        self._gang_of = gang_of
        sharing = {ns for ns, g in gangs.items() if len(g) > 1} | set(moved)
        for ns in sorted(sharing):
            if ns not in self._shared:
                self._say_shared(ns, gangs.get(ns, {}), moved.get(ns, ""))
            self._shared.setdefault(ns, set()).update(uids.get(ns, ()))
        for ns in [ns for ns in self._shared if ns not in sharing]:
            self._shared[ns] &= uids.get(ns, set())
            if not self._shared[ns]:
                del self._shared[ns]
                log.info("namespace %s: every pod that was there while it held more than one job is gone; the bridge "
                         "replaces its job's lost pods again", ns)

    def _say_shared(self, ns: str, gangs: dict[str, tuple[str, str]], moved: str) -> None:
        """Said once while the namespace stays shared: the log, and a Warning Event on a pod of each job named."""
        names = sorted(gangs)
        listed = ", ".join(repr(g[:63]) for g in names[:SHARED_JOBS_SAID])  # repr: raw text, a newline is escaped
        more = f" and {len(names) - SHARED_JOBS_SAID} more" if len(names) > SHARED_JOBS_SAID else ""
        what = f"a pod that changed jobs ({moved})" if moved else f"Ray pods of {len(names)} jobs ({listed}{more})"
        said = (f"namespace {ns} holds {what}: each job's Role patches every pod of its namespace, so any job's code "
                f"may have marked any of them lost. The bridge replaces and deletes no pod in {ns} until every pod that "
                "was there meanwhile is gone. Run each Ray job in a namespace of its own (docs/raybridge.md, "
                "\"One namespace per job\")")
        log.warning("%s", said)
        for gang in names[:SHARED_JOBS_SAID]:
            self._event(*gangs[gang], "TesseraNamespaceShared", said)

    @property
    def shared_namespaces(self) -> int:
        return len(self._shared)

    def _writable(self, namespace: str) -> bool:
        """Whether the bridge may send a pod write to this namespace now (not while its last 403 is fresh)."""
        refused = self._refused.get(namespace)
        return refused is None or self.clock() >= refused.until

    def _forbidden(self, job_key: str, e: Forbidden, pod_key: str, pod_uid: str) -> None:
        """The apiserver refused a pod write in the job's namespace: said once (log, and a Warning Event on the job's
        pod: the bridge's Events are cluster-wide for this), then tried again after REFUSED_RETRY_FIRST_S, doubling."""
        now, ns = self.clock(), e.namespace
        if ns in self._refused:
            self._refused[ns].again(now)
            return
        self._refused[ns] = _Refused(until=now + REFUSED_RETRY_FIRST_S, verb=e.verb)
        what = (f"the lost pods of job {job_key} are not replaced" if e.verb == "create"
                else f"the lost pods it made for job {job_key} are not deleted")
        said = (f"namespace {ns} is not enabled for Ray jobs: the apiserver refused the bridge's pods {e.verb} there "
                f"(403 Forbidden), so {what}; the bridge tries again in {REFUSED_RETRY_FIRST_S:.0f} s, "
                f"then less and less often, up to every {REFUSED_RETRY_MAX_S / 60:.0f} min. A cluster admin enables "
                f"it: {ENABLE_HINT.format(ns=ns)} (docs/admin-guide.md)")
        log.warning("%s", said)
        self._event(pod_key, pod_uid, "TesseraNamespaceNotEnabled", said, notice=True)

    def _allowed(self, namespace: str, verb: str) -> None:
        """A pod `verb` in this namespace passed the apiserver's authorizer: a refusal of that verb said before is over."""
        if namespace in self._refused and self._refused[namespace].verb == verb:
            del self._refused[namespace]
            log.info("namespace %s: the apiserver allows the bridge's pod writes again; lost pods there are replaced",
                     namespace)

    @property
    def refused_namespaces(self) -> int:
        return len(self._refused)

    def _turn_job(self, key: str, members, by_key: dict) -> None:
        job = self.jobs.setdefault(key, _Job())
        own = {m.key: by_key[m.key] for m in members}
        gone = frozenset(k for k in job.bodies if k not in own) | self._claims(job, members, by_key)
        job.see(own)
        r = repair(members, gone, frozenset(job.replaced))
        made, namespace = 0, key.split("/", 1)[0]
        for name in r.replace:
            if made >= MAX_CREATES_PER_JOB_TURN:
                break  # the rest next turn, 0.2 s on
            if not self._writable(namespace):
                break  # refused there: one try per REFUSED_RETRY window, not one per pod and turn
            made += self._replace(key, job, name, own, members)
        if self._writable(namespace):
            self._delete_own(key, members, r.delete)
        for k in gone:  # forget deleted pods once handled (replaced, or nothing to do)
            if k in job.replaced or not r.replace:
                job.bodies.pop(k, None)
        job.prune(members, self.clock())

    @staticmethod
    def _claims(job: _Job, members, by_key: dict) -> frozenset[str]:
        """The names the job's live pods list as `gone` (tenant-written) that the bridge takes: none that
        exists (another job's live pod was copied), and only a name this bridge saw among the job's pods,
        or (a restarted bridge never saw it) one claimed by a member bound with a GPU assignment: pending
        pods that were never bound made the bridge create 9,996 pods in one turn. The kubelet's phase is
        not asked for: it lags the binding, and a restarted bridge must replace a trainer lost meanwhile."""
        said = set()
        for m in members:
            ran = m.slice is not None
            said |= {k for k in m.gone if k not in by_key and (k in job.seen or ran)}
        return frozenset(said)

    def _delete_own(self, job_key: str, members, candidates: tuple[str, ...]) -> None:
        """Delete the lost pods this bridge made, once each: a pod with a long grace period lingers as Terminating,
        and was deleted again every 0.2-s turn (300 DELETEs a minute for one pod, audit 2026-12-02)."""
        for m in members:
            if m.deleting or m.uid in self._deleting:
                continue
            if m.key in candidates and self._mine(m.key, m.uid, m.bridge_mac, m.replaces, job_key, m.created_s):
                log.info("job %s: deleting lost pod %s (uid %s), which this bridge created", job_key, m.key, m.uid)
                try:
                    self.writer.delete(m.key, m.uid)
                except Forbidden as e:  # the namespace's RoleBinding went: tried again after REFUSED_RETRY_FIRST_S
                    self._forbidden(job_key, e, m.key, m.uid)
                    return
                self._allowed(m.key.split("/", 1)[0], "delete")
                self._deleting.add(m.uid)  # after the call: one that raised is tried again next turn
                self.created.pop(m.key, None)
                self.deletes += 1

    def _mine(self, key: str, uid: str, mac: str, replaces: str, job_key: str, created_s: float | None = None) -> bool:
        """Created by this bridge: the UID its create call returned, or, for a pod created before this bridge started
        (by the bridge before a restart), the pod's MAC under this bridge's key, which binds namespace, name, the
        pod it replaced and its job (`job_key`'s gang) but not the UID (the create returns it after the MAC is
        written). A pod without a creation time is judged by its MAC: the apiserver always writes one, so only test
        doubles lack it."""
        if not uid:
            return False
        if self.created.get(key) == uid:
            return True
        if created_s is not None and created_s >= self.started_s:
            return False
        ns, name = key.split("/", 1)
        want = pod_mac(self.key, ns, name, replaces, job_key.split("/", 1)[1]).encode("ascii")
        if _is_mac(mac) and hmac.compare_digest(mac.encode("ascii"), want):
            self.created[key] = uid
            return True
        return False

    def _replace(self, job_key: str, job: _Job, name: str, own: dict, members) -> int:
        """Ask for one replacement of `name`, modelled only on this job's own pods; 1 if a create was sent."""
        pod = own.get(name) or job.bodies.get(name) or _like(name, own, members)
        if pod is None:
            return 0
        owner = controlling_owner(pod)
        if owner:
            job.replaced.add(name)
            log.info("job %s: pod %s lost; its owner %r recreates it", job_key, name, owner)  # free text: escaped
            return 0
        slot, now = slot_of(pod)[0], self.clock()
        if job.slots.setdefault(slot, _Slot()).wait_s(now) > 0 or not self._in_window(job_key, job, name, pod, now):
            return 0
        body = replacement_pod(pod, taken=self._taken, first=job.numbers.get(slot, 0) + 1)
        meta = body["metadata"]
        meta["annotations"][BRIDGE_MAC_ANNOTATION] = pod_mac(self.key, meta["namespace"], meta["name"],
                                                             meta["annotations"][REPLACES_ANNOTATION], job_key.split("/", 1)[1])
        try:
            uid = self.writer.create(body)
        except Forbidden as e:  # not the slot's failure: the namespace's backoff, not the slot's, says when again
            self._forbidden(job_key, e, name, (pod.get("metadata") or {}).get("uid", ""))
            return 1
        self._allowed(meta["namespace"], "create")
        job.slots[slot].record(now)
        new = f"{meta['namespace']}/{meta['name']}"
        self._taken.add(new)
        job.numbers[slot] = slot_of(body)[1]
        if uid:  # a refused create (quota, admission) is tried again after the slot's backoff
            job.replaced.add(name)
            self.created[new] = uid
            job.seen.add(new)
            self.replacements += 1
        log.info("job %s: pod %s lost, asked for replacement %s", job_key, name, new)
        self._event(name, (pod.get("metadata") or {}).get("uid", ""), "TrainerLost",
                    f"trainer lost; replacement pod {new} requested")
        return 1

    def _in_window(self, job_key: str, job: _Job, name: str, pod: dict, now: float) -> bool:
        """Within REPLACEMENTS_PER_WINDOW for the job and REPLACEMENTS_PER_NAMESPACE_WINDOW for its namespace; else
        the job is told once that replacing stopped."""
        namespace = job_key.split("/", 1)[0]
        spaced = self._ns_window.setdefault(namespace, _Budget(REPLACEMENTS_PER_NAMESPACE_WINDOW, WINDOW_S))
        if spaced.full(now):
            if namespace not in self._ns_paused:  # once per namespace: a job renamed every turn is a new job each turn
                self._ns_paused.add(namespace)
                said = (f"{REPLACEMENTS_PER_NAMESPACE_WINDOW} replacements in namespace {namespace} in "
                        f"{WINDOW_S / 60:.0f} min: the bridge replaces no more of its pods for "
                        f"{spaced.free_at() - now:.0f} s")
                log.warning("%s", said)
                self._event(name, (pod.get("metadata") or {}).get("uid", ""), "TesseraReplacementsPaused", said,
                            notice=True)
            return False
        self._ns_paused.discard(namespace)
        if job.window.take(now):
            spaced.take(now)
            job.paused = False
            return True
        if not job.paused:
            job.paused = True
            said = (f"{REPLACEMENTS_PER_WINDOW} replacements of job {job_key} in {WINDOW_S / 60:.0f} min: the bridge "
                    f"replaces no more of its pods for {job.window.free_at() - now:.0f} s (a member that fails at once "
                    "is not replaced forever)")
            log.warning("%s", said)
            self._event(name, (pod.get("metadata") or {}).get("uid", ""), "TesseraReplacementsPaused", said,
                        notice=True)
        return False

    def _event(self, key: str, uid: str, reason: str, message: str, notice: bool = False) -> None:
        """A Warning Event, at most EVENTS_PER_NAMESPACE_MINUTE for the pod's namespace and EVENTS_PER_MINUTE across
        all tenants (the rest counted, not written). A `notice` (replacing paused: said once per pause) skips the
        namespace's share, which the job's own TrainerLost Events had used up, so the pause is not said in silence."""
        now = self.clock()
        spaced = self._ns_events.setdefault(key.split("/", 1)[0], _Budget(EVENTS_PER_NAMESPACE_MINUTE, 60.0))
        if (notice or spaced.take(now)) and self._events.take(now):
            self.writer.event(key, uid, reason, message, warning=True)
        else:
            self.events_dropped += 1


def _is_mac(text: str) -> bool:
    """Lowercase hex of exactly MAC_HEX_LEN digits (the tenant writes the annotation: anything else,
    non-ASCII text included, is simply not the bridge's MAC; compare_digest raised TypeError on it)."""
    return isinstance(text, str) and len(text) == MAC_HEX_LEN and _HEX.issuperset(text)


def load_key(key_file: str | None, env_key: str | None) -> bytes | None:
    """The bridge's HMAC key, from --key-file or TESSERA_BRIDGE_KEY, at least KEY_MIN_BYTES either way
    (the environment had no minimum: a one-byte key let anyone forge the MAC that makes a pod deletable).
    None: a random key per start."""
    if key_file:
        where = f"--key-file {key_file}"
        try:
            with open(key_file, "rb") as f:
                key = f.read().strip()
        except OSError as e:  # "[Errno 21] Is a directory" named neither the flag nor what was wrong with it
            raise ValueError(f"{where}: {e.strerror.lower() if e.strerror else e}") from None
    elif env_key:
        key, where = env_key.encode(), "TESSERA_BRIDGE_KEY"
    else:
        return None
    if len(key) < KEY_MIN_BYTES:
        raise ValueError(f"{where}: the bridge's key must be at least {KEY_MIN_BYTES} bytes, got {len(key)}")
    return key


def _like(name: str, own: dict, members) -> dict | None:
    """A body for a pod this bridge never saw (deleted while it was away; the job lists it as gone): a live
    member's pod (of this job only) under the gone pod's name. A job's members share their spec, apart from their names."""
    for m in members:
        if not m.lost and m.key in own:
            body = copy.deepcopy(own[m.key])
            meta = body["metadata"]
            meta["name"] = name.split("/", 1)[1]
            meta.pop("uid", None)
            (meta.get("annotations") or {}).pop(REPLACES_ANNOTATION, None)
            return body
    return None


def serve(api, metrics_listen: str, namespace: str | None = None, interval_s: float = 0.2,
          key_file: str | None = None) -> None:
    """The `tessera bridge` process: watch pods, serve /metrics, run the loop forever."""
    import threading

    from prometheus_client import CollectorRegistry, Gauge

    from .kube import PodWatch, PodWriter
    from .metrics import listen_address, serve_metrics

    listen_address(metrics_listen)  # before the watch syncs (long, on a large cluster)
    key = load_key(key_file, os.environ.get("TESSERA_BRIDGE_KEY"))
    watch = PodWatch(api, namespace)
    threading.Thread(target=watch.run, daemon=True, name="pod-watch").start()
    watch.synced.wait()
    bridge = Bridge(watch, PodWriter(api), key)
    registry = CollectorRegistry()
    Gauge("tessera_bridge_replacements", "replacement pods created", registry=registry).set_function(
        lambda: bridge.replacements)
    Gauge("tessera_bridge_deletes", "lost pods of its own deleted", registry=registry).set_function(lambda: bridge.deletes)
    Gauge("tessera_bridge_job_errors", "job turns that raised (that job skipped, the others repaired)",
          registry=registry).set_function(lambda: bridge.job_errors)
    Gauge("tessera_bridge_turn_errors", "whole turns that raised", registry=registry).set_function(
        lambda: bridge.turn_errors)
    Gauge("tessera_bridge_events_dropped", f"Warning Events not written (over {EVENTS_PER_MINUTE}/min)",
          registry=registry).set_function(lambda: bridge.events_dropped)
    Gauge("tessera_bridge_jobs", "Ray jobs followed", registry=registry).set_function(lambda: len(bridge.jobs))
    Gauge("tessera_bridge_namespaces_shared", "namespaces where the bridge saw Ray pods of more than one job (or a pod "
          "that changed jobs): no pod write there until those pods are gone", registry=registry).set_function(
        lambda: bridge.shared_namespaces)
    Gauge("tessera_bridge_namespaces_refused", "namespaces with a Ray job where the apiserver refused the bridge's "
          "pod writes (not enabled for Ray jobs)", registry=registry).set_function(lambda: bridge.refused_namespaces)
    serve_metrics(registry, metrics_listen)
    log.info("bridge: following Ray job pods, metrics on %s", metrics_listen)
    while True:
        bridge.safe_turn()
        time.sleep(interval_s)
