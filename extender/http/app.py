"""The Flask app kube-scheduler calls: filter, prioritize, bind, preempt; plus health, inspect, metrics.

Every handler parses the body into plain data (wire.py, kube/contract.py), asks the `Extender`,
and encodes the answer. A malformed body gets 400 with the reason in `Error` and changes nothing;
a pod that asks for something invalid gets a filter `Error` in words (it shows in the pod's events).
"""

from __future__ import annotations

import logging
import ssl
import time
import urllib.error
import urllib.request
from typing import Protocol

import orjson
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from werkzeug.exceptions import HTTPException

from ..core.model import RequestError
from ..kube.contract import assignment_annotations, pod_info
from ..service import Binder, BindError, BindFailure, Extender, NotReady  # noqa: F401 (re-exported)
from . import wire
from .inspect import cluster_map, pod_reasons
from .limits import MAX_BODY_BYTES
from .metrics import ClusterCollector
from .openapi import openapi_yaml

DEFAULT_PREFIX = "/tessera"
GANG_WAIT_S = 20.0  # keep below the scheduler config's httpTimeout (30s shipped)
FORWARDED_HEADER = "X-Tessera-Forwarded"  # a forwarded bind is never forwarded again


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
    """Who may bind (kube/lease.py): followers forward binds to the leader's URL."""

    def is_leader(self) -> bool: ...

    def leader_url(self) -> str: ...


def _forward(leadership: Leadership, raw: bytes, timeout_s: float, context: ssl.SSLContext | None) -> Response:
    """Relay a bind to the Lease holder; its answer (or why there is none) goes back to kube-scheduler."""
    if request.headers.get(FORWARDED_HEADER):
        return _json({"Error": "tessera: a forwarded bind reached a replica that does not hold the lease; retrying"})
    url = leadership.leader_url()
    if not url:
        return _json({"Error": "tessera: no replica holds the bind lease yet; kube-scheduler will retry"})
    req = urllib.request.Request(url.rstrip("/") + "/bind", data=raw, method="POST",
                                 headers={"Content-Type": "application/json", FORWARDED_HEADER: "1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return Response(resp.read(), status=resp.status, mimetype="application/json")
    except urllib.error.HTTPError as e:
        return Response(e.read(), status=e.code, mimetype="application/json")
    except (urllib.error.URLError, OSError) as e:
        return _json({"Error": f"tessera: cannot reach the leader at {url} to bind: {e}"})


def create_app(extender: Extender, binder: Binder, prefix: str = DEFAULT_PREFIX, gang_wait_s: float = GANG_WAIT_S,
               leadership: Leadership | None = None, forward_context: ssl.SSLContext | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> Flask:
    """The WSGI app. `leadership`: None for a single replica, which always binds."""
    app = Flask("tessera")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    registry = CollectorRegistry()
    latency = Histogram("tessera_verb_seconds", "Time to answer a kube-scheduler verb", ["verb"], registry=registry,
                        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
    rejected = Counter("tessera_filter_rejections", "Nodes refused by filter, by reason", ["reason"], registry=registry)
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
        for reason in list(outcome.failed.values()) + list(outcome.unresolvable.values()):
            rejected.labels(reason.split(" (")[0].split(":", 1)[-1].strip()[:60]).inc()
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
            return _forward(leadership, orjson.dumps(body), gang_wait_s + 5, forward_context)
        key = f"{args.pod_namespace}/{args.pod_name}"
        try:
            assignment, uuids = extender.reserve(args.pod_uid, key, args.node)
        except (BindError, NotReady) as e:
            errors.labels("bind", "refused").inc()
            return _json({"Error": str(e)})
        if not extender.wait_for_gang(args.pod_uid, gang_wait_s):
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

    @app.get("/healthz")
    def healthz():
        return _json({"ok": True})

    @app.get("/readyz")
    def readyz():
        # not ready before the first full sync, nor while a watch has been down too long (kube/health.py)
        why = "" if extender.synced else "the first sync of nodes and pods has not completed"
        why = why or extender.watch_health.stalled()
        return _json({"ready": not why, "nodes": len(extender.cluster.nodes), **({"reason": why} if why else {})},
                     503 if why else 200)

    @app.get("/inspect")
    def inspect():
        pod = request.args.get("pod")
        if pod:
            found = pod_reasons(extender, pod)
            return _json(found, 200 if "error" not in found else 404)
        return _json(cluster_map(extender))

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(413)
    def too_large(_e):
        return _json({"Error": f"tessera: request body over {max_body_bytes} bytes"}, 413)

    @app.errorhandler(404)
    def not_found(_e):
        return _json({"Error": f"tessera: no such endpoint {request.method} {request.path}"}, 404)

    @app.errorhandler(405)
    def wrong_method(_e):
        return _json({"Error": f"tessera: {request.method} not allowed on {request.path}"}, 405)

    @app.get("/openapi.yaml")
    def openapi():
        return Response(openapi_yaml(prefix), mimetype="application/yaml")

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
