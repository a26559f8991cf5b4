"""One table for every verb: which error is which `tessera_verb_errors` kind, and how it is answered.

Where kube-scheduler 1.20 shows an extender's words decides the encoding (docs/wire-protocol.md
§2, §9): any status but 200 is a failed call whose body it never reads (it logs the status code
alone), while the `Error` field of a 200 reply reaches the pod: filter's ExtenderFilterResult and
bind's ExtenderBindingResult carry one, and their text lands in the pod's events ("0/N nodes are
available", "binding rejected: ..."). Prioritize's HostPriorityList is a bare array and preempt's
ExtenderPreemptionResult has no Error field: their only channel is the status code. So:

  * a pod-level or state refusal (a pod that asks for something invalid, a cache not synced yet,
    a bind reserve refuses) is a 200 with the words in `Error` on filter and bind, and the rule's
    status code on prioritize and preempt (400 for the pod, 503 for not ready), with the words in
    an `Error` body for whoever reads the reply by hand; except that filter answers an invalid pod
    naming no GPU resource with every node failed (and unresolvable) for that reason (app.py):
    kube-scheduler skips an ignorable extender's `Error`, so a CPU-only pod with a malformed
    `tessera.dev/` annotation was bound by kube-scheduler alone, where a failed node is obeyed and
    its reason reaches the event (a GPU pod keeps `Error`: docs/wire-protocol.md §9);
  * a body kube-scheduler would never send (`WireError`) is 400 on every verb: no pod's events
    could show it, and a status code is what a human or a fuzzer calling the port reads.

Before this table each handler mapped errors by hand: NotReady was a 200 with an Error at filter
and a 503 at prioritize (the same answers as now, but from four places), an invalid pod counted as
"bad-pod" at filter and "malformed" at prioritize and preempt, and bind counted NotReady as
"refused". Now each class has one kind on every verb.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from flask import Flask, Response, request

from ..core.model import RequestError
from ..state import BindError, NotReady
from .wire import WireError, filter_error

# the verbs whose reply has an Error field kube-scheduler passes on to the pod's events
ERROR_FIELD_VERBS = frozenset({"filter", "bind"})


@dataclass(frozen=True, slots=True)
class ErrorRule:
    kind: str  # the `kind` label of tessera_verb_errors
    status: int  # the HTTP status where the words cannot travel in an Error field
    status_everywhere: bool = False  # not kube-scheduler's request: the status code on every verb


ERRORS: tuple[tuple[type[Exception], ErrorRule], ...] = (
    (WireError, ErrorRule("malformed", 400, status_everywhere=True)),
    (RequestError, ErrorRule("bad-pod", 400)),
    (NotReady, ErrorRule("not-ready", 503)),
    (BindError, ErrorRule("refused", 409)),  # raised by bind's reserve only: always in the Error field
)
HANDLED = tuple(cls for cls, _ in ERRORS)


def words(e: Exception) -> str:
    text = str(e)
    return text if text.startswith("tessera:") else f"tessera: {text}"


def error_body(verb: str, message: str) -> dict:
    """The verb's reply shape carrying `message`: filter's keeps its node fields (all null)."""
    return filter_error(message) if verb == "filter" else {"Error": message}


def encode(verb: str, e: Exception) -> tuple[str, int, dict]:
    """(kind, HTTP status, body) for an error in ERRORS raised while answering `verb`."""
    rule = next(rule for cls, rule in ERRORS if isinstance(e, cls))
    status = rule.status if rule.status_everywhere or verb not in ERROR_FIELD_VERBS else 200
    return rule.kind, status, error_body(verb, words(e))


def json_response(body, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def answer_routing_errors(app: Flask, port: str = "") -> None:
    """Unknown paths and methods answered in words, the same on the verbs and the admin port."""
    where = f" on the {port} port" if port else ""

    @app.errorhandler(404)
    def not_found(_e):
        return json_response({"Error": f"tessera: no such endpoint {request.method} {request.path}{where}"}, 404)

    @app.errorhandler(405)
    def wrong_method(_e):
        return json_response({"Error": f"tessera: {request.method} not allowed on {request.path}"}, 405)
