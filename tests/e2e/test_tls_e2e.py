"""kube-scheduler 1.20.2 calling `tessera serve` over mutual TLS with the shipped scheduler config
(enableHTTPS + tlsConfig) and certificates from `tessera certs`: it binds pods, while a client
without the scheduler's certificate gets no answer from any verb, and the admin port gives it only
health and metrics."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest
import yaml

from testing.local_cluster import SHIPPED_CONFIG

from .test_kube_e2e import NS, assignment, make_node, make_pod, wait_bound

VERBS = ("filter", "prioritize", "bind", "preempt")


def _answer(port: int, context: ssl.SSLContext, verb: str) -> bytes:
    """The raw bytes a TLS client gets back for one verb call ('' when the server says nothing)."""
    body = json.dumps({"PodName": "x", "PodNamespace": NS, "PodUID": "u", "Node": "tls-0"}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"POST /tessera/{verb} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            return tls.recv(4096)


def test_the_shipped_config_is_mutual_tls():
    for ext in yaml.safe_load(SHIPPED_CONFIG.read_text())["extenders"]:
        assert ext["enableHTTPS"] is True and set(ext["tlsConfig"]) == {"certFile", "keyFile", "caFile"}


def test_the_scheduler_binds_through_mutual_tls_and_nobody_else_gets_an_answer(cluster, tmp_path):
    api, ext = cluster["api"], cluster["extender"]
    pki = ext.pki
    make_node(api, "tls-0", 2, "T4")
    deadline = time.monotonic() + 30
    while not any(n["name"] == "tls-0" for n in ext.inspect()["nodes"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    make_pod(api, "over-tls", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "250"}, models=["T4"])
    pod = wait_bound(api, "over-tls")
    assert assignment(pod)["milli"] == 250 and pod.spec.node_name == "tls-0"  # filter, prioritize, bind: all over mTLS
    assert api.read_namespaced_pod("over-tls", NS).metadata.annotations["tessera.dev/assignment-mac"]

    no_cert = ssl.create_default_context(cafile=str(pki / "ca.crt"))  # trusts the server, shows no certificate
    from extender.certs import make_certs

    other = make_certs(tmp_path / "other")  # a well-formed certificate from another CA
    rogue = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    rogue.load_cert_chain(other["scheduler.crt"], other["scheduler.key"])
    for verb in VERBS:
        for ctx in (no_cert, rogue):
            try:
                got = _answer(ext.port, ctx, verb)
            except (ssl.SSLError, ConnectionError, OSError):
                got = b""
            assert got == b"", (verb, got[:80])  # no HTTP answer at all: the handshake is refused
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # nor plain HTTP on the verbs port
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{ext.port}/tessera/{verb}", data=b"{}"),
                                   timeout=10)
    # the scheduler's own certificate still gets answers
    assert _answer(ext.port, ext.context, "filter").startswith(b"HTTP/1.1 ")
    # the admin port: health and metrics for anyone, no verbs there
    with urllib.request.urlopen(f"{ext.admin_url}/readyz", timeout=10) as r:
        assert r.status == 200
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(f"{ext.admin_url}/tessera/bind", data=b"{}"), timeout=10)
    assert e.value.code in (404, 405)
