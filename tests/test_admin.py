"""The two listeners' apps: the verbs port serves only the verbs; the admin port serves health,
metrics and /inspect, and /inspect (every tenant's pods) only to loopback peers."""

from __future__ import annotations

import pytest

from extender.http.admin import create_admin_app, is_loopback
from extender.http.app import create_app
from tests.fuzzkit import NODES, P, live
from tests.ports import both


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/inspect", "/openapi.yaml"])
def test_the_verbs_app_serves_no_admin_endpoint(path):
    world = live()
    verbs = create_app(world.extender, world.binder, prefix=P)
    assert verbs.test_client().get(path).status_code == 404


def test_inspect_answers_loopback_only_unless_opened():
    world = live()
    registry = both(create_app(world.extender, world.binder, prefix=P)).extensions["tessera"]["registry"]
    admin = create_admin_app(world.extender, registry, prefix=P)
    for peer in ("10.0.0.7", "192.168.1.2", "::ffff:10.1.2.3", "", "fe80::1"):
        answer = admin.test_client().get("/inspect", environ_base={"REMOTE_ADDR": peer})
        assert answer.status_code == 403 and "port-forward" in answer.get_json()["error"]
        assert b"ml/" not in answer.data  # no pod names leak in the refusal
    for peer in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        assert admin.test_client().get("/inspect", environ_base={"REMOTE_ADDR": peer}).status_code == 200
    opened = create_admin_app(world.extender, registry, prefix=P, inspect_from_anywhere=True)
    assert opened.test_client().get("/inspect", environ_base={"REMOTE_ADDR": "10.0.0.7"}).status_code == 200
    # health and metrics answer anyone who reaches the admin port (kubelet probes, Prometheus)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert admin.test_client().get(path, environ_base={"REMOTE_ADDR": "10.0.0.7"}).status_code == 200


def test_metrics_carry_no_pod_namespace_or_node_names():
    world = live()
    app = both(create_app(world.extender, world.binder, prefix=P), prefix=P)
    client = app.test_client()
    client.post(f"{P}/filter", json=world.pending)
    text = client.get("/metrics").get_data(as_text=True)
    assert "tessera_gpu_free_milli" in text
    for name in ("ml", "held", "waiting", "bound", "uid-", *NODES):
        assert f'"{name}' not in text, name  # no label value starts with a tenant's or a node's name


def test_is_loopback_refuses_garbage():
    assert not is_loopback(None) and not is_loopback("localhost") and not is_loopback("127.0.0.1:80")
