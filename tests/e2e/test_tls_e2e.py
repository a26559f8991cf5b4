"""kube-scheduler 1.20.2 calling `tessera serve` over HTTPS with its own client certificate
(enableHTTPS + tlsConfig in the shipped scheduler config), as docs/admin-guide.md sets it up."""

from __future__ import annotations

import ssl
import time

from ..pki import make_pki
from .harness import LocalCluster, skip_without_control_plane
from .test_kube_e2e import NS, assignment, make_node, make_pod, wait_bound


def test_the_scheduler_binds_through_mutual_tls(tmp_path_factory):
    skip_without_control_plane()
    from kubernetes import client, config

    pki = make_pki(tmp_path_factory.mktemp("tlspki"))
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(pki / "scheduler.crt", pki / "scheduler.key")
    local = LocalCluster(
        tmp_path_factory.mktemp("tlscp"),
        tls={"certFile": str(pki / "scheduler.crt"), "keyFile": str(pki / "scheduler.key"), "caFile": str(pki / "ca.crt")},
        tls_args=("--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
                  "--client-ca", str(pki / "ca.crt")),
        client_context=ctx,
    )
    try:
        local.start()
        config.load_kube_config(config_file=str(local.work / "kubeconfig"))
        api = client.CoreV1Api()
        make_node(api, "tls-0", 2, "T4")
        deadline = time.monotonic() + 30
        while not local.extender.inspect()["nodes"] and time.monotonic() < deadline:
            time.sleep(0.2)
        make_pod(api, "over-tls", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "250"})
        pod = wait_bound(api, "over-tls")
        assert assignment(pod)["milli"] == 250 and pod.spec.node_name == "tls-0"  # filter, prioritize, bind: all over TLS
        assert api.read_namespaced_pod("over-tls", NS).metadata.annotations["tessera.dev/assignment-mac"]
    finally:
        local.stop()
