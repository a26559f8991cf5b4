"""`tessera bridge`'s flags and start-up: the Ray bridge (raybridge/bridge.py), Kubernetes only.

    tessera bridge [--kubeconfig PATH] [--key-file FILE] [--metrics-listen 0.0.0.0:9500] [--namespace NS]

The flags are read as `tessera serve` reads its own (extender/cli/args.py, extender/cli/serve.py): the same namespace
rule and the same kubeconfig loading, in the same words. They are repeated here, not imported, so that the bridge
imports nothing of the extender (tests/test_import_graph.py: of the extender, the contract only), as the agent's
listen_address repeats `tessera serve --listen`'s reading (gpu_sharing/cli.py); tests/test_cli.py holds the two
kubeconfig readers to the same answers.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path


def add_bridge_command(sub) -> None:
    bridge = sub.add_parser("bridge", help="replace lost pods of Ray jobs (Kubernetes only; each job runs its own Ray)")
    bridge.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    bridge.add_argument("--key-file", default=None,
                        help="the bridge's key (32+ bytes, a mounted Secret): the MAC on the pods it creates; default "
                             "$TESSERA_BRIDGE_KEY (the shipped Deployment's, from the optional Secret tessera-bridge-key), "
                             "else random per start, and then a restarted bridge deletes none of the pods it made before")
    bridge.add_argument("--metrics-listen", default="0.0.0.0:9500", help="HOST:PORT for /metrics (default 0.0.0.0:9500)")
    bridge.add_argument("--namespace", type=namespace_name, default=None, help="only this namespace's pods (default: all)")
    bridge.set_defaults(run=cmd_bridge)


def cmd_bridge(args: argparse.Namespace) -> int:
    import logging

    from .bridge import serve  # Kubernetes only: no Ray, no torch (it never runs tenant code)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kubernetes.client import CoreV1Api

    serve(CoreV1Api(load_api(args.kubeconfig)), args.metrics_listen, args.namespace, key_file=args.key_file)
    return 0


def namespace_name(text: str) -> str:
    """A Kubernetes namespace name (an RFC 1123 label): a bad one was retried against the API for ever
    (extender/cli/args.py's rule)."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"{text[:70]!r} is not a Kubernetes namespace name (lower-case letters, digits "
                                         "and '-', at most 63, starting and ending with a letter or digit)")
    return text


def _file_problem(text: str) -> str | None:
    """Why `text` is not a file to read, in words, or None."""
    if Path(text).is_dir():  # "no such file" sent people looking for a path that was there
        return f"{text} is a directory, not a file"
    if not Path(text).is_file():
        return f"no such file: {text}"
    return None


def load_api(kubeconfig: str | None):
    """A configured kubernetes ApiClient: --kubeconfig, else in-cluster, else $KUBECONFIG (extender/cli/serve.py's
    load_api, word for word)."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            if (problem := _file_problem(kubeconfig)) is not None:
                raise ValueError(f"--kubeconfig: {problem}")
            config.load_kube_config(config_file=kubeconfig)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        elif os.environ.get("KUBECONFIG"):
            missing = [p for p in os.environ["KUBECONFIG"].split(os.pathsep) if p and not Path(p).is_file()]
            if missing:
                raise ValueError(f"KUBECONFIG names no such file: {', '.join(missing)}")
            config.load_kube_config()
        else:
            raise ValueError("no cluster to talk to: pass --kubeconfig, set KUBECONFIG, or run inside a pod")
    except UnicodeDecodeError:  # a binary file (a key, an image): YAML's codec error named neither flag nor file
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"KUBECONFIG={os.environ.get('KUBECONFIG', '')}"
        raise ValueError(f"{where}: not a kubeconfig (not UTF-8 text)") from None
    except (ConfigException, yaml.YAMLError) as e:  # an unreadable kubeconfig: one line, not a traceback
        raise ValueError(f"cannot use the kubeconfig: {' '.join(str(e).split())}") from None
    except (TypeError, AttributeError, KeyError):  # YAML, but not a kubeconfig's shape (a list, a string...)
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"KUBECONFIG={os.environ.get('KUBECONFIG', '')}"
        raise ValueError(f"{where}: not a kubeconfig (YAML without the clusters, users and contexts of one)") from None
    return client.ApiClient()
