"""`tessera`: the project's command line.

    tessera simulate            replay a trace through placement policies (see --help)
    tessera serve               the scheduler extender kube-scheduler calls
    tessera inspect             a running extender's summary, pending pods by cause, a pod in words (admin port)
    tessera certs               a CA and certificates for mutual TLS between kube-scheduler and the extender
    tessera agent               the node agent: publishes the node's GPUs (gpu_sharing/)
    tessera bridge              replace lost pods of Ray jobs (raybridge; each job runs its own Ray)

This module is the dispatcher: each program's flags and start-up live in its own module (simulate.py, serve.py,
inspect.py, certs.py here; gpu_sharing/cli.py, gpu_sharing/deviceplugin/cli.py and raybridge/cli.py beside the
programs they start), and the flag readers they share in args.py. Each is imported when the parser is built,
and each imports its program only when its command runs: `tessera --help` loads no simulator.
"""

from __future__ import annotations

import argparse
import sys


def installed_version() -> str:
    """The installed distribution's version (setup.cfg), or 'unknown' when run from a tree never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tessera")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera: a GPU-fragmentation-aware scheduler extender.")
    parser.add_argument("--version", action="version", version=f"tessera {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    from gpu_sharing.cli import add_agent_command  # the node side lives in its own package
    from gpu_sharing.deviceplugin.cli import add_device_plugin_command
    from raybridge.cli import add_bridge_command  # and the bridge in its own

    from .args import namespace_name
    from .certs import add_certs_command
    from .inspect import add_inspect_command
    from .serve import add_serve_command, load_api
    from .simulate import add_simulate_command

    for add in (add_simulate_command, add_serve_command, add_inspect_command, add_certs_command, add_agent_command,
                add_device_plugin_command):
        add(sub)
    add_bridge_command(sub, namespace_name, load_api)  # the bridge reads its flags with the CLI's own rules
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parser.parse_args, but an unknown option after the command is refused with that command's usage (argparse
    gave the top-level usage, which lists commands, not the options that were misspelt)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        argv = sys.argv[1:] if argv is None else argv
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        command_at = argv.index(args.command) if args.command in argv else -1
        extra_at = argv.index(extra[0]) if extra[0] in argv else len(argv)
        (commands[args.command] if extra_at > command_at else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        return args.run(args)
    except (ValueError, OSError) as e:
        print(f"tessera: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line (past a progress line on a terminal), the shell's 128 + SIGINT
        print(f"{chr(10) if sys.stderr.isatty() else ''}tessera: interrupted", file=sys.stderr)
        return 130
