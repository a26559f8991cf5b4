"""`tessera`: the project's command line.

    tessera simulate            replay a trace through placement policies (see --help)
    tessera serve               the scheduler extender kube-scheduler calls
    tessera inspect             a running extender's summary, pending pods by cause, a pod in words (admin port)
    tessera certs               a CA and certificates for mutual TLS between kube-scheduler and the extender
    tessera agent               the node agent: publishes the node's GPUs (gpu_sharing/)
    tessera bridge              replace lost pods of Ray jobs (raybridge; each job runs its own Ray)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `tessera --help` loads no simulator
    from .core.backfill import BackfillSettings

DEFAULT_TIME_LOADS = "0.7,0.8,0.9,1.0,1.1,1.2"


MAX_SEEDS = 1000  # each seed is a whole replay (seconds to minutes): more is a typo, not a plan


def seeds_arg(text: str) -> list[int]:
    """`42`, `42-51`, `1,5,9`: each seed once, in order; a reversed or open range, a repeat, or more than
    MAX_SEEDS seeds is refused (`42,5-1` ran seed 42 alone, `42,42` reported two seeds of one run)."""
    seeds: list[int] = []
    usage = f"seeds look like 42, 42-51 or 1,5,9; got {text[:60]!r}"
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(usage) from None
        if last < first:
            raise argparse.ArgumentTypeError(f"seed range {part.strip()} runs backwards; write {last}-{first}")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"more than {MAX_SEEDS} seeds in {text[:60]!r}")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"seed {repeated[0]} given twice in {text[:60]!r}")
    return seeds


def names_arg(kind: str, known):
    def parse(text: str) -> list[str]:
        names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            what = ", ".join(unknown) or repr(text)
            raise argparse.ArgumentTypeError(f"unknown {kind} {what}; known: {', '.join(known)}")
        repeated = [n for i, n in enumerate(names) if n in names[:i]]
        if repeated:  # `fgd,fgd` ran fgd twice and reported its runs as extra seeds
            raise argparse.ArgumentTypeError(f"{kind} {repeated[0]} given twice in {text[:60]!r}")
        return names

    return parse


def loads_arg(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"loads look like 0.9 or 0.7,0.9,1.1; got {text!r}") from None
    if not all(0 < x < math.inf for x in loads):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"loads must be positive numbers; got {text}")
    repeated = [x for i, x in enumerate(loads) if x in loads[:i]]
    if repeated:  # `0.9,0.9` ran each replay twice and reported it as two seeds
        raise argparse.ArgumentTypeError(f"load {repeated[0]:g} given twice in {text[:60]!r}")
    return loads


def share_arg(text: str) -> float:
    """A share of pods, 0..1 (argparse's words when it is not one)."""
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a share is a number from 0 to 1, such as 0.3; got {text!r}") from None
    if not 0 <= share <= 1:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"a share is from 0 to 1 (0.3 is 30% of pods); got {text}")
    return share


def number_arg(kind: type, least: float, most: float = math.inf):
    """An int or float flag of at least `least` (and at most `most`), finite (argparse prefixes the flag's name to
    the error): a worker count of 0 or a lease of 0 s would otherwise be taken silently, or spin, or fail later in a
    traceback."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
        if not least <= value < math.inf:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"must be at least {least:g}; got {text}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}; got {text}")
        return value

    return parse


def pod_key_arg(text: str) -> str:
    """namespace/name, both parts given (`--pod ''` printed the summary, `--pod name` asked for a pod in no namespace)."""
    namespace, slash, name = text.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise argparse.ArgumentTypeError(f"a pod is namespace/name, e.g. ml/train-0; got {text[:80]!r}")
    return text


def nonempty_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def file_problem(text: str) -> str | None:
    """Why `text` is not a file to read, in words, or None."""
    if Path(text).is_dir():  # "no such file" sent people looking for a path that was there
        return f"{text} is a directory, not a file"
    if not Path(text).is_file():
        return f"no such file: {text}"
    return None


def existing_file(text: str) -> str:
    if (problem := file_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def csv_file(text: str) -> str:
    """An existing file with something in it: an empty CSV was refused for its "missing columns"."""
    existing_file(text)
    try:
        empty_csv(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def empty_csv(path: str) -> None:
    """ValueError when a CSV file holds nothing but white space (bench/openb.py asks too, through check_packable)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip() and len(head) < 1 << 16:
        raise ValueError(f"{path} is empty (a CSV starts with its header row)")


def namespace_name(text: str) -> str:
    """A Kubernetes namespace name (an RFC 1123 label): a bad one was retried against the API for ever."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"{text[:70]!r} is not a Kubernetes namespace name (lower-case letters, digits "
                                         "and '-', at most 63, starting and ending with a letter or digit)")
    return text


def existing_path(text: str) -> str:
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"no such file or directory: {text}")
    return text



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

    for add in (add_simulate_command, add_serve_command, add_inspect_command, add_certs_command, add_agent_command,
                add_device_plugin_command, add_bridge_command):
        add(sub)
    return parser


def add_simulate_command(sub) -> None:
    from .core.policy import policy_names
    from .sim.kubequeue import QUEUES
    from .sim.schedulers import DEFAULT_EXTENDER_WEIGHT, EXTENDER_SEES, SCHEDULERS
    from .sim.timemode import DEFAULT_NODES

    sim = sub.add_parser(
        "simulate",
        help="replay a trace through placement policies",
        description="Replay a trace (openb CSV format) through placement policies. With no arguments: "
        "packing mode on the embedded openb-like workload, every policy, ideal and kube schedulers.",
    )
    sim.add_argument("--mode", choices=("packing", "time"), default="packing")
    sim.add_argument("--trace", type=csv_file, action="append", help="pod list CSV (openb format); repeatable")
    sim.add_argument("--nodes", type=csv_file, help="node list CSV (openb format); default: the embedded cluster")
    sim.add_argument("--policy", type=names_arg("policy", policy_names()), default=None, help="a,b,c or all (default)")
    sim.add_argument("--scheduler", type=names_arg("scheduler", SCHEDULERS), default=None,
                     help="ideal (the paper's), kube (kube-scheduler's scoring) or ideal,kube (default)")
    sim.add_argument("--seeds", type=seeds_arg, default=None, help="42-51 (default for traces); 42-43 for the embedded run")
    sim.add_argument("--load", type=loads_arg, default=None,
                     help=f"time mode: offered GPU load(s), default {DEFAULT_TIME_LOADS}")
    sim.add_argument("--cluster-nodes", type=number_arg(int, 1), default=None,
                     help=f"time mode only: nodes sampled from the node list (default {DEFAULT_NODES}); packing mode "
                          "replays on the whole node list and refuses it")
    sim.add_argument("--queue", choices=tuple(QUEUES), default=None,
                     help="time mode: kube-scheduler 1.20's queue with its backoff and 60 s flush (default), or "
                          "events-only (every waiting pod retried in arrival order when a pod leaves, no timers)")
    _add_reservation_flags(sim)  # time mode: run times are the trace's, so every pod's end is known
    sim.add_argument("--movable-share", type=share_arg, default=0.0, metavar="F",
                     help="the share of GPU pods that may be moved to place a pod that fits nowhere (packing mode: "
                          "ideal scheduler only; time mode: whole-GPU pods ask, as the server's --moves does; "
                          "docs/defragmentation.md); default 0: no moves")
    sim.add_argument("--weight", type=number_arg(int, 1), default=None,
                     help=f"kube: the extender's configured weight (at least 1; default {DEFAULT_EXTENDER_WEIGHT})")
    sim.add_argument("--extender-sees", choices=EXTENDER_SEES, default=None,
                     help="kube: which pods kube-scheduler sends to the extender: all (the shipped config) or gpu "
                          "(managedResources lists the GPU resources, so CPU-only pods are placed by kube alone)")
    sim.add_argument("--workers", type=number_arg(int, 1), default=None, help="processes (default: one per core)")
    sim.add_argument("--json", action="store_true", help="one JSON object per line instead of tables (no plot unless --plot)")
    sim.add_argument("--plot", type=Path, default=None,
                     help="PNG path (default: tessera-<mode>.png, none with --json; 'none' to skip)")
    sim.set_defaults(run=cmd_simulate)


def add_serve_command(sub) -> None:
    from .core.policy import policy_names
    from .http.limits import MAX_BODY_BYTES

    serve = sub.add_parser("serve", help="run the scheduler extender (HTTP) against a cluster")
    serve.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    serve.add_argument("--listen", default="127.0.0.1:8888",
                       help="HOST:PORT of the verbs (default 127.0.0.1:8888, beside kube-scheduler): any other HOST "
                            "needs mutual TLS (--tls-cert, --tls-key, --client-ca) or --insecure-listen")
    serve.add_argument("--admin-listen", default="0.0.0.0:8889",
                       help="HOST:PORT of healthz, readyz, metrics, inspect (plain HTTP; default 0.0.0.0:8889)")
    serve.add_argument("--probe-listen", default=None,
                       help="HOST:PORT of a listener answering only /healthz and /readyz, on its own thread, with "
                            "per-peer caps, for the kubelet's probes (the shipped Deployments: 0.0.0.0:8890): a "
                            "flood of the admin port's connections then cannot fail them (default: none, the "
                            "probes use the admin port)")
    serve.add_argument("--insecure-listen", action="store_true",
                       help="allow the verbs without client certificates on a non-loopback address: anyone who "
                            "reaches the port can then bind pods and hold GPUs")
    serve.add_argument("--inspect-from-anywhere", action="store_true",
                       help="answer /inspect (every tenant's pods) off loopback too; default: kubectl port-forward only")
    serve.add_argument("--max-body-bytes", type=int, default=None,
                       help=f"largest request body the verbs accept (default {MAX_BODY_BYTES}, sized for 5,000 nodes: "
                            "extender/http/limits.py)")
    serve.add_argument("--prefix", default="/tessera",
                       help="URL prefix of the verbs (the config's urlPrefix path; default /tessera)")
    serve.add_argument("--policy", choices=policy_names(), default="tessera", help="placement policy (default tessera)")
    serve.add_argument("--preemption", choices=("tessera", "scheduler", "off"), default="tessera",
                       help="who evicts lower-priority pods for a waiting GPU pod: tessera (default; kube-scheduler "
                            "1.20.2 never calls the preempt verb, so Tessera deletes the fewest victims itself), "
                            "scheduler (a kube-scheduler with the fix, 1.21+ or 1.20.9+, calls the verb and deletes), "
                            "or off; docs/wire-protocol.md section 7")
    serve.add_argument("--scheduler-name", action="append", default=None, metavar="NAME", dest="scheduler_names",
                       help="a kube-scheduler profile (schedulerName) Tessera serves; repeatable. Lower-priority pods "
                            "are evicted or moved only for pods of these names (a pod of any other name is placed by "
                            "another scheduler, or by none). Default: default-scheduler, the one profile of "
                            "manifests/scheduler; manifests/second-scheduler gives tessera-scheduler, since there the "
                            "cluster's own scheduler keeps default-scheduler's pods")
    serve.add_argument("--moves", choices=("on", "off"), default="off",
                       help="move trainers of elastic Ray jobs that opted in (tessera.dev/movable) off a node so "
                            "that a GPU pod that fits nowhere fits there; their jobs shrink and regrow "
                            "(docs/defragmentation.md); tried before any preemption")
    serve.add_argument("--move-interval", default=None,
                       help="least time between two moves of one job (default 5m; with --moves on)")
    serve.add_argument("--threads", type=number_arg(int, 2), default=64,
                       help="WSGI worker threads: kube-scheduler's binds overlap each other and the next pod's filter "
                            "(default 64; at least 2)")
    _add_lease_flags(serve)
    _add_key_flags(serve)
    serve.add_argument("--agent-interval", type=number_arg(float, 0), default=10.0,
                       help="seconds between pulls of the node agents' GPU reports (default 10; 0: do not pull)")
    _add_tls_flags(serve)
    _add_reservation_flags(serve)
    serve.set_defaults(run=cmd_serve)


def _add_reservation_flags(serve: argparse.ArgumentParser) -> None:
    """Reservations with backfill (extender/queue_reservations.py, core/backfill.py): the settings time mode measured."""
    serve.add_argument("--reservations", choices=("on", "off"), default="off",
                       help="a pod that waited past its class's bound reserves the node its running pods free soonest "
                            "(by their tessera.dev/expected-runtime); others take that node only beside it or if they "
                            "declare a run that ends first. Default off: in time mode (100 openb nodes, seed load 1.33) "
                            "the 8-GPU mean wait fell but the mean over all pods rose (core/backfill.py)")
    serve.add_argument("--reservation-wait", action="append", default=None, metavar="GPUS=DURATION",
                       help="pods asking GPUS whole GPUs reserve after waiting DURATION (90m, 2h, 1800s); repeatable; "
                            "default 8=30m; a GPU count not named never reserves")
    serve.add_argument("--reservation-max-share", type=float, default=None,
                       help="the most GPU capacity all reservations may wait for together, 0..1 (default 0.1)")
    serve.add_argument("--reservation-grace", default=None,
                       help="a reservation ends this long after its expected start if the pod has not been placed "
                            "(default 10m)")
    serve.add_argument("--drain-pool", type=number_arg(int, 0), default=None, metavar="NODES",
                       help="keep this many nodes able to hold the largest reserving class drainable: they take only "
                            "pods whose run ends within --drain-pool-run, or pods of a reserving class (default 0: off; "
                            "core/backfill.py has the measured trade-off)")
    serve.add_argument("--drain-keep", type=number_arg(int, 0), default=None, metavar="NODES",
                       help="a floating drain pool instead: for each kind of node big enough for the largest reserving "
                            "class, keep this many of its clean nodes (every other pod there ending within --drain-pool-run) "
                            "from longer runs that do not need that kind (default 0: off; not with --drain-pool; "
                            "core/backfill.py has the measured trade-off)")
    serve.add_argument("--drain-pool-run", default=None,
                       help="the longest run a drain-pool node takes from other pods (default 1h)")
    serve.add_argument("--short-first", choices=("on", "off"), default="off",
                       help="shortest runs first: while more than --short-first-waiting GPU pods whose "
                            "spec.activeDeadlineSeconds is at most --short-first-run wait, GPU pods of longer or "
                            "undeclared runs are kept off the nodes where one of them fits, each for at most "
                            "--short-first-hold "
                            "(core/short_first.py has the measured trade-off; default off)")
    serve.add_argument("--short-first-waiting", type=number_arg(int, 0), default=None, metavar="PODS",
                       help="short GPU pods waiting above which longer runs are held (default 20)")
    serve.add_argument("--short-first-run", default=None, metavar="DURATION",
                       help="the longest run that counts as short (default 1h)")
    serve.add_argument("--short-first-hold", default=None, metavar="DURATION",
                       help="the longest a pod is held; a short pod waiting longer no longer counts (default 2h)")


def short_first_settings(args: argparse.Namespace):
    """ShortFirstSettings from the flags, None with --short-first off; ValueError in words."""
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    from .core.short_first import ShortFirstSettings

    shapers = {"--short-first-waiting": args.short_first_waiting, "--short-first-run": args.short_first_run,
               "--short-first-hold": args.short_first_hold}
    if args.short_first != "on":
        given = [flag for flag, value in shapers.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} shortest runs first, which is "
                             "off: add --short-first on")
        return None
    run = duration_s(args.short_first_run or "1h", "--short-first-run", 1, MAX_EXPECTED_RUNTIME_S)
    hold = duration_s(args.short_first_hold or "2h", "--short-first-hold", 1, MAX_EXPECTED_RUNTIME_S)
    waiting = 20 if args.short_first_waiting is None else args.short_first_waiting
    return ShortFirstSettings(waiting=waiting, run_s=float(run), max_hold_s=float(hold))


def move_interval(raw: str) -> float:
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    return float(duration_s(raw, "--move-interval", 0, MAX_EXPECTED_RUNTIME_S))


def backfill_settings(args: argparse.Namespace):
    """BackfillSettings from the serve flags, None with --reservations off; ValueError in words."""
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    from .core.backfill import BackfillSettings

    if args.reservations != "on":
        given = [flag for flag, value in _RESERVATION_SHAPERS.items() if getattr(args, value) not in (None, [])]
        if given:
            raise ValueError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} reservations, which are off: "
                             "add --reservations on")
        return None
    if args.drain_pool and args.drain_keep:  # BackfillSettings' words named its field (drain_keep), not the flags
        raise ValueError("--drain-pool and --drain-keep exclude each other (a fixed drain pool or a floating one): "
                         "choose one")
    share = 0.1 if args.reservation_max_share is None else args.reservation_max_share
    if not 0 <= share <= 1:  # NaN fails this too
        raise ValueError(f"--reservation-max-share is a share of GPU capacity, 0..1; got {share}")
    bounds = {}
    for item in args.reservation_wait or ["8=30m"]:
        gpus, _, wait = item.partition("=")
        if not gpus.isascii() or not gpus.isdigit() or not 1 <= int(gpus) <= 256:
            raise ValueError(f"--reservation-wait {item[:40]!r}: expected GPUS=DURATION, GPUS 1..256 (e.g. 8=30m)")
        bounds[int(gpus)] = float(duration_s(wait, f"--reservation-wait {gpus}", 0, MAX_EXPECTED_RUNTIME_S))
    grace = duration_s(args.reservation_grace or "10m", "--reservation-grace", 0, MAX_EXPECTED_RUNTIME_S)
    pool_run = duration_s(args.drain_pool_run or "1h", "--drain-pool-run", 0, MAX_EXPECTED_RUNTIME_S)
    return BackfillSettings(wait_bound_s=bounds, grace_s=float(grace), max_share=share, drain_pool=args.drain_pool or 0,
                            drain_keep=args.drain_keep or 0, drain_pool_run_s=float(pool_run))


# The flags that shape reservations (their argparse dest): given with --reservations off they would do nothing.
_RESERVATION_SHAPERS = {
    "--reservation-wait": "reservation_wait", "--reservation-max-share": "reservation_max_share",
    "--reservation-grace": "reservation_grace", "--drain-pool": "drain_pool", "--drain-keep": "drain_keep",
    "--drain-pool-run": "drain_pool_run",
}


def _add_lease_flags(serve: argparse.ArgumentParser) -> None:
    """Who binds when several replicas run: kube/lease.py."""
    serve.add_argument("--leader-elect", action="store_true",
                       help="several replicas: only the holder of a coordination.k8s.io Lease binds; the others forward binds")
    serve.add_argument("--lease-name", default=None, help="with --leader-elect (default tessera-extender)")
    serve.add_argument("--lease-namespace", type=namespace_name, default=None,
                       help="default: $POD_NAMESPACE, else tessera-system")
    # whole seconds: the Lease's leaseDurationSeconds is an integer, and a follower waits what the Lease says (1.9 was
    # written as 1, so a follower could take over while the holder still bound until its 1.27 s renew deadline)
    serve.add_argument("--lease-duration", type=number_arg(int, 1, 3600), default=None,
                       help="with --leader-elect: whole seconds, 1..3600 (default 15; renew deadline 2/3 of it)")
    serve.add_argument("--advertise-url", default=None,
                       help="with --leader-elect: URL written on the Lease for people to read (never dialled: "
                            "followers forward binds "
                            "to the holder pod's IP); default: $POD_IP, this port and prefix")


def _add_key_flags(serve: argparse.ArgumentParser) -> None:
    """The keys that sign bind annotations (docs/assignment-key.md)."""
    serve.add_argument("--assignment-key-secret", default="",
                       help="Secret (in the lease namespace) holding the keys that sign bind annotations, created by the "
                            "install (docs/admin-guide.md); only read: while it is missing, serve waits, not ready")
    serve.add_argument("--assignment-key-file", type=existing_path,
                       help="key (>= 16 bytes) that signs bind annotations, or a directory of key-<label> files (a mounted "
                            "Secret: the newest signs, all verify); only signed ones count")
    serve.add_argument("--accept-unknown-keys", action="store_true",
                       help="start even when running pods' MACs name keys this extender lacks (their GPUs then count "
                            "as free); without it such a start exits: docs/assignment-key.md")


def _add_tls_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", help="its private key (PEM)")
    serve.add_argument("--client-ca",
                       help="require client certificates signed by this CA (PEM); followers also check the "
                            "holder's server certificate against it when forwarding binds")
    serve.add_argument("--tls-server-name", default=None,
                       help="with --leader-elect: DNS name in the replicas' server certificate that a follower checks "
                            "when forwarding a bind (default tessera-extender.NAMESPACE.svc)")


def add_inspect_command(sub) -> None:
    insp = sub.add_parser("inspect", help="a summary with pending pods by cause; a pod or a node in words")
    insp.add_argument("--url", default="http://127.0.0.1:8889",
                      help="the extender's admin URL (default http://127.0.0.1:8889: after "
                           "`kubectl -n tessera-system port-forward deploy/tessera-extender 8889`, in either "
                           "install mode)")
    what = insp.add_mutually_exclusive_group()  # one answer per call: `--pod a/b --node x` silently showed the pod
    what.add_argument("--pod", type=pod_key_arg, help="namespace/name of a pod: what Tessera knows of it, in words")
    what.add_argument("--node", type=nonempty_arg, help="one node's GPUs and who holds them")
    what.add_argument("--full", action="store_true", help="every node and GPU with its holders (long on a big cluster)")
    insp.add_argument("--per-node", action="store_true", help="with --pod: the reason on each node, not counted by reason")
    insp.add_argument("--json", action="store_true", help="the answer as JSON, as /inspect serves it")
    insp.set_defaults(run=cmd_inspect)


def add_certs_command(sub) -> None:
    certs = sub.add_parser("certs", help="make a CA, the extender's server certificate and kube-scheduler's client one",
                           description="Make the certificates mutual TLS needs (openssl): ca.crt/key, server.crt/key "
                           "(the extender Service's DNS names, 127.0.0.1, ::1, and any --dns/--ip), scheduler.crt/key "
                           "(kube-scheduler's client certificate). Prints how to load them.")
    certs.add_argument("--out", type=Path, required=True,
                       help="a directory, made if missing; a CA or certificate already there is never overwritten")
    certs.add_argument("--dns", action="append", default=[], help="another DNS name for the server certificate; repeatable")
    certs.add_argument("--ip", action="append", default=[], help="another IP address for the server certificate; repeatable")
    certs.add_argument("--days", type=int, default=365, help="validity (default 365)")
    certs.add_argument("--namespace", type=namespace_name, default="tessera-system",
                       help="the extender's namespace (its Service DNS names; default tessera-system)")
    certs.set_defaults(run=cmd_certs)


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


def host_port(text: str, flag: str = "--listen") -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} wants HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def load_api(kubeconfig: str | None):
    """A configured kubernetes ApiClient: --kubeconfig, else in-cluster, else $KUBECONFIG."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            if (problem := file_problem(kubeconfig)) is not None:
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


# Flags that shape one mode (their argparse dest): given without it they would do nothing, so they are refused.
_MODE_SHAPERS = {
    "--leader-elect": {"--lease-name": "lease_name", "--lease-duration": "lease_duration",
                       "--advertise-url": "advertise_url", "--tls-server-name": "tls_server_name"},
    "--moves on": {"--move-interval": "move_interval"},
}


def _check_serve_flags(args: argparse.Namespace) -> None:
    """Refuse in words, before anything connects: a flag of a mode that is off, a prefix without its slash, and TLS
    files that are not PEM of the kind named (a kubeconfig passed as --tls-cert failed after the API was contacted,
    as "[SSL] PEM lib" without naming the file)."""
    on = {"--leader-elect": args.leader_elect, "--moves on": args.moves == "on"}
    for mode, flags in _MODE_SHAPERS.items():
        given = [flag for flag, dest in flags.items() if getattr(args, dest) is not None]
        if given and not on[mode]:
            raise ValueError(f"{given[0]} applies with {mode} only: without it the flag would do nothing")
    if not args.prefix.startswith("/") or args.prefix.rstrip("/") != args.prefix:
        raise ValueError(f"--prefix is a URL path like /tessera (a leading slash, no trailing one); got {args.prefix!r}")
    if args.tls_cert:
        import re
        import ssl

        pem = {"--tls-cert": (args.tls_cert, "CERTIFICATE"), "--client-ca": (args.client_ca, "CERTIFICATE"),
               "--tls-key": (args.tls_key, "[A-Z ]*PRIVATE KEY")}
        for flag, (path, kind) in pem.items():
            if not path:
                continue
            with open(path, "rb") as f:
                head = f.read(1 << 20).decode("ascii", errors="replace")
            if not re.search(f"-----BEGIN {kind}-----", head):
                raise ValueError(f"{flag} {path}: not a PEM {'private key' if 'KEY' in kind else 'certificate'}")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.tls_cert, args.tls_key)
        except ssl.SSLError as e:
            raise ValueError(f"--tls-cert {args.tls_cert} and --tls-key {args.tls_key} do not load as a pair: "
                             f"{e.reason or e}") from None


def served_scheduler_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The schedulerNames `tessera serve` acts for: --scheduler-name as given, else default-scheduler, the one profile
    manifests/scheduler/*.yaml give the cluster's kube-scheduler. Second-scheduler mode's extender Deployment says
    --scheduler-name tessera-scheduler: there the cluster's own scheduler keeps default-scheduler's pods, for which
    Tessera must not evict."""
    if args.scheduler_names:
        return tuple(dict.fromkeys(args.scheduler_names))
    return ("default-scheduler",)


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from .serve import ServeOptions, Tls, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bool(args.tls_cert) != bool(args.tls_key) or (args.client_ca and not args.tls_cert):
        raise ValueError("--tls-cert and --tls-key go together, and --client-ca needs them")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--client-ca", args.client_ca)):
        if path and (problem := file_problem(path)) is not None:  # here, not by the parser: manifests name in-pod paths
            raise ValueError(f"{flag}: {problem}")
    _check_serve_flags(args)
    from .http.limits import MAX_BODY_BYTES

    host, port = host_port(args.listen)
    admin_host, admin_port = host_port(args.admin_listen, "--admin-listen")
    probe_host, probe_port = host_port(args.probe_listen, "--probe-listen") if args.probe_listen else ("", 0)
    opts = ServeOptions(
        host=host, port=port, prefix=args.prefix, policy=args.policy, threads=args.threads, preemption=args.preemption,
        tls=Tls(args.tls_cert, args.tls_key, args.client_ca or "", args.tls_server_name or "") if args.tls_cert else None,
        admin_host=admin_host, admin_port=admin_port, probe_host=probe_host, probe_port=probe_port,
        insecure_listen=args.insecure_listen,
        inspect_from_anywhere=args.inspect_from_anywhere,
        max_body_bytes=MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name or "tessera-extender", lease_namespace=args.lease_namespace or "",
        lease_duration_s=float(args.lease_duration or 15), advertise_url=args.advertise_url or "",
        assignment_key_file=args.assignment_key_file or "", assignment_key_secret=args.assignment_key_secret,
        agent_interval_s=args.agent_interval,
        accept_unknown_keys=args.accept_unknown_keys, backfill=backfill_settings(args),
        short_first=short_first_settings(args),
        moves=args.moves == "on", move_interval_s=move_interval(args.move_interval or "5m"),
        scheduler_names=served_scheduler_names(args),
    )
    opts.check()  # before any API call: a listener anyone could call is refused at once
    serve(opts, load_api(args.kubeconfig))
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from .certs import make_certs, next_steps

    make_certs(args.out, dns=args.dns, ips=args.ip, days=args.days, namespace=args.namespace)
    print(next_steps(args.out, args.namespace))
    return 0


def cmd_bridge(args: argparse.Namespace) -> int:
    import logging

    from raybridge.bridge import serve  # Kubernetes only: no Ray, no torch (it never runs tenant code)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kubernetes.client import CoreV1Api

    serve(CoreV1Api(load_api(args.kubeconfig)), args.metrics_listen, args.namespace, key_file=args.key_file)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.parse
    import urllib.request

    if args.per_node and not args.pod:
        raise ValueError("--per-node shows one pod's reason on each node: give --pod NAMESPACE/NAME")

    query = (f"?pod={urllib.parse.quote(args.pod)}" if args.pod else "?node=" + urllib.parse.quote(args.node) if args.node
             else "" if args.full or args.json else "?summary=1")
    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        raise ValueError(f"--url wants the admin port's http:// or https:// address, got {args.url!r}")
    url = args.url.rstrip("/") + "/inspect" + query
    not_tessera = f"tessera inspect: {url} did not answer as Tessera's /inspect does: is it the admin port of tessera serve?"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            error = json.loads(e.read() or b"{}").get("error")
        except (ValueError, AttributeError):  # not Tessera's JSON error: some other server, or a proxy's page
            error = None
        print(f"tessera inspect: {error or f'{url}: HTTP {e.code} {e.reason}'}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as e:
        print(f"tessera inspect: cannot reach {url}: {e}", file=sys.stderr)
        return 1
    except ValueError:  # answered, but not JSON
        print(not_tessera, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=1))
        return 0
    body = _printable(body)
    try:
        print(render_inspect(body, per_node=args.per_node) if args.pod else render_inspect(body))
    except (KeyError, TypeError, AttributeError, ValueError):  # JSON of another shape
        print(not_tessera, file=sys.stderr)
        return 1
    return 0


def _printable(value):
    """Every string of an /inspect answer with control characters escaped before it reaches a terminal: names and
    reasons come from tenants and nodes, and an ESC sequence or a newline there would act on the admin's screen."""
    if isinstance(value, str):
        return value if value.isprintable() else value.encode("unicode_escape").decode("ascii")
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    return value


def render_summary(body: dict, limit: int = 10) -> str:
    """`tessera inspect`'s default: the page's summary line and pending pods grouped by cause."""
    models = ", ".join(f"{m}: {v['whole_free']} of {v['gpus']} GPUs free ({v['free_milli']} milli)"
                       for m, v in sorted(body["models"].items())) or "no GPUs"
    lines = [f"policy {body['policy']}{'' if body['synced'] else ' (NOT SYNCED)'}, {body['node_count']} nodes; {models}",
             f"fragmentation {100 * body['fragmentation']:.1f}% of free GPU capacity is on partly used GPUs; "
             f"{body['reservations']} binds awaiting confirmation; {body['pending']} pods pending, "
             f"{body['waiting_gangs']} gangs waiting"]
    extra = [f"{body[k]} {words}" for k, words in (("unhealthy_gpus", "unhealthy GPUs"), ("bad_objects", "objects set aside"),
                                                    ("not_counted", "assignments not counted"), ("forged", "forged assignments"))
             if body.get(k)]
    if extra:
        lines.append("; ".join(extra) + " (tessera inspect --full)")
    for r in body.get("queue_reservations", ()):  # reservations with backfill (extender/queue_reservations.py)
        waits = ", ".join(w["pod"] for w in r["waits_for"]) + (f" and {r['waits_for_more']} more" if r["waits_for_more"] else "")
        lines.append(f"node {r['node']} reserved for {r['pod']} ({r['gpus']} GPUs) from {r['expected_start']} until "
                     f"{r['expires']}" + (f", when {waits} should end" if waits else ""))
    if body["pending"] > body["pending_explained"]:
        lines.append(f"(reasons worked out for the first {body['pending_explained']} pending pods)")
    for group in body["causes"]:
        lines.append(f"{group['cause']}: {len(group['pods'])} pods")
        for p in group["pods"][:limit]:
            lines.append(f"  {p['pod']}: {p['why']} (asks {p['request']})")
        if len(group["pods"]) > limit:
            lines.append(f"  ... and {len(group['pods']) - limit} more")
    return "\n".join(lines)


def render_inspect(body: dict, per_node: bool = False) -> str:
    if "causes" in body:
        return render_summary(body)
    if "status" in body:  # one pod, in words
        lines = [f"pod {body['pod']}: {body['status']}: {body['why']}"]
        if body.get("request"):
            lines.append(f"  asks {body['request']}")
        lines += [f"  note: {n}" for n in body.get("notes", ())]
        reasons = body.get("nodes") or {}
        if reasons and not per_node:
            counts: dict[str, int] = {}
            for reason in reasons.values():
                counts[reason] = counts.get(reason, 0) + 1
            lines += [f"  {n:>5} nodes: {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])]
        else:
            lines += [f"  {node:<28} {reason}" for node, reason in sorted(reasons.items())]
        return "\n".join(lines)
    if "gpus" in body and "name" in body:  # one node
        body = {"policy": "-", "synced": True, "nodes": [body], "reservations": 0}
    lines = [f"policy {body['policy']}, synced {body['synced']}, {len(body['nodes'])} nodes, "
             f"{body['reservations']} binds awaiting confirmation"]
    for n in body["nodes"]:
        lines.append(f"{n['name']} ({n['model'] or 'no GPU'}), cpu free {n['cpu_free_milli']}m")
        for g in n["gpus"]:
            holders = ", ".join(f"{h['pod']}={h['milli']}" for h in g["holders"]) or "-"
            extra = "" if g.get("healthy", True) else "  UNHEALTHY"
            extra += f"  out-of-band {g['oob_memory_mib']} MiB" if g.get("oob_memory_mib") else ""
            lines.append(f"  GPU {g['index']}: free {g['free_milli']:>4}  {holders}{extra}")
    for bad in body.get("unhealthy_gpus") or []:
        lines.append(f"unhealthy: {bad['node']} GPU {bad['gpu']} {bad['uuid']}: pods to move: {', '.join(bad['pods']) or 'none'}")
    for uid, why in (body.get("not_counted") or {}).items():
        lines.append(f"not counted: {uid}: {why}")
    for pod, why in (body.get("forged") or {}).items():
        lines.append(f"forged: {pod}: {why}")
    for bad in body.get("bad_objects") or []:
        lines.append(f"set aside: {bad['kind']} {bad['key']}: {bad['reason']}")
    return "\n".join(lines)


def cmd_simulate(args: argparse.Namespace) -> int:
    from .core.policy import policy_names
    from .sim.packing import PackingResult
    from .sim.plot import plot_packing, plot_time
    from .sim.report import packing_table, time_table
    from .sim.runner import EMBEDDED, Job, run_jobs
    from .sim.schedulers import DEFAULT_EXTENDER_WEIGHT, SCHEDULERS
    from .sim.timemode import DEFAULT_NODES

    if args.cluster_nodes is not None and args.mode != "time":
        raise ValueError("--cluster-nodes applies to --mode time only: packing mode replays on the whole node list "
                         "(give a smaller --nodes file instead)")
    plot = _plot_path(args)  # a bad path fails now, not after the whole run
    traces = args.trace or [EMBEDDED]
    nodes = args.nodes or EMBEDDED
    if args.trace and not args.nodes:
        print("note: --trace without --nodes replays on the embedded openb-like cluster", file=sys.stderr)
    policies = args.policy or policy_names()
    schedulers = args.scheduler or list(SCHEDULERS)
    seeds = args.seeds or (list(range(42, 44)) if traces == [EMBEDDED] else list(range(42, 52)))
    if args.mode != "time" and (args.load or args.queue):
        raise ValueError(f"{'--load' if args.load else '--queue'} is a time-mode setting: packing mode has no clock "
                         "(add --mode time)")
    if "kube" not in schedulers and (args.weight or args.extender_sees):
        raise ValueError(f"{'--weight' if args.weight else '--extender-sees'} shapes the kube scheduler's replay, "
                         f"and --scheduler {','.join(schedulers)} runs none (add kube)")
    loads = (args.load or loads_arg(DEFAULT_TIME_LOADS)) if args.mode == "time" else [0.0]
    backfill, short_first = _queue_settings(args)
    check_movable_share(args.movable_share, args.mode, schedulers)
    jobs = [
        Job(trace=t, nodes=nodes, policy=p, scheduler=s, seed=seed, mode=args.mode, load=load,
            node_count=args.cluster_nodes or DEFAULT_NODES, weight=args.weight or DEFAULT_EXTENDER_WEIGHT,
            extender_sees=args.extender_sees or "all", queue=args.queue or "kube-1.20", backfill=backfill,
            movable_share=args.movable_share, short_first=short_first)
        for t in traces for s in schedulers for p in policies for seed in seeds for load in loads
    ]
    _check_inputs(args, traces, nodes, backfill)
    started = time.perf_counter()
    results = []
    progress = Progress(len(jobs), sys.stderr)
    for r in run_jobs(jobs, args.workers):
        results.append(r)
        if args.json:
            record = r.as_json()
            print(json.dumps(record), flush=True)
        progress.done(len(results))
    progress.close()
    if not args.json:
        print(packing_table(results) if args.mode == "packing" else time_table(results))
        print(f"\n{len(results)} runs in {time.perf_counter() - started:.1f} s")
    if plot is not None:
        try:
            if isinstance(results[0], PackingResult):
                plot_packing(results, plot)
            else:
                plot_time(results, plot)
        except OSError as e:  # what the probe before the run could not foresee (the disk filled up, say)
            raise ValueError(f"--plot {plot}: could not write it: {e.strerror or e} (the tables above are complete)") from None
        print(f"plot: {plot}", file=sys.stderr)
    return 0


def _queue_settings(args: argparse.Namespace):
    """(reservations, shortest runs first) from the flags, each None when off; refused in words outside time mode."""
    backfill, short_first = backfill_settings(args), short_first_settings(args)
    for flag, on in (("--reservations on", backfill is not None), ("--short-first on", short_first is not None)):
        if on and args.mode != "time":
            raise ValueError(f"{flag} is a time-mode setting: packing mode has no queue to wait in (add --mode time)")
    return backfill, short_first


def check_movable_share(share: float, mode: str, schedulers: list[str]) -> None:
    """Refuse a movable share where it would mean nothing, before the run (bench/openb.py asks too)."""
    if not share:
        return
    if mode == "packing" and schedulers != ["ideal"]:
        raise ValueError("--movable-share in packing mode needs --scheduler ideal: a moved pod goes where the policy ranks "
                         "best, the ideal scheduler's rule (time mode follows the server: filter sends the replacement there)")


def _plot_path(args: argparse.Namespace) -> Path | None:
    """Where the PNG goes, or None: --json writes none unless asked (it used to overwrite the table run's PNG).

    Checked before the run: a directory that does not exist or cannot be written, or a path that is a
    directory, used to fail after minutes of simulation.
    """
    if args.plot is not None and str(args.plot).lower() == "none":
        return None
    if args.plot is None and args.json:
        return None
    path = args.plot or Path(f"tessera-{args.mode}.png")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"--plot {path}: is a directory; give a file name such as {path / 'tessera.png'}")
    if not parent.is_dir():
        raise ValueError(f"--plot {path}: no such directory: {parent}")
    if path.suffix.lower() != ".png":
        raise ValueError(f"--plot {path}: the plot is a PNG; give a path ending in .png (or 'none')")
    try:  # tried, not asked: os.access says yes to root everywhere, and /sys or a read-only mount still refuse
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=parent, suffix=".png"):
                pass
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot write there ({(e.strerror or str(e)).lower()})") from None
    return path


class Progress:
    """`12/40 runs done, ETA 35 s` on stderr: one line rewritten in place on a terminal; in a pipe or a
    log, a new line at most every PIPE_EVERY_S seconds (and at the end), never one endless line."""

    PIPE_EVERY_S = 10.0

    def __init__(self, total: int, out, clock=time.monotonic) -> None:
        self.total, self.out, self.clock = total, out, clock
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.started = self.last = clock()

    def line(self, n: int) -> str:
        elapsed = self.clock() - self.started
        if n >= self.total:
            return f"{n}/{self.total} runs done in {elapsed:.0f} s"
        eta = f", ETA {elapsed / n * (self.total - n):.0f} s" if n else ""
        return f"{n}/{self.total} runs done{eta}"

    def done(self, n: int) -> None:
        if self.tty:
            print(f"\r{self.line(n)}\x1b[K", end="", file=self.out, flush=True)
        elif n >= self.total or self.clock() - self.last >= self.PIPE_EVERY_S:
            self.last = self.clock()
            print(self.line(n), file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)


def _check_inputs(args: argparse.Namespace, traces: list[str], nodes: str, backfill: BackfillSettings | None) -> None:
    """Before the run: refuse what the mode cannot replay, and warn of pods no policy can place."""
    from .sim.timemode import DEFAULT_NODES

    check_trace_labels(traces)

    if args.mode == "time":
        _check_time_mode(traces, nodes, args.cluster_nodes or DEFAULT_NODES, backfill)
    for line in _unmeetable_notes(traces, nodes):
        print(line, file=sys.stderr)


def check_packable(trace: str, nodes: str) -> None:
    """ValueError in words (TraceError for a bad row) when a trace cannot be replayed on a node list at all: no pods,
    no pod asking for a GPU, or no GPU node; both modes measure GPUs (bench/openb.py asks too)."""
    from .sim.runner import EMBEDDED, _nodes, _pods, trace_label

    for path in {trace, nodes} - {EMBEDDED}:
        empty_csv(path)
    pods = _pods(trace)
    if not pods:
        raise ValueError(f"trace {trace_label(trace)} has no pods")
    if not any(p.request.gpu_count for p in pods):
        raise ValueError(f"trace {trace_label(trace)}: none of its {len(pods)} pods asks for a GPU, and both modes "
                         "measure GPUs (unallocated, waits against offered GPU load): nothing to replay")
    if not any(n.gpu_count for n in _nodes(nodes)):
        raise ValueError(f"the node list {nodes} has no node with a GPU: nothing to place GPU pods on")


def check_trace_labels(traces: list[str]) -> None:
    """Results are keyed by a trace's label (its file name): two traces under one were merged into one row, and a
    trace given twice ran twice as if it were two seeds. ValueError in words (bench/openb.py asks too)."""
    from .sim.runner import trace_label

    labels: dict[str, str] = {}
    for trace in traces:
        first = labels.setdefault(trace_label(trace), trace)
        if first != trace or traces.count(trace) > 1:
            raise ValueError(f"trace {trace} and {first} would both be reported as trace {trace_label(trace)!r}: give "
                             "each trace once, under its own file name")


def _check_time_mode(traces: list[str], nodes: str, node_count: int, backfill: BackfillSettings | None) -> None:
    """Time mode needs each pod's run time, and a cluster as large as asked: refuse or say so before the run."""
    from .sim.runner import _nodes, _pods, trace_label

    for trace in traces:
        untimed = [p for p in _pods(trace) if not p.timed]
        if untimed:
            raise ValueError(f"trace {trace_label(trace)}: {len(untimed)} of its {len(_pods(trace))} pods have no "
                             f"deletion_time (e.g. {untimed[0].request.name}), and time mode runs each pod for its "
                             "trace run time; packing mode needs no times (openb's multigpu traces have none)")
    have = len(_nodes(nodes))
    if node_count > have:
        print(f"note: time mode samples {node_count} nodes and the node list has {have}: replaying on all {have}",
              file=sys.stderr)
    pool = backfill.drain_pool if backfill is not None else 0
    if pool >= min(node_count, have):
        raise ValueError(f"--drain-pool {pool} keeps every one of the {min(node_count, have)} nodes replayed for short "
                         "runs: give fewer")


def _unmeetable_notes(traces: list[str], nodes: str) -> list[str]:
    """Before a run: each trace's pods that can never be placed (models no node has, by model; more than any node
    holds), as warnings; a trace that asks for no GPU at all is refused (ValueError): there is nothing to measure."""
    from .sim.runner import _nodes, _pods, trace_label
    from .sim.trace import fit_nowhere, unmeetable

    lines = []
    for trace in traces:
        check_packable(trace, nodes)
        pods = _pods(trace)
        too_big = fit_nowhere(pods, _nodes(nodes))
        if too_big:
            r = too_big[0].request
            lines.append(f"warning: trace {trace_label(trace)}: {len(too_big)} pod{'s' if len(too_big) > 1 else ''} "
                         f"{'ask' if len(too_big) > 1 else 'asks'} more than any node has even empty (e.g. {r.name}: "
                         f"{r.gpu_count} GPUs, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB); never placed, counted "
                         "as unserved whatever the policy")
        by_model = unmeetable(pods, _nodes(nodes))
        if by_model:
            shown = ", ".join(f"{m} ({n})" for m, n in by_model.most_common(8))
            more = f" and {len(by_model) - 8} more" if len(by_model) > 8 else ""
            lines.append(f"warning: trace {trace_label(trace)}: {sum(by_model.values())} GPU pods ask only for models no "
                         f"node has: {shown}{more}; they can never be placed and count as unserved whatever the policy")
    return lines


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


if __name__ == "__main__":
    sys.exit(main())
