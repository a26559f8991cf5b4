"""bench/bind_latency.py's pieces that need no control plane: its flags, the Nodes and pods it writes as Tessera reads
them, and the verbs' optional Server-Timing header (extender/http/timing.py) it reads the breakdown from. The run
itself needs kube-apiserver: tests/e2e/test_bind_latency_e2e.py runs it small."""

from __future__ import annotations

import pytest

from bench.bind_latency import SHAPES, best, node_body, parse_args, pod_body
from extender.http import timing
from extender.http.app import create_app
from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info

P = "/tessera"


def test_defaults_are_the_issue_s_run_and_nonsense_is_refused(capsys):
    args = parse_args([])
    assert (args.nodes, args.pods, args.runs, args.fill, args.bind) == (5000, 600, 1, 0.0, "background")
    assert parse_args(["--nodes", "500", "--pods", "100", "--fill", "0.6"]).fill == 0.6
    for bad in (["--pods", "0"], ["--nodes", "-1"], ["--fill", "1.5"], ["--runs", "x"], ["--bind", "sometimes"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "must be at least 1" in capsys.readouterr().err


def test_the_bench_s_nodes_count_eight_gpus_and_its_pods_ask_the_five_shapes():
    inv = node_inventory(node_body(4))
    assert inv.spec.gpu_count == 8 and inv.spec.gpu_model == "Tesla-V100-SXM2-32GB"
    assert [g.uuid for g in inv.gpus] == [f"GPU-00004-{g}" for g in range(8)]
    asked = []
    for i, (label, limits) in enumerate(SHAPES):
        body = pod_body(f"p-{label}", limits)
        body["metadata"]["uid"] = f"uid-{i}"
        r = pod_info(body).request
        asked.append((r.gpu_count, r.gpu_milli))
    assert asked == [(1, 250), (1, 500), (1, 1000), (2, 1000), (8, 1000)]


def test_ties_are_drawn_among_the_best_only():
    import random

    rng = random.Random(1)
    scores = [{"Host": "a", "Score": 3}, {"Host": "b", "Score": 9}, {"Host": "c", "Score": 9}]
    assert {best(scores, rng) for _ in range(50)} == {"b", "c"}


class Binder:
    def __init__(self):
        self.calls = []

    def bind(self, namespace, name, uid, node, annotations):
        self.calls.append((namespace, name, uid, node))


def verbs(timed: bool):
    ext = Extender()
    for i in range(3):
        ext.upsert_node(node_inventory(node_body(i)))
    ext.mark_synced()
    pod = pod_body("p0", dict(SHAPES[1][1]))
    pod["metadata"]["uid"] = "uid-p0"
    ext.upsert_pod(pod_info(pod))  # the watch saw it created
    binder = Binder()
    return create_app(ext, binder, timed=timed).test_client(), pod, binder


def test_each_verb_says_where_its_time_went_when_asked():
    client, pod, binder = verbs(timed=True)
    names = ["node-00000", "node-00001", "node-00002"]
    r = client.post(f"{P}/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names})
    parts = timing.parse(r.headers[timing.HEADER])
    assert set(parts) == {"parse", "lock", "locked", "rest", "total", "cpu", "others", "gc", "begin"}
    assert parts["locked"] > 0 and all(v >= 0 for v in parts.values())
    assert abs(parts["parse"] + parts["lock"] + parts["locked"] + parts["rest"] - parts["total"]) < 0.01
    scores = client.post(f"{P}/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": r.get_json()["NodeNames"]})
    assert timing.parse(scores.headers[timing.HEADER])["locked"] > 0
    node = max(scores.get_json(), key=lambda s: s["Score"])["Host"]
    bound = client.post(f"{P}/bind", json={"PodName": "p0", "PodNamespace": "bench", "PodUID": "uid-p0", "Node": node})
    assert bound.get_json() == {"Error": ""} and binder.calls == [("bench", "p0", "uid-p0", node)]
    assert timing.parse(bound.headers[timing.HEADER])["locked"] > 0  # reserve, timed through the same door


def test_off_by_default_no_header_and_only_the_value_1_turns_it_on():
    client, pod, _ = verbs(timed=False)
    r = client.post(f"{P}/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["node-00000"]})
    assert r.status_code == 200 and timing.HEADER not in r.headers
    assert timing.wanted({timing.ENV: "1"}) and not timing.wanted({}) and not timing.wanted({timing.ENV: "0"})
