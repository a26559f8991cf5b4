"""`tessera bridge`'s flags and start-up: the Ray bridge (raybridge/bridge.py), Kubernetes only.

    tessera bridge [--kubeconfig PATH] [--key-file FILE] [--metrics-listen 0.0.0.0:9500] [--namespace NS]

The namespace rule and the kubeconfig loading are the CLI's own (extender/cli/args.py, extender/cli/serve.py),
handed in by the dispatcher (extender/cli/__init__.py): the bridge reads its flags in the words `tessera serve`
reads its own, and imports nothing of the extender (tests/test_import_graph.py: of the extender, the contract only).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable


def add_bridge_command(sub, namespace_name: Callable[[str], str], load_api: Callable) -> None:
    """`namespace_name`: the --namespace flag's type; `load_api(kubeconfig)`: a configured kubernetes ApiClient."""
    bridge = sub.add_parser("bridge", help="replace lost pods of Ray jobs (Kubernetes only; each job runs its own Ray)")
    bridge.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    bridge.add_argument("--key-file", default=None,
                        help="the bridge's key (32+ bytes, a mounted Secret): the MAC on the pods it creates; default "
                             "$TESSERA_BRIDGE_KEY (the shipped Deployment's, from the optional Secret tessera-bridge-key), "
                             "else random per start, and then a restarted bridge deletes none of the pods it made before")
    bridge.add_argument("--metrics-listen", default="0.0.0.0:9500", help="HOST:PORT for /metrics (default 0.0.0.0:9500)")
    bridge.add_argument("--namespace", type=namespace_name, default=None, help="only this namespace's pods (default: all)")
    bridge.set_defaults(run=functools.partial(cmd_bridge, load_api=load_api))


def cmd_bridge(args: argparse.Namespace, load_api: Callable) -> int:
    import logging

    from .bridge import serve  # Kubernetes only: no Ray, no torch (it never runs tenant code)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kubernetes.client import CoreV1Api

    serve(CoreV1Api(load_api(args.kubeconfig)), args.metrics_listen, args.namespace, key_file=args.key_file)
    return 0
