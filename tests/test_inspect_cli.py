"""`tessera inspect`: a summary grouped by cause, and `--pod` in words for every pod Tessera saw (issue 16)."""

from __future__ import annotations

import re

import pytest

from extender.cli.inspect import render_inspect
from extender.http.app import create_app
from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod
from testing.ports import both

DICT_REPR = re.compile(r"\{'|': ")


@pytest.fixture
def client():
    e = Extender()
    for n in ("a", "b"):
        e.upsert_node(node_inventory(k8s_node(n, gpus=4)))
    e.mark_synced()
    return e, both(create_app(e, binder=None)).test_client()


def ask(client, key):
    return render_inspect(client.get(f"/inspect?pod={key}").get_json())


def test_a_pod_the_watch_set_aside_is_named_rejected_with_its_reason_not_unknown(client):
    e, c = client
    e.watch_health.record_bad("Pod", "uid-bad", "ml/bad", "uid-bad", "tessera.dev/gpu-milli: not a quantity: 'lots'", "7")
    resp = c.get("/inspect?pod=ml/bad")
    assert resp.status_code == 200
    text = render_inspect(resp.get_json())
    assert "not in tessera's cache" not in text
    assert "ml/bad: rejected" in text and "not a quantity: 'lots'" in text


def test_a_waiting_gang_member_is_said_to_wait_for_its_gang_not_to_fit(client):
    e, c = client
    ann = {"tessera.dev/gang-name": "train", "tessera.dev/gang-size": "3"}
    e.upsert_pod(pod_info(k8s_pod("g-0", gpus=2, ann=ann)))
    text = ask(c, "ml/g-0")
    assert "fits" not in text.split("\n")[0] and "waiting in gang" in text
    assert "ml/train has 0 of 3 members placed, 1 seen" in text and "waits for the other 2 to be created" in text


def test_a_pods_request_is_in_words_not_a_python_dict(client):
    e, c = client
    e.upsert_pod(pod_info(k8s_pod("big", gpus=5)))
    text = ask(c, "ml/big")
    assert not DICT_REPR.search(text), text
    assert "asks 1000m CPU, 1024 MiB, 5 GPU(s) x 1000 milli" in text
    assert "pending: fits no node: node has 4 GPUs, pod needs 5 (2 of 2 nodes)" in text


def test_bound_and_finished_pods_are_answered_in_words(client):
    e, c = client
    e.upsert_pod(pod_info(k8s_pod("p", milli=250, node="a", phase="Running",
                                  assignment={"node": "a", "gpus": [1], "milli": 250})))
    assert "pod ml/p: bound: on a, GPU(s) 1, 250 milli each" in ask(c, "ml/p")
    e.upsert_pod(pod_info(k8s_pod("done", gpus=1, phase="Succeeded")))
    assert "pod ml/done: succeeded" in ask(c, "ml/done")
    resp = c.get("/inspect?pod=ml/never")
    assert resp.status_code == 404 and "has not seen it" in resp.get_json()["error"]


def test_the_summary_groups_pending_pods_by_cause_in_words():
    from testing.synthetic_cluster import synthetic_extender

    e = synthetic_extender(nodes=30, pending=9)
    c = both(create_app(e, binder=None)).test_client()
    body = c.get("/inspect?summary=1").get_json()
    text = render_inspect(body)
    assert not DICT_REPR.search(text), text
    assert "30 nodes; A100: 70 of 80 GPUs free" in text
    assert "11 pods pending, 1 gangs waiting" in text
    for cause in ("insufficient cpu: 3 pods", "node has 8 GPUs, pod needs 16: 3 pods", "fits, not bound yet: 3 pods",
                  "waiting for its gang: 2 pods"):
        assert cause in text
    assert 0 < body["fragmentation"] < 1
    assert [n[0] for n in body["nodes"]][:2] == ["node-00000", "node-00001"] and body["nodes"][0][2][:2] == [700, 0]
    detail = render_inspect(c.get("/inspect?node=node-00000").get_json())
    assert "GPU 0: free  700  ml/slice-0=300" in detail


def test_the_page_and_summary_answer_only_loopback_peers(client):
    _, c = client
    assert c.get("/", environ_base={"REMOTE_ADDR": "10.0.0.9"}).status_code == 403
    assert c.get("/inspect?summary=1", environ_base={"REMOTE_ADDR": "10.0.0.9"}).status_code == 403
    page = c.get("/ui")
    assert page.status_code == 200 and page.mimetype == "text/html" and b"inspect?summary=1" in page.data


def test_tessera_inspect_over_http_prints_the_summary_and_a_pod_in_words(capsys):
    from extender.cli import main
    from testing.browser import serving
    from testing.synthetic_cluster import synthetic_extender

    with serving(synthetic_extender(nodes=12, pending=3)) as url:
        assert main(["inspect", "--url", url]) == 0
        out = capsys.readouterr().out
        assert "12 nodes; A100: 28 of 32 GPUs free" in out and "waiting for its gang: 2 pods" in out
        assert main(["inspect", "--url", url, "--pod", "ml/gang-1"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("pod ml/gang-1: waiting in gang: gang ml/train has 0 of 4 members placed")
        assert main(["inspect", "--url", url, "--node", "node-00000"]) == 0
        assert "GPU 1: free    0  ml/whole-0=1000" in capsys.readouterr().out
        assert main(["inspect", "--url", url, "--pod", "ml/never"]) == 1
        assert "has not seen it" in capsys.readouterr().err


@pytest.mark.parametrize("status, body, args, words", [
    (200, b'{"a": 1}', [], "did not answer as Tessera's /inspect does"),
    (200, b"[1, 2]", ["--pod", "ml/x"], "did not answer as Tessera's /inspect does"),
    (200, b"<html>metrics</html>", ["--node", "n"], "did not answer as Tessera's /inspect does"),
    (502, b"<html>Bad Gateway</html>", [], "HTTP 502"),
])
def test_inspect_pointed_at_something_else_says_so_in_one_line(capsys, status, body, args, words):
    """Pointed at another server (a wrong port, a proxy's error page), `tessera inspect` died in a KeyError traceback
    or printed 'Expecting value: line 1 column 1'."""
    import http.server
    import threading

    from extender.cli import main

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's name is the standard library's)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["inspect", "--url", f"http://127.0.0.1:{server.server_address[1]}", *args]) == 1
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_inspect_refuses_a_url_that_is_not_http(capsys):
    from extender.cli import main

    assert main(["inspect", "--url", "file:///etc/passwd"]) == 2
    assert "--url wants the admin port's http:// or https:// address" in capsys.readouterr().err


def test_control_characters_in_an_answer_are_escaped_before_they_reach_the_terminal():
    """Names and reasons come from tenants and nodes; the server refuses control characters in them, and the CLI
    escapes whatever still arrives (an older server, another path): an ESC sequence must not act on the screen."""
    from extender.cli.inspect import _printable, render_inspect

    body = _printable({"pod": "ml/p", "status": "pending", "why": "x\x1b[2J\nFAKE: all healthy", "nodes": {}})
    out = render_inspect(body)
    assert "\x1b" not in out and "\nFAKE" not in out and "\\x1b[2J\\nFAKE" in out
