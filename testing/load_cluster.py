"""The synthetic cluster bench/extender_latency.py and bench/load.py put under load: N nodes x 8 GPUs of three models,
60% of the GPUs held by a seeded mix of slices and whole GPUs; the pods they send; and the do-nothing app they are
compared with (it parses the same bodies with the same JSON library and answers a constant)."""

from __future__ import annotations

import random

import orjson
from flask import Flask, Response, request

from extender.core.model import Assignment, NodeSpec
from extender.service import Extender
from extender.translate.objects import GpuInfo, NodeInventory

MODELS = ("A100", "V100", "T4")
SLICES = (250, 300, 470, 500, 810, 1000)


def build_extender(n_nodes: int, seed: int) -> Extender:
    rng = random.Random(seed)
    ext = Extender()  # starts from openb's task mix, as tessera serve does
    for i in range(n_nodes):
        spec = NodeSpec(f"node-{i:05d}", 96_000, 786_432, 8, MODELS[i % 3])
        ext.upsert_node(NodeInventory(spec, tuple(GpuInfo(g, f"GPU-{i}-{g}") for g in range(8))))
    for node in ext.cluster.nodes:
        for g in range(8):
            if rng.random() < 0.6:
                milli = rng.choice(SLICES)
                ext.cluster.adopt(Assignment(f"held-{node.name}-{g}", node.name, (g,), milli, 2000, 4096, "x"))
    ext.mark_synced()
    return ext


def null_app() -> Flask:
    app = Flask("null")

    @app.post("/tessera/filter")
    def f():
        body = orjson.loads(request.get_data())
        return Response(orjson.dumps({"Nodes": None, "NodeNames": body["NodeNames"], "FailedNodes": None, "Error": ""}),
                        mimetype="application/json")

    @app.post("/tessera/prioritize")
    def p():
        body = orjson.loads(request.get_data())
        return Response(orjson.dumps([{"Host": n, "Score": 5} for n in body["NodeNames"]]), mimetype="application/json")

    return app


def pod(i: int, rng: random.Random) -> dict:
    milli = rng.choice(SLICES)
    limits = {"cpu": "2", "memory": "4Gi"}
    limits["nvidia.com/gpu" if milli == 1000 else "tessera.dev/gpu-milli"] = "1" if milli == 1000 else str(milli)
    return {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"uid-{i}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def pct(values, q: float):
    """The q-quantile of `values` (nearest rank): the benches' p50, p99 and p99.9; NaN for none."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")
