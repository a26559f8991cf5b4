"""`tessera device-plugin`'s flags and start-up: the kubelet device plugin for whole GPUs (plugin.py says what it
decides, server.py how it talks to the kubelet).

    tessera device-plugin --assignment-key-file PATH [--node-name NAME (default $NODE_NAME)] [--inventory FILE]
                          [--socket-dir /var/lib/kubelet/device-plugins] [--dev-root /dev] [--kubeconfig FILE]
                          [--pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock]

A program of its own, not a mode of the agent: it lists its node's pods through the API and holds the
assignment key, while the agent makes no API call and holds nothing.
"""

from __future__ import annotations

import argparse
import sys

from tessera_contract import GPU_RESOURCE, MILLI_RESOURCE

from ..cli import add_node_flags, listen_address, open_backend


def add_device_plugin_command(sub) -> None:
    p = sub.add_parser("device-plugin", help="the kubelet device plugin for whole GPUs: a container gets its assignment's GPUs",
                       description="Advertise this node's GPUs to the kubelet as nvidia.com/gpu and give each container "
                                   "exactly the GPUs of its pod's signed assignment (docs/gpu-sharing.md).")
    add_node_flags(p)
    p.add_argument("--assignment-key-file", required=True,
                   help="the assignment key (file) or keyring (the Secret mounted as a directory) that verifies MACs")
    p.add_argument("--socket-dir", default="/var/lib/kubelet/device-plugins", help="the kubelet's device plugin directory")
    p.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's PodResources socket, which tells which of two waiting pods of one shape the kubelet "
                        "is admitting (podresources.py), or none: then the oldest goes first and may get a younger one's GPUs")
    p.add_argument("--dev-root", default="/dev", help="where the GPUs' device nodes are on the node (nvidia0, nvidiactl, ...)")
    p.add_argument("--dev-view", help="where this process sees --dev-root (a pod mounting the node's /dev elsewhere); "
                                      "default: --dev-root itself")
    p.add_argument("--kubeconfig", help="a kubeconfig; default: the pod's in-cluster account")
    p.add_argument("--resources", default=f"{GPU_RESOURCE},{MILLI_RESOURCE}",
                   help="which to serve: whole GPUs, slices (a thousand devices per GPU), or both (the default)")
    p.add_argument("--metrics-listen", default="0.0.0.0:9401",
                   help="HOST:PORT of /metrics, or none (the plugin's work needs no port: the kubelet calls its socket)")
    p.set_defaults(run=cmd_device_plugin)


def cmd_device_plugin(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal
    import threading
    from pathlib import Path

    from tessera_contract.keyring import load_path

    from ..devices import BackendUnavailable
    from .plugin import GpuPlugin
    from .podresources import KubeletPods
    from .server import PluginServer

    if not args.node_name:
        raise ValueError("which node? pass --node-name or set NODE_NAME (the downward API's spec.nodeName)")
    metrics = None if args.metrics_listen == "none" else listen_address(args.metrics_listen)
    resources = [r.strip() for r in args.resources.split(",") if r.strip()]
    if not resources or not set(resources) <= {GPU_RESOURCE, MILLI_RESOURCE} or len(set(resources)) != len(resources):
        raise ValueError(f"--resources: {GPU_RESOURCE}, {MILLI_RESOURCE} or both, comma-separated; got {args.resources!r}")
    if not Path(args.socket_dir).is_dir():
        raise ValueError(f"--socket-dir {args.socket_dir}: no such directory (is this a kubelet's node?)")
    signer = load_path(args.assignment_key_file)
    try:
        backend = open_backend(args.inventory)
    except BackendUnavailable as e:
        print(f"tessera device-plugin: {e}", file=sys.stderr)
        return 1
    from kubernetes import client, config

    if args.kubeconfig:
        config.load_kube_config(config_file=args.kubeconfig)
    else:
        config.load_incluster_config()
    core = client.CoreV1Api()
    selector = f"spec.nodeName={args.node_name}"

    def pods() -> list[dict]:
        """The pods bound to this node: one list call, at most 5 s."""
        resp = core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False, _request_timeout=5)
        return json.loads(resp.data).get("items", [])

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kubelet_pods = None if args.pod_resources_socket == "none" else KubeletPods(Path(args.pod_resources_socket))
    if kubelet_pods is not None and not kubelet_pods.socket.exists():  # the kubelet makes it at start: maybe later
        logging.getLogger(__name__).warning("%s does not exist (yet): until it does, of two waiting pods of one shape "
                                            "the oldest gets its GPUs first", kubelet_pods.socket)
    # one plugin per resource, each its own socket and registration: whole GPUs, and slices as milli devices
    plugins = [GpuPlugin(args.node_name, backend.inventory(), signer, pods, Path(args.dev_root),
                         Path(args.dev_view) if args.dev_view else None, resource, kubelet_pods) for resource in resources]
    servers = [PluginServer(p, Path(args.socket_dir), inventory=backend.inventory) for p in plugins]
    if metrics is not None:
        serve_metrics(plugins, *metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=s.run, args=(stop,), name=s.endpoint) for s in servers]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            stop.wait(1.0)
    except KeyboardInterrupt:
        stop.set()
    finally:
        for t in threads:
            t.join()
        backend.close()
    return 0


def serve_metrics(plugins, host: str, port: int) -> None:
    """/metrics: Allocate's answers per resource (a refused one is a pod the kubelet failed) and the GPUs, by health."""
    from prometheus_client import start_http_server
    from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self):
            answers = CounterMetricFamily("tessera_device_plugin_allocations", "Allocate answers, by resource and result",
                                          labels=["node", "resource", "result"])
            for p in plugins:
                for result, n in dict(p.answers).items():
                    answers.add_metric([p.node, p.resource, result], n)
            gpus = GaugeMetricFamily("tessera_device_plugin_gpus", "GPUs listed to the kubelet, by health",
                                     labels=["node", "healthy"])
            listed = list(plugins[0].gpus.values())
            for healthy in (True, False):
                gpus.add_metric([plugins[0].node, str(healthy).lower()], sum(1 for g in listed if g.healthy == healthy))
            return [answers, gpus]

    registry = CollectorRegistry()
    registry.register(Collector())
    start_http_server(port, addr=host, registry=registry)
