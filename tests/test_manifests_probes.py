"""The agent's and the bridge's probes ask only for what their code serves, and each image's EXPOSE lists the ports
the manifests' containers of that image declare, and the Ray job driver's (8889 and 9500 were missing)."""

from __future__ import annotations

import re

import pytest

from .kustomize import render
from .test_manifests import ROOT, M, dockerfile, find

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _container(objs, kind, name):
    return find(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def _probe_paths(c) -> dict[str, tuple[str, int]]:
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    return {k: (c[k]["httpGet"]["path"], ports[c[k]["httpGet"]["port"]]) for k in PROBES if k in c}


def test_the_agent_is_ready_once_it_has_a_report_and_alive_while_it_serves():
    from gpu_sharing.agent import REPORT_PATH

    c = _container(render(M), "DaemonSet", "tessera-agent")
    port = int(c["args"][c["args"].index("--metrics-listen") + 1].rsplit(":", 1)[1])
    assert _probe_paths(c) == {"readinessProbe": (REPORT_PATH, port), "livenessProbe": ("/metrics", port)}
    served = set(re.findall(r'path == ("/\w+"|REPORT_PATH)', (ROOT / "gpu_sharing/agent.py").read_text()))
    assert served == {"REPORT_PATH", '"/metrics"'}, "the agent's handler serves these two paths, nothing else"


def test_the_bridge_is_probed_on_its_metrics_port_with_time_for_the_first_list():
    c = _container(render(M), "Deployment", "tessera-bridge")
    port = int(c["args"][c["args"].index("--metrics-listen") + 1].rsplit(":", 1)[1])
    assert set(_probe_paths(c).values()) == {("/metrics", port)} and set(_probe_paths(c)) == set(PROBES)
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # the port opens after the first full list
    src = (ROOT / "raybridge/bridge.py").read_text()
    opens = re.search(r"\b(serve_metrics|start_http_server)\(", src[src.index("def serve("):])
    assert opens and src.index("watch.synced.wait()") < src.index("def serve(") + opens.start()


@pytest.mark.parametrize("entry, name", [("", "tessera-extender"), ("second-scheduler", "tessera-extender"),
                                         ("k8s-1.20", "tessera-extender"),
                                         ("k8s-1.20/second-scheduler", "tessera-extender")])
def test_the_extender_is_probed_on_its_probe_listener_for_what_that_serves(entry, name):
    """Not the admin port: where NetworkPolicy is not enforced any pod could hold all its connections, and the
    kubelet then restarted the extender while GPU pods waited (issue 35; tests/test_admin_flood.py)."""
    from extender.http.admin import probe_answers
    from extender.service import Extender

    c = next(c for c in find(render(M / entry), "Deployment", name)["spec"]["template"]["spec"]["containers"]
             if c.get("args", [""])[0] == "serve")
    listens = {int(c["args"][i + 1].rsplit(":", 1)[1]): flag for i, flag in enumerate(c["args"]) if flag.endswith("listen")}
    paths = _probe_paths(c)
    assert paths == {"readinessProbe": ("/readyz", 8890), "livenessProbe": ("/healthz", 8890)}
    assert listens[8890] == "--probe-listen" and c["args"][c["args"].index("--probe-listen") + 1] == "0.0.0.0:8890"
    assert {path for path, _ in paths.values()} == set(probe_answers(Extender()))  # what the probe listener answers


def _exposed() -> dict[str, set[int]]:
    stage, out = "", {}
    for word, rest in dockerfile():
        if word == "FROM":
            stage = rest.split()[-1]
        elif word == "EXPOSE":
            out.setdefault(stage, set()).update(int(p.split("/")[0]) for p in rest.split())
    return out


def test_each_image_exposes_the_ports_its_tessera_system_containers_declare():
    declared: dict[str, set[int]] = {}
    for entry in ("", "second-scheduler"):
        for o in render(M / entry):
            if o["kind"] in ("Deployment", "DaemonSet"):
                for c in o["spec"]["template"]["spec"]["containers"]:
                    if c["image"].startswith("ghcr.io/tessera-sched/tessera:"):
                        stage = "ray" if c["image"].endswith("-ray") else "tessera"
                        declared.setdefault(stage, set()).update(p["containerPort"] for p in c.get("ports", []))
    assert declared == {"tessera": {8888, 8889, 8890, 9400, 9401, 9500}}
    # the ray image also runs each job's driver, which serves its metrics at --metrics-listen (raybridge/job.py)
    driver = int(re.search(r'"--metrics-listen".*?default="[^"]*:(\d+)"', (ROOT / "raybridge/job.py").read_text()).group(1))
    assert _exposed() == {"tessera": declared["tessera"], "ray": {driver}}
