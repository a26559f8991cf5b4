"""`tessera agent`'s flags and start-up: the node agent with the flags every manifest uses.

    tessera agent [--node-name NAME (default $NODE_NAME)] [--inventory FILE]
                  [--metrics-listen 0.0.0.0:9400] [--interval SECONDS]

The agent makes no Kubernetes API call: it serves GET /report and /metrics on --metrics-listen
and the extender pulls the report (gpu_sharing/agent.py says why).
"""

from __future__ import annotations

import argparse
import os
import sys

# --interval's range. Each tick asks NVML (or stats the file) for every GPU and its processes and reads their
# cgroups: well below a tenth of a second the agent spins a core for figures NVML itself averages over 1/6 to
# 1 s, and the extender pulls them every 10 s by default. A sample older than a day says nothing of the node,
# and an interval like 1e10 s overflows threading.Event.wait (a traceback after the first tick).
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 86400.0


def add_node_flags(parser) -> None:
    """--node-name and --inventory: which node, and where its GPUs are read (the agent's and the device plugin's)."""
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""), help="this node (default: $NODE_NAME)")
    parser.add_argument("--inventory", help="static backend: read the GPUs from this JSON/YAML file instead of NVML")


def add_agent_command(sub) -> None:
    agent = sub.add_parser("agent", help="the node agent: report this node's GPUs (NVML or a static file)",
                           description="Discover the node's GPUs through NVML (or --inventory FILE) and serve them at "
                                       "GET /report for the extender to pull, with Prometheus metrics at /metrics.")
    add_node_flags(agent)
    agent.add_argument("--metrics-listen", default="0.0.0.0:9400", help="HOST:PORT of /report and /metrics")
    agent.add_argument("--interval", type=float, default=10.0,
                       help=f"seconds between samples, {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} (default 10)")
    agent.set_defaults(run=cmd_agent)


def listen_address(text: str, flag: str = "--metrics-listen") -> tuple[str, int]:
    """HOST:PORT ([::1]:9400 for IPv6) as (host, port); ValueError in words otherwise.

    The same reading as `tessera serve --listen`; here so that the agent imports nothing of the extender.
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} wants HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def open_backend(inventory: str | None):
    from .devices import BackendUnavailable

    if inventory:
        from .static import StaticBackend

        return StaticBackend(inventory)
    from .nvml import NvmlBackend

    try:
        return NvmlBackend()
    except BackendUnavailable as e:
        raise BackendUnavailable(f"no GPU driver: {e}; start with --inventory FILE for a node without NVML") from None


def cmd_agent(args: argparse.Namespace) -> int:
    import logging
    import threading

    from .agent import Agent, make_server
    from .devices import BackendUnavailable
    from .metrics import AgentCollector

    if not MIN_INTERVAL_S <= args.interval <= MAX_INTERVAL_S:  # NaN fails this too
        raise ValueError(f"--interval must be {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds, got {args.interval}")
    if not args.node_name:
        raise ValueError("which node? pass --node-name or set NODE_NAME (the downward API's spec.nodeName)")
    host, port = listen_address(args.metrics_listen)  # the extender pulls /report here: there is no 'none'
    try:
        backend = open_backend(args.inventory)
    except BackendUnavailable as e:
        print(f"tessera agent: {e}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = Agent(backend, args.node_name, AgentCollector(args.node_name))
    server = make_server(agent, host, port)
    threading.Thread(target=server.serve_forever, daemon=True, name="http").start()
    logging.getLogger("tessera").info("agent for node %s: backend %s, %d GPUs, every %g s; report at http://%s:%d/report",
                                      args.node_name, backend.name, len(backend.inventory()), args.interval, host, port)
    stop = threading.Event()
    try:
        agent.run(args.interval, stop)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        backend.close()
    return 0

