"""Issue 35, item 5: where NetworkPolicy is not enforced, any pod could hold every slot of the admin port with
half-sent requests; `/healthz` there then timed out, the kubelet restarted the extender, and GPU pods waited.

The first test runs `tessera serve` (run_servers: waitress with the shipped options) with the listen flags of each
Deployment that runs it, floods the admin port with 300 connections that each send half a request and stall, from
30 addresses (as 30 pods would: each under the admin port's per-peer cap, so together they hold all its
connections), and asks for `/healthz` and `/readyz` at the ports the Deployment's liveness and readiness probes
name, as the kubelet does. It is not a timing of Tessera in general: an answer within 1 s (the kubelet's default
probe timeout) or none. Before the probe listener the probes asked the admin port and got no answer at all.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testing.local_cluster import ROOT, free_port

from .kustomize import render
from .test_manifests import M, find
from .test_serve import FILTER, KUBECONFIG, wait_up

FLOOD = 300
PEERS = 30  # 127.0.1.1 ... 127.0.1.30: loopback, so Linux lets a client use any of them as its own address
HALF_A_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: tessera\r\nX-Slow: "  # no end of headers, ever
DEPLOYMENTS = {"control-plane": ("", "tessera-extender", "extender"),
               "second-scheduler": ("second-scheduler", "tessera-extender", "extender")}


def shipped_listeners(which: str) -> tuple[list[str], dict[str, str]]:
    """The `--...listen` flags of the Deployment's `tessera serve` container (verbs on loopback, no TLS: the probes
    do not reach the verbs), each on a free loopback port, and {probe kind: that probe's local port}."""
    entry, name, container = DEPLOYMENTS[which]
    c = next(c for c in find(render(M / entry), "Deployment", name)["spec"]["template"]["spec"]["containers"]
             if c["name"] == container)
    args, flags, local = c["args"], [], {}
    for i, a in enumerate(args):
        if a.startswith("--") and a.endswith("listen") and i + 1 < len(args):
            local[args[i + 1].rsplit(":", 1)[1]] = port = str(free_port())
            flags += [a, f"127.0.0.1:{port}"]
    named = {p["name"]: str(p["containerPort"]) for p in c["ports"]}
    probes = {k: local[named[c[k]["httpGet"]["port"]]] for k in ("livenessProbe", "readinessProbe")}
    return flags, probes


def timed_get(url: str, limit_s: float = 5.0) -> tuple[int | None, float]:
    """The status (None: no answer within limit_s) and the seconds it took."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=limit_s) as r:
            status = r.status
    except urllib.error.HTTPError as e:  # 503 before the first sync is an answer all the same
        status = e.code
    except OSError:
        status = None
    return status, time.monotonic() - started


def flood(port: int, n: int = FLOOD, peers: int = PEERS) -> list[socket.socket]:
    hogs = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(f"127.0.1.{i % peers + 1}", 0))
        s.sendall(HALF_A_REQUEST)
        hogs.append(s)
    return hogs


@pytest.mark.parametrize("which", sorted(DEPLOYMENTS))
def test_the_probes_answer_within_1s_while_300_stalled_connections_hold_the_admin_port(tmp_path: Path, which):
    flags, probes = shipped_listeners(which)
    admin_port = int(flags[flags.index("--admin-listen") + 1].rsplit(":", 1)[1])
    verbs_port = int(flags[flags.index("--listen") + 1].rsplit(":", 1)[1])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)  # an unreachable API server: not synced, so /readyz answers 503
    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(kubeconfig), *flags],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    hogs: list[socket.socket] = []
    try:
        wait_up(f"http://127.0.0.1:{probes['livenessProbe']}/healthz", None, proc)
        hogs = flood(admin_port)
        time.sleep(0.5)  # the server has taken them in
        if probes["livenessProbe"] != str(admin_port):  # the premise: the flood holds the admin port
            assert timed_get(f"http://127.0.0.1:{admin_port}/healthz", 1.5)[0] is None
        alive, alive_s = timed_get(f"http://127.0.0.1:{probes['livenessProbe']}/healthz")
        ready, ready_s = timed_get(f"http://127.0.0.1:{probes['readinessProbe']}/readyz")
        print(f"{which}: /healthz {alive} in {alive_s:.3f} s, /readyz {ready} in {ready_s:.3f} s under {FLOOD} stalled")
        assert alive == 200 and alive_s < 1.0, f"/healthz: {alive} after {alive_s:.2f} s"
        assert ready in (200, 503) and ready_s < 1.0, f"/readyz: {ready} after {ready_s:.2f} s"
        req = urllib.request.Request(f"http://127.0.0.1:{verbs_port}/tessera/filter", method="POST", data=FILTER)
        with urllib.request.urlopen(req, timeout=5) as r:  # kube-scheduler's verbs: another listener, untouched
            assert r.status == 200 and b"not synced" in r.read()
    finally:
        for hog in hogs:
            hog.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_one_peers_flood_of_the_admin_port_leaves_it_answering_others_within_1s():
    """The admin port itself (metrics, /inspect): one address's 300 half-sent requests keep ADMIN_PER_PEER of its
    connections, not all 256, and Prometheus, from another address, is answered at once. (Pods enough together can
    still fill it: the probes do not depend on it.)"""
    import threading

    from extender.http.admin import create_admin_app
    from extender.http.limits import ADMIN_PER_PEER
    from extender.serve import ServeOptions, admin_listener
    from testing.fuzzkit import live

    world = live()
    admin = create_admin_app(world.extender, world.app.extensions["tessera"]["registry"])
    server = admin_listener(admin, ServeOptions("127.0.0.1", 0, admin_host="127.0.0.1", admin_port=0))
    threading.Thread(target=server.run, daemon=True).start()
    port = server.effective_port
    hogs: list[socket.socket] = []
    try:
        hogs = flood(port, peers=1)
        time.sleep(0.5)
        metrics, took = timed_get(f"http://127.0.0.1:{port}/metrics")
        print(f"admin port: /metrics {metrics} in {took:.3f} s under {FLOOD} stalled from one peer")
        assert metrics == 200 and took < 1.0, f"/metrics: {metrics} after {took:.2f} s"
        assert len(server.active_channels) <= ADMIN_PER_PEER + 1, len(server.active_channels)
        hogs[-1].settimeout(0.2)  # the flood's newest connections are the ones still open
        with pytest.raises(TimeoutError):
            hogs[-1].recv(1)
    finally:
        for h in hogs:
            h.close()
        server.close()
