"""The two listeners' apps: the verbs port serves only the verbs; the admin port serves health,
metrics and /inspect, and /inspect (every tenant's pods) only to loopback peers."""

from __future__ import annotations

import pytest

from extender.http.admin import create_admin_app, is_loopback
from extender.http.app import create_app
from testing.fuzzkit import NODES, P, live
from testing.ports import both


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


def test_inspect_and_the_page_answer_only_to_a_loopback_host_name():
    """From loopback, any Host got the map: a web page whose name an attacker re-points at 127.0.0.1 (DNS
    rebinding) could read every tenant's pods through an admin's kubectl port-forward."""
    world = live()
    registry = both(create_app(world.extender, world.binder, prefix=P)).extensions["tessera"]["registry"]
    admin = create_admin_app(world.extender, registry, prefix=P).test_client()
    local = {"REMOTE_ADDR": "127.0.0.1"}
    for host in ("localhost:8889", "127.0.0.1:8889", "[::1]:8889", "localhost"):
        assert admin.get("/inspect", environ_base=local, headers={"Host": host}).status_code == 200, host
    for path in ("/inspect", "/"):
        answer = admin.get(path, environ_base=local, headers={"Host": "evil.example:8889"})
        assert answer.status_code == 403 and b"ml/" not in answer.data


@pytest.mark.parametrize("which", ["verbs", "admin"])
def test_no_listener_serves_files_from_the_working_directory(which, tmp_path, monkeypatch):
    """Flask's default static folder served ./static/<path> from wherever the process ran, to anyone, on both ports."""
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "secret.txt").write_text("the-file-content")
    monkeypatch.chdir(tmp_path)
    world = live()
    verbs = create_app(world.extender, world.binder, prefix=P)
    app = verbs if which == "verbs" else create_admin_app(world.extender, both(verbs).extensions["tessera"]["registry"],
                                                          prefix=P)
    answer = app.test_client().get("/static/secret.txt", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert answer.status_code == 404 and b"the-file-content" not in answer.data


def test_metrics_content_type_has_one_charset_as_prometheus_parses_it():
    """Werkzeug added its own charset to prometheus_client's: "text/plain; version=1.0.0; charset=utf-8;
    charset=utf-8", which Go's mime.ParseMediaType (Prometheus 3's scrape) refuses as a duplicate parameter."""
    world = live()
    registry = both(create_app(world.extender, world.binder, prefix=P)).extensions["tessera"]["registry"]
    answer = create_admin_app(world.extender, registry, prefix=P).test_client().get("/metrics")
    kind, *params = [p.strip() for p in answer.headers["Content-Type"].split(";")]
    names = [p.split("=", 1)[0].lower() for p in params]
    assert kind == "text/plain" and len(names) == len(set(names)) and "charset" in names
