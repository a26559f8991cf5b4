"""The Flask app kube-scheduler calls: filter, prioritize, bind, preempt (the verbs listener).

Health, readiness, metrics and /inspect live on the admin listener (admin.py): the verbs port
answers kube-scheduler alone. The verbs' metrics are recorded into `app.extensions["tessera"]
["registry"]`, which the admin app serves.

Every handler parses the body into plain data (wire.py, kube/contract.py), asks the `Extender`,
and encodes the answer. A malformed body gets 400 with the reason in `Error` and changes nothing;
a pod that asks for something invalid gets a filter `Error` in words (it shows in the pod's events).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, Histogram
from werkzeug.exceptions import HTTPException

from ..core.model import RequestError
from ..kube.cache import BOUND_REASON
from ..kube.contract import assignment_annotations, bound_message, pod_info
from ..service import Extender
from ..state import Binder, BindError, BindFailure, GangWaitsFull, NotReady  # noqa: F401 (re-exported)
from . import wire
from .forward import FORWARDED_HEADER
from .limits import MAX_BODY_BYTES
from .metrics import ClusterCollector, reason_counts

DEFAULT_PREFIX = "/tessera"
GANG_WAIT_S = 20.0  # keep below the scheduler config's httpTimeout (30s shipped)


def _json(body, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def _load():
    raw = request.get_data(cache=False)  # a 5000-node body is large: not kept beside its parsed form
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise wire.WireError(f"body is not JSON: {e}") from None
    except RecursionError:  # a body like [[[[...]]]] nested deeper than the parser's stack
        raise wire.WireError("body is not JSON we accept: nested too deeply") from None


class Leadership(Protocol):
    """Who may bind (kube/lease.py): followers forward binds to the holder (forward.py)."""

    def is_leader(self) -> bool: ...


class Forwarder(Protocol):
    """Sends a follower's bind to the Lease holder's pod: (status, body) for kube-scheduler (forward.py)."""

    def forward(self, raw: bytes, timeout_s: float) -> tuple[int, bytes]: ...


class EventQueue(Protocol):
    """kube/cache.py's EventSink: offers never block the verb; a full queue drops."""

    def offer(self, kind: str, namespace: str, name: str, uid: str, rv: str, message: str, reason: str = ...) -> None: ...


def _forward(forwarder: Forwarder | None, raw: bytes, timeout_s: float) -> Response:
    """Relay a bind to the Lease holder; its answer (or why there is none) goes back to kube-scheduler."""
    if request.headers.get(FORWARDED_HEADER):
        return _json({"Error": "tessera: a forwarded bind reached a replica that does not hold the lease; retrying"})
    if forwarder is None:
        return _json({"Error": "tessera: this replica does not hold the bind lease and forwards to no one; retrying"})
    status, body = forwarder.forward(raw, timeout_s)
    return Response(body, status=status, mimetype="application/json")


def create_app(extender: Extender, binder: Binder, prefix: str = DEFAULT_PREFIX, gang_wait_s: float = GANG_WAIT_S,
               leadership: Leadership | None = None, forwarder: Forwarder | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, events: EventQueue | None = None) -> Flask:
    """The WSGI app. `leadership`: None for a single replica, which always binds; `events`: where the
    bind Event goes (which GPUs, how much of each: the Scheduled event names only the node)."""
    app = Flask("tessera")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    registry = CollectorRegistry()
    latency = Histogram("tessera_verb_seconds", "Time to answer a kube-scheduler verb", ["verb"], registry=registry,
                        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
    rejected = Counter("tessera_filter_rejections", "Nodes refused by filter, by reason (a fixed set: metrics.py)",
                       ["reason"], registry=registry)
    errors = Counter("tessera_verb_errors", "Verb calls answered with an error", ["verb", "kind"], registry=registry)
    registry.register(ClusterCollector(extender))
    app.extensions["tessera"] = {"extender": extender, "registry": registry}

    def timed(verb):
        def wrap(fn):
            def run():
                started = time.perf_counter()
                try:
                    return fn()
                finally:
                    latency.labels(verb).observe(time.perf_counter() - started)
            run.__name__ = f"verb_{verb}"
            return run
        return wrap

    @app.post(f"{prefix}/filter")
    @timed("filter")
    def filter_verb():
        try:
            args = wire.parse_extender_args(_load())
        except wire.WireError as e:
            errors.labels("filter", "malformed").inc()
            return _json(wire.filter_error(f"tessera: {e}"), 400)
        try:
            outcome = extender.filter(pod_info(args.pod, extender.signer), args.node_names)
        except RequestError as e:
            errors.labels("filter", "bad-pod").inc()
            return _json(wire.filter_error(f"tessera: {e}"))
        except NotReady as e:
            errors.labels("filter", "not-ready").inc()
            return _json(wire.filter_error(str(e)))
        if outcome.failed or outcome.unresolvable:
            for category, n in reason_counts([*outcome.failed.values(), *outcome.unresolvable.values()]).items():
                rejected.labels(category).inc(n)
        return _json(wire.filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable))

    @app.post(f"{prefix}/prioritize")
    @timed("prioritize")
    def prioritize_verb():
        try:
            args = wire.parse_extender_args(_load())
            scores = extender.prioritize(pod_info(args.pod, extender.signer), args.node_names)
        except (wire.WireError, RequestError) as e:
            errors.labels("prioritize", "malformed").inc()
            return _json({"Error": f"tessera: {e}"}, 400)
        except NotReady as e:
            errors.labels("prioritize", "not-ready").inc()
            return _json({"Error": str(e)}, 503)
        return _json(wire.host_priorities(scores))

    @app.post(f"{prefix}/bind")
    @timed("bind")
    def bind_verb():
        try:
            body = _load()
            args = wire.parse_binding_args(body)
        except wire.WireError as e:
            errors.labels("bind", "malformed").inc()
            return _json({"Error": f"tessera: {e}"}, 400)
        if leadership is not None and not leadership.is_leader():
            return _forward(forwarder, orjson.dumps(body), gang_wait_s + 5)
        key = f"{args.pod_namespace}/{args.pod_name}"
        try:
            assignment, uuids = extender.reserve(args.pod_uid, key, args.node)
        except (BindError, NotReady) as e:
            errors.labels("bind", "refused").inc()
            return _json({"Error": str(e)})
        try:
            complete = extender.wait_for_gang(args.pod_uid, gang_wait_s)
        except GangWaitsFull as e:
            extender.bind_done(args.pod_uid, False)
            errors.labels("bind", "gang-waits-full").inc()
            return _json({"Error": str(e)})
        if not complete:
            extender.bind_done(args.pod_uid, False)
            errors.labels("bind", "gang-timeout").inc()
            return _json({"Error": f"tessera: gang of {key} did not complete within {gang_wait_s:.0f}s; GPUs released"})
        if leadership is not None and not leadership.is_leader():
            # the Lease lapsed while this bind waited (a gang can wait 20 s, the renew deadline is
            # shorter): a new leader may be binding already, so this replica must not
            extender.bind_done(args.pod_uid, False)
            errors.labels("bind", "lost-lease").inc()
            return _json({"Error": f"tessera: lost the bind lease while binding {key}; kube-scheduler will retry"})
        try:
            annotations = assignment_annotations(assignment, uuids, extender.signer, args.pod_uid)
            binder.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node, annotations)
        except BindFailure as e:
            ok = e.already_on == args.node  # 409 "already assigned" to this very node: an earlier try won
            extender.bind_done(args.pod_uid, ok)
            if ok:
                return _json({"Error": ""})
            errors.labels("bind", "api").inc()
            return _json({"Error": f"tessera: binding {key} to {args.node}: {e}"})
        except Exception as e:  # the API call may fail in ways we cannot list; never keep the slice then
            extender.bind_done(args.pod_uid, False)
            errors.labels("bind", "api").inc()
            return _json({"Error": f"tessera: binding {key} to {args.node}: {e}"})
        extender.bind_done(args.pod_uid, True)
        if events is not None:
            events.offer("Pod", args.pod_namespace, args.pod_name, args.pod_uid, "", bound_message(assignment, uuids),
                         BOUND_REASON)
        return _json({"Error": ""})

    @app.post(f"{prefix}/preempt")
    @timed("preempt")
    def preempt_verb():
        try:
            args = wire.parse_preemption_args(_load())
            keep = extender.preempt(pod_info(args.pod, extender.signer), args.victims)
        except (wire.WireError, RequestError) as e:
            errors.labels("preempt", "malformed").inc()
            return _json({"Error": f"tessera: {e}"}, 400)
        except NotReady as e:
            errors.labels("preempt", "not-ready").inc()
            return _json({"Error": str(e)}, 503)
        return _json(wire.preemption_result(keep, args.num_pdb_violations))

    @app.errorhandler(413)
    def too_large(_e):
        return _json({"Error": f"tessera: request body over {max_body_bytes} bytes"}, 413)

    @app.errorhandler(404)
    def not_found(_e):
        return _json({"Error": f"tessera: no such endpoint {request.method} {request.path}"}, 404)

    @app.errorhandler(405)
    def wrong_method(_e):
        return _json({"Error": f"tessera: {request.method} not allowed on {request.path}"}, 405)

    @app.errorhandler(400)
    def bad_request(e):
        return _json({"Error": f"tessera: bad request: {getattr(e, 'description', e)}"}, 400)

    @app.errorhandler(Exception)
    def crashed(e):  # a bug, not the caller's fault: say so in words (the fuzz tests assert this never happens)
        if isinstance(e, HTTPException):
            return _json({"Error": f"tessera: {e.name}: {e.description}"}, e.code or 500)
        logging.getLogger(__name__).exception("unhandled error on %s %s", request.method, request.path)
        return _json({"Error": f"tessera: internal error on {request.path}: {type(e).__name__}"}, 500)

    return app
