"""Binds the members of an admitted gang that kube-scheduler is not binding itself.

A gang is admitted in one member's filter call (gangs.py): every member then holds its GPUs. kube-scheduler
binds the member whose call admitted it; the others it refused earlier, while the gang was incomplete, and
they wait in its unschedulable queue, which kube-scheduler 1.20 retries only when a cluster event moves them
or when its 60-s flush comes round. So Tessera binds them itself, at once, through the same bind
transaction as the bind verb (binding.py: the held GPUs, the Lease check, the annotations and their MAC,
the Binding). kube-scheduler then sees them bound through its own watch and drops them from its queue.

Why Tessera may: it is the binder of every GPU pod already (the bind verb), it binds only members the watch
shows pending, only onto the node admission held for them, which kube-scheduler's own filters passed for
their kube shape (gangs.py), and only while it holds the bind Lease. A race with kube-scheduler's own bind
of the same member ends in one write: the other meets "already bound to this node", which both read as
done (binding.py ALREADY_BOUND).

Bounded: at most WORKERS binds in flight, each one API call; the loop wakes when admission sets
`gangs.wake` and at least every ROUND_S.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..binding import BindResult, BindTarget, bind_pod
from ..service import Extender
from ..state import Binder, BindError, NotReady
from ..translate.objects import BOUND_REASON, bound_message

log = logging.getLogger(__name__)

WORKERS = 8  # Binding calls in flight at once: a gang of 512 is written in about 64 rounds of API latency
ROUND_S = 1.0  # the loop runs at least this often (holds past their grace, gangs tried again off the request path)


class GangBinder:
    def __init__(self, extender: Extender, binder: Binder, events, is_leader: Callable[[], bool],
                 workers: int = WORKERS) -> None:
        self.extender, self.binder, self.events, self.is_leader = extender, binder, events, is_leader
        self.workers = workers
        self._inflight: set[str] = set()
        self._mutex = threading.Lock()
        self.bound = self.failed = 0

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), daemon=True, name="gang-binder")
        t.start()
        return t

    def run(self, stop: threading.Event) -> None:
        wake = self.extender.gangs.wake
        with ThreadPoolExecutor(self.workers, thread_name_prefix="gang-bind") as pool:
            while not stop.is_set():
                wake.wait(ROUND_S)
                wake.clear()
                try:
                    self.round(pool.submit)
                except Exception as e:  # never let one bad round end the thread
                    log.warning("gang binder round failed: %s", e, exc_info=e)

    def round(self, submit: Callable) -> int:
        """Hand each member to bind now to `submit`, once; returns how many were handed."""
        if not self.is_leader():
            return 0
        handed = 0
        for uid, key, node in self.extender.gang_round():
            with self._mutex:
                if uid in self._inflight:
                    continue
                self._inflight.add(uid)
            namespace, _, name = key.partition("/")
            submit(self.bind, BindTarget(name, namespace, uid, node))
            handed += 1
        return handed

    def bind(self, target: BindTarget) -> None:
        try:
            outcome = bind_pod(self.extender, self.binder, target, self.is_leader)
        except (BindError, NotReady) as e:  # gone, bound elsewhere, no longer held: nothing was reserved
            log.info("gang member %s not bound: %s", target.key, e)
            self.failed += 1
            return
        except Exception as e:
            log.warning("gang member %s not bound: %s", target.key, e, exc_info=e)
            self.failed += 1
            return
        finally:
            with self._mutex:
                self._inflight.discard(target.pod_uid)
        if not outcome.bound:
            log.info("gang member %s not bound: %s", target.key, outcome.message)
            self.failed += 1
            return
        self.bound += 1
        if outcome.result is BindResult.BOUND and self.events is not None:
            self.events.offer("Pod", target.pod_namespace, target.pod_name, target.pod_uid, "",
                              f"{bound_message(outcome.assignment, outcome.uuids)} (gang admitted whole; bound by Tessera)",
                              BOUND_REASON)
