"""The admin listener (`--admin-listen`): health, readiness, metrics, `/inspect` and the OpenAPI document.

Why a second port: the verbs (filter, prioritize, bind, preempt) change state and answer only
kube-scheduler (mutual TLS, or loopback beside it); the kubelet's probes and Prometheus cannot hold
the scheduler's client certificate, so what they need lives here, on plain HTTP, and carries nothing
that moves a pod. `/metrics` carries no pod or tenant names (ClusterCollector sums per GPU model).

`/healthz` and `/readyz` are here too, for whoever asked here before; the shipped Deployments probe the probe
listener instead (`--probe-listen`, http/probes.py): this port is waitress, and where NetworkPolicy is not
enforced any pod can hold all its connections, which had the kubelet restart the extender (issue 35).

`/inspect` lists every tenant's pods and why each does not fit: it answers only peers on loopback
(an admin reaches it with `kubectl port-forward`, which needs pods/portforward in tessera-system)
unless the operator opens it on purpose (`--inspect-from-anywhere`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from importlib import resources

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..service import Extender
from .errors import answer_routing_errors, json_response
from .inspect import cluster_map, node_detail, pod_reasons, summary
from .openapi import openapi_yaml

ADMIN_PATHS = ("/healthz", "/readyz", "/metrics", "/inspect", "/openapi.yaml", "/", "/ui")
PAGE = "page.html"  # package data beside this module: the cluster map, no build step, nothing fetched


def loopback_refusal():
    """The 403 for a request to a loopback-only page that is not from loopback, or that names another Host (DNS
    rebinding: a web page's name re-pointed at 127.0.0.1 would read the map); None when it may be answered."""
    if not is_loopback(request.remote_addr):
        return json_response({"error": f"tessera: {request.path} answers only on loopback: use kubectl port-forward "
                                      "(or start the extender with --inspect-from-anywhere)"}, 403)
    if not loopback_host(request.host):
        return json_response({"error": f"tessera: {request.path} answers only to Host localhost, 127.0.0.1 or [::1]"},
                             403)
    return None


def loopback_host(host: str | None) -> bool:
    """The Host header names loopback (any port): what a browser sends after kubectl port-forward. A page on another
    site whose name an attacker re-points at 127.0.0.1 sends its own name, and is refused."""
    name = (host or "").rsplit(":", 1)[0] if not (host or "").startswith("[") else (host or "").split("]")[0] + "]"
    return name.lower() in ("localhost", "127.0.0.1", "[::1]") or (name.startswith("127.") and is_loopback(name))


def is_loopback(addr: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (and an IPv4-mapped loopback); anything unparsable is not loopback."""
    try:
        ip = ipaddress.ip_address((addr or "").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def probe_answers(extender: Extender) -> dict[str, Callable[[], tuple[dict, int]]]:
    """What `/healthz` and `/readyz` answer (body, status), on the admin port and on the probe listener alike
    (http/probes.py, where the shipped Deployments' probes go): cheap reads, no lock held for long."""

    def healthz() -> tuple[dict, int]:
        return {"ok": True}, 200

    def readyz() -> tuple[dict, int]:
        # not ready before the first full sync, nor while a watch has been down too long (watch_health.py)
        why = "" if extender.synced else "the first sync of nodes and pods has not completed"
        why = why or extender.watch_health.stalled()
        body = {"ready": not why, "nodes": len(extender.cluster.nodes), **({"reason": why} if why else {})}
        return body, 503 if why else 200

    return {"/healthz": healthz, "/readyz": readyz}


def create_admin_app(extender: Extender, registry: CollectorRegistry, prefix: str = "/tessera",
                     inspect_from_anywhere: bool = False) -> Flask:
    """The admin WSGI app. `registry` is the verbs app's (`app.extensions["tessera"]["registry"]`),
    so the verb latencies recorded there are scraped here."""
    app = Flask("tessera-admin", static_folder=None)  # Flask's default served ./static from the working directory
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    probes = probe_answers(extender)

    @app.get("/healthz")
    def healthz():
        return json_response(*probes["/healthz"]())

    @app.get("/readyz")
    def readyz():
        return json_response(*probes["/readyz"]())

    def refused():
        return None if inspect_from_anywhere else loopback_refusal()

    @app.get("/inspect")
    def inspect():
        if (no := refused()) is not None:
            return no
        pod, node = request.args.get("pod"), request.args.get("node")
        if pod or node:
            found = pod_reasons(extender, pod) if pod else node_detail(extender, node)
            return json_response(found, 200 if "error" not in found else 404)
        if request.args.get("summary"):
            return json_response(summary(extender))
        return json_response(cluster_map(extender))

    @app.get("/")
    @app.get("/ui")
    def page():
        # the page shows what /inspect shows (every tenant's pods), so the same peers only
        if (no := refused()) is not None:
            return no
        html = resources.files(__package__).joinpath(PAGE).read_bytes()
        return Response(html, mimetype="text/html", headers={"Cache-Control": "no-store",
                                                             "Content-Security-Policy": "default-src 'self' 'unsafe-inline'"})

    @app.get("/metrics")
    def metrics():
        # content_type, not mimetype: Werkzeug adds a charset to a text/* mimetype, and the second "charset=" makes
        # the header unparsable for Go's mime.ParseMediaType, which Prometheus 3 uses to refuse a scrape
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.yaml")
    def openapi():
        return Response(openapi_yaml(prefix), mimetype="application/yaml")

    answer_routing_errors(app, "admin")
    return app
