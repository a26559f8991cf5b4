"""The Flask app kube-scheduler calls: filter, prioritize, bind, preempt (the verbs listener).

Health, readiness, metrics and /inspect live on the admin listener (admin.py): the verbs port
answers kube-scheduler alone. The verbs' metrics are recorded into `app.extensions["tessera"]
["registry"]`, which the admin app serves.

Every handler parses the body into plain data (wire.py, translate/objects.py), asks the `Extender`
(or, for bind, the bind transaction in extender/binding.py), and encodes the answer. Errors are
answered from one table for all verbs (errors.py, which says why each verb encodes them as it does):
a malformed body gets 400 with the reason in `Error` and changes nothing; a pod that asks for
something invalid gets a filter `Error` in words (it shows in the pod's events).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, Histogram
from werkzeug.exceptions import HTTPException

from ..binding import BindResult, bind_pod
from ..core.model import RequestError
from ..service import Extender
from ..state import Binder, BindError, BindFailure, NotReady  # noqa: F401 (re-exported)
from ..translate.objects import BOUND_REASON, bound_message, names_gpu_resource, pod_info
from . import timing, wire
from .errors import HANDLED, answer_routing_errors, encode, json_response, words
from .forward import FORWARDED_HEADER
from .limits import MAX_BODY_BYTES
from .metrics import ClusterCollector, reason_counts

DEFAULT_PREFIX = "/tessera"


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

    def forward(self, raw: bytes, timeout_s: float, verb: str = "bind") -> tuple[int, bytes]: ...


class EventQueue(Protocol):
    """kube/cache.py's EventSink: offers never block the verb; a full queue drops."""

    def offer(self, kind: str, namespace: str, name: str, uid: str, rv: str, message: str, reason: str = ...) -> None: ...


def _forward(forwarder: Forwarder | None, raw: bytes, timeout_s: float, verb: str = "bind") -> Response:
    """Relay a bind (or a gang member's filter: its gang is admitted by the replica that binds) to the Lease holder;
    its answer (or why there is none) goes back to kube-scheduler."""
    if request.headers.get(FORWARDED_HEADER):
        return json_response({"Error": "tessera: a forwarded call reached a replica that does not hold the lease; retrying"})
    if forwarder is None:
        return json_response({"Error": "tessera: this replica does not hold the bind lease and forwards to no one; retrying"})
    status, body = forwarder.forward(raw, timeout_s, verb)
    return Response(body, status=status, mimetype="application/json")


@dataclass(frozen=True, slots=True)
class VerbMetrics:
    """The verbs' Prometheus series, in the registry the admin listener serves."""

    registry: CollectorRegistry
    latency: Histogram
    rejected: Counter
    errors: Counter

    @classmethod
    def create(cls, extender: Extender) -> VerbMetrics:
        registry = CollectorRegistry()
        latency = Histogram("tessera_verb_seconds", "Time to answer a kube-scheduler verb", ["verb"], registry=registry,
                            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        rejected = Counter("tessera_filter_rejections", "Nodes refused by filter, by reason (a fixed set: metrics.py)",
                           ["reason"], registry=registry)
        errors = Counter("tessera_verb_errors", "Verb calls answered with an error", ["verb", "kind"], registry=registry)
        registry.register(ClusterCollector(extender))
        return cls(registry, latency, rejected, errors)


class InFlight:
    """How many filter and prioritize calls are being answered now: the bind Events wait for none to be (serve.py).

    Python runs one thread at a time, so an Event written while kube-scheduler waits on a filter takes its CPU
    from that filter (about 1 ms of HTTP client per Event; bench/bind_latency.py). kube-scheduler leaves gaps
    between its calls (the bind, the next pod's queue), and the Events fit in them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *_) -> None:
        with self._lock:
            self.count -= 1

    def busy(self) -> bool:
        return self.count > 0


QUIET = contextlib.nullcontext()
WAITED_ON = ("filter", "prioritize")  # the calls kube-scheduler waits on before it can go on


def _verb(app: Flask, prefix: str, metrics: VerbMetrics, name: str, in_flight: InFlight | None = None):
    """POST {prefix}/{name}: timed, and every error in the one table (errors.py) answered alike."""
    counted = in_flight if in_flight is not None and name in WAITED_ON else QUIET

    def wrap(fn):
        def run():
            started = time.perf_counter()
            try:
                with counted:
                    return fn()
            except HANDLED as e:
                kind, status, body = encode(name, e)
                metrics.errors.labels(name, kind).inc()
                return json_response(body, status)
            finally:
                metrics.latency.labels(name).observe(time.perf_counter() - started)
        run.__name__ = f"verb_{name}"
        return app.post(f"{prefix}/{name}")(run)
    return wrap


# A follower relays a bind (or a gang member's filter) to the Lease holder and waits this long for its answer
FORWARD_TIMEOUT_S = 10.0


def create_app(extender: Extender, binder: Binder, prefix: str = DEFAULT_PREFIX,
               leadership: Leadership | None = None, forwarder: Forwarder | None = None, in_flight: InFlight | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, events: EventQueue | None = None, timed: bool = False) -> Flask:
    """The WSGI app. `leadership`: None for a single replica, which always binds; `events`: where the bind Event goes
    (which GPUs, how much of each: the Scheduled event names only the node); `timed`: each answer says where its time
    went (timing.py; off in production); `in_flight`: counts the filter and prioritize calls being answered."""
    app = Flask("tessera", static_folder=None)  # Flask's default served ./static from the working directory
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    metrics = VerbMetrics.create(extender)
    app.extensions["tessera"] = {"extender": extender, "registry": metrics.registry}
    extender = timing.install(app, extender) if timed else extender
    is_leader = leadership.is_leader if leadership is not None else (lambda: True)

    @_verb(app, prefix, metrics, "filter", in_flight)
    def filter_verb():
        body = _load()
        args = wire.parse_extender_args(body)
        try:
            info = pod_info(args.pod, extender.signer)
            if info.in_gang and forwarder is not None and not is_leader():  # a gang is admitted where it is bound
                return _forward(forwarder, orjson.dumps(body), FORWARD_TIMEOUT_S, "filter")
            outcome = extender.filter(info, args.node_names)
        except RequestError as e:  # a pod without GPUs: every node refused for it, not an Error its ignorable entry skips
            if not args.node_names or names_gpu_resource(args.pod):
                raise  # a GPU pod's entry is not ignorable: Error stops the attempt, and no preemption runs for it
            metrics.errors.labels("filter", "bad-pod").inc()
            reason = wire.refusal_reason(words(e))
            return json_response(wire.filter_result(args, [], {}, dict.fromkeys(args.node_names, reason)))
        for category, n in reason_counts([*outcome.failed.values(), *outcome.unresolvable.values()]).items():
            metrics.rejected.labels(category).inc(n)
        return json_response(wire.filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable))

    @_verb(app, prefix, metrics, "prioritize", in_flight)
    def prioritize_verb():
        args = wire.parse_extender_args(_load())
        return json_response(wire.host_priorities(extender.prioritize(pod_info(args.pod, extender.signer), args.node_names)))

    @_verb(app, prefix, metrics, "bind")
    def bind_verb():
        body = _load()
        target = wire.parse_binding_args(body)
        if not is_leader():
            return _forward(forwarder, orjson.dumps(body), FORWARD_TIMEOUT_S)
        outcome = bind_pod(extender, binder, target, is_leader)
        if not outcome.bound:
            metrics.errors.labels("bind", outcome.result.value).inc()
        elif outcome.result is BindResult.BOUND and events is not None:
            events.offer("Pod", target.pod_namespace, target.pod_name, target.pod_uid, "",
                         bound_message(outcome.assignment, outcome.uuids), BOUND_REASON)
        return json_response({"Error": outcome.message})

    @_verb(app, prefix, metrics, "preempt")
    def preempt_verb():
        args = wire.parse_preemption_args(_load())
        keep = extender.preempt(pod_info(args.pod, extender.signer), args.victims)
        return json_response(wire.preemption_result(keep, args.num_pdb_violations))

    _answer_http_errors(app, max_body_bytes)
    return app


def _answer_http_errors(app: Flask, max_body_bytes: int) -> None:
    """Flask's own refusals (size, path, method) and crashes, in words like the verbs' errors."""

    @app.errorhandler(413)
    def too_large(_e):
        return json_response({"Error": f"tessera: request body over {max_body_bytes} bytes"}, 413)

    answer_routing_errors(app)

    @app.errorhandler(400)
    def bad_request(e):
        return json_response({"Error": f"tessera: bad request: {getattr(e, 'description', e)}"}, 400)

    @app.errorhandler(Exception)
    def crashed(e):  # a bug, not the caller's fault: say so in words (the fuzz tests assert this never happens)
        if isinstance(e, HTTPException):
            return json_response({"Error": f"tessera: {e.name}: {e.description}"}, e.code or 500)
        logging.getLogger(__name__).exception("unhandled error on %s %s", request.method, request.path)
        return json_response({"Error": f"tessera: internal error on {request.path}: {type(e).__name__}"}, 500)
