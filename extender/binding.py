"""The bind transaction: reserve -> lease check -> API write -> confirm or give back.

kube-scheduler's bind verb is the scheduling framework's Reserve and Bind in one call, with
Unreserve on any failure. `bind_pod` is that transaction, apart from HTTP: the verbs app parses the
request, calls it and encodes the `BindOutcome`; the gang binder (kube/gang_binder.py) calls it for
the members of an admitted gang that Tessera binds itself. Nothing in it waits for another pod: a
gang's permit is its admission (gangs.py), done before any member holds a GPU.

Once `Extender.reserve` holds GPUs for the pod, the extender must hear exactly once whether the
API write happened: `bind_done(uid, True)` keeps the reservation for the watch to confirm,
`bind_done(uid, False)` gives the GPUs back (an admitted gang member's stay held for its gang until
the gang's timeout). It is called in the one `finally` below, with `ok` set only after the write
succeeded, so no exit (a lost lease, an API error, an exception nobody listed) keeps a slice that was
never written. The handler used to have five exits that each had to remember the call.

A refusal before anything is held (reserve's `BindError`: unknown pod, no longer fits, already
holds GPUs elsewhere; `NotReady`) is raised, not returned: there is nothing to give back, and a
`bind_done(uid, False)` then would free the reservation of another bind of the same pod still in
flight (kube-scheduler retries a bind whose reply timed out, kubernetes issue #96579).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .core.model import Assignment
from .service import Extender
from .state import AlreadyBound, Binder, BindFailure, assignment_annotations


@dataclass(frozen=True, slots=True)
class BindTarget:
    """kube-scheduler's ExtenderBindingArgs: which pod goes to which node."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


class BindResult(StrEnum):
    """How a bind that reserved GPUs ended; a refusal's value is its `tessera_verb_errors` kind."""

    BOUND = "bound"
    ALREADY_BOUND = "already-bound"  # bound to this very node already: an earlier try's write won (no second Event)
    LOST_LEASE = "lost-lease"  # the Lease lapsed: another replica may bind now
    API = "api"  # the Binding write failed


@dataclass(frozen=True, slots=True)
class BindOutcome:
    result: BindResult
    message: str = ""  # why not, in words for the pod's events ("" when bound)
    assignment: Assignment | None = None  # what was written, when bound
    uuids: tuple[str, ...] = ()  # the node's GPU UUIDs, when bound

    @property
    def bound(self) -> bool:
        return self.result in (BindResult.BOUND, BindResult.ALREADY_BOUND)


def _always_leader() -> bool:
    return True


def bind_pod(extender: Extender, binder: Binder, target: BindTarget,
             is_leader: Callable[[], bool] = _always_leader) -> BindOutcome:
    """Bind `target` through `binder` if every step allows it; `is_leader` is asked after the GPUs are held.

    Raises reserve's BindError or NotReady when nothing was reserved; any other exception gives the
    GPUs back before it propagates.
    """
    try:
        assignment, uuids = extender.reserve(target.pod_uid, target.key, target.node)
    except AlreadyBound:  # Tessera bound it there itself (a gang member): kube-scheduler's bind succeeded too
        return BindOutcome(BindResult.ALREADY_BOUND)
    ok = False
    try:
        if not is_leader():  # a new leader may be binding already: this replica must not
            return BindOutcome(BindResult.LOST_LEASE,
                               f"tessera: lost the bind lease while binding {target.key}; kube-scheduler will retry")
        result = BindResult.BOUND
        try:
            annotations = assignment_annotations(assignment, uuids, extender.signer, target.pod_uid)
            binder.bind(target.pod_namespace, target.pod_name, target.pod_uid, target.node, annotations)
        except BindFailure as e:
            if e.already_on != target.node:
                return BindOutcome(BindResult.API, f"tessera: binding {target.key} to {target.node}: {e}")
            result = BindResult.ALREADY_BOUND
        except Exception as e:  # the API call may fail in ways we cannot list; never keep the slice then
            return BindOutcome(BindResult.API, f"tessera: binding {target.key} to {target.node}: {e}")
        ok = True
        return BindOutcome(result, assignment=assignment, uuids=uuids)
    finally:
        extender.bind_done(target.pod_uid, ok)

