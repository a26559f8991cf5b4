"""`tessera serve`'s flags and start-up: the scheduler extender kube-scheduler calls (extender/serve.py runs it).

The reservation and shortest-runs-first flags are shared with `tessera simulate`'s time mode, which reads them
through the same backfill_settings and short_first_settings.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .args import existing_path, file_problem, host_port, namespace_name, number_arg

# API connections for the threads beside the verbs' own: the two watches, the Event writer, the PodGroup watch,
# the Lease, the Node writer, the waiting-reason writer and the mover (load_api's `connections`)
API_THREADS = 8


def add_serve_command(sub) -> None:
    from ..core.policy import policy_names
    from ..http.limits import MAX_BODY_BYTES

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
    add_reservation_flags(serve)
    serve.set_defaults(run=cmd_serve)


def add_reservation_flags(serve: argparse.ArgumentParser) -> None:
    """Reservations with backfill (extender/queue_reservations.py, core/backfill.py): the settings time mode measured."""
    serve.add_argument("--reservations", choices=("on", "off"), default="off",
                       help="a pod that waited past its class's bound reserves the node its running pods free soonest "
                            "(by their spec.activeDeadlineSeconds or tessera.dev/expected-runtime, the shorter); others "
                            "take that node only beside it or if they declare a run that ends first. Default off: in "
                            "time mode (100 openb nodes, seed load 1.33) "
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
    serve.add_argument("--drain-lease", choices=("on", "off"), default=None,
                       help="a pod no other node takes may run on a drain-pool or reserved node for --drain-pool-run, "
                            "then it is deleted (its controller makes a new one, never leased again); only pods with a "
                            "controller and no safe-to-evict \"false\" (default off; needs --drain-keep or --drain-pool)")
    serve.add_argument("--drain-pool-run", default=None,
                       help="the longest run a drain-pool node takes from other pods (default 1h)")
    serve.add_argument("--short-first", choices=("on", "off"), default=None,
                       help="shortest runs first: while more than --short-first-waiting GPU pods whose "
                            "spec.activeDeadlineSeconds is at most --short-first-run wait, GPU pods of longer or "
                            "undeclared runs are kept off the nodes where one of them fits, each for at most "
                            "--short-first-hold (default on; in simulate, time mode's tessera rows only: "
                            "docs/queueing.md has the measured trade-off)")
    serve.add_argument("--short-first-waiting", type=number_arg(int, 0), default=None, metavar="PODS",
                       help="short GPU pods waiting above which longer runs are held (default 20)")
    serve.add_argument("--short-first-run", default=None, metavar="DURATION",
                       help="the longest run that counts as short (default 1h)")
    serve.add_argument("--short-first-hold", default=None, metavar="DURATION",
                       help="the longest a pod is held; a short pod waiting longer no longer counts (default 2h)")
    serve.add_argument("--short-first-estimate", choices=("on", "off"), default=None,
                       help="a GPU pod with no spec.activeDeadlineSeconds runs as long as its namespace's pods of its GPU "
                            "shape ran: the 75%% quantile of the last 50 finished and the running ones "
                            "(core/run_history.py, run_estimates.py), not as a long run (default off: under users' "
                            "declarations it did not lower the mean wait, docs/queueing.md)")


def short_first_settings(args: argparse.Namespace):
    """ShortFirstSettings from the flags: on unless --short-first off (the default since issue 37, when time mode with
    users' declarations measured it under FGD's mean wait at every load: docs/queueing.md); None with it off;
    ValueError in words. Estimates stay off unless asked: they moved the mean by under 0.5 min either way at every
    load (14.4 against 14.2 min at 1.33) and would hand tenants one more lever."""
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    from ..core.short_first import ShortFirstSettings

    shapers = {"--short-first-waiting": args.short_first_waiting, "--short-first-run": args.short_first_run,
               "--short-first-hold": args.short_first_hold, "--short-first-estimate": args.short_first_estimate}
    if args.short_first == "off":
        given = [flag for flag, value in shapers.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} shortest runs first, which "
                             "--short-first off turns off: drop one or the other")
        return None
    run = duration_s(args.short_first_run or "1h", "--short-first-run", 1, MAX_EXPECTED_RUNTIME_S)
    hold = duration_s(args.short_first_hold or "2h", "--short-first-hold", 1, MAX_EXPECTED_RUNTIME_S)
    waiting = 20 if args.short_first_waiting is None else args.short_first_waiting
    return ShortFirstSettings(waiting=waiting, run_s=float(run), max_hold_s=float(hold),
                              estimate_silent=args.short_first_estimate == "on")


def move_interval(raw: str) -> float:
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    return float(duration_s(raw, "--move-interval", 0, MAX_EXPECTED_RUNTIME_S))


def backfill_settings(args: argparse.Namespace):
    """BackfillSettings from the serve flags, None with --reservations off; ValueError in words."""
    from tessera_contract.keys import MAX_EXPECTED_RUNTIME_S
    from tessera_contract.values import duration_s

    from ..core.backfill import BackfillSettings

    if args.reservations != "on":
        given = [flag for flag, value in _RESERVATION_SHAPERS.items() if getattr(args, value) not in (None, [])]
        if given:
            raise ValueError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} reservations, which are off: "
                             "add --reservations on")
        return None
    if args.drain_pool and args.drain_keep:  # BackfillSettings' words named its field (drain_keep), not the flags
        raise ValueError("--drain-pool and --drain-keep exclude each other (a fixed drain pool or a floating one): "
                         "choose one")
    if args.drain_lease == "on" and not (args.drain_pool or args.drain_keep):
        raise ValueError("--drain-lease on needs a drain pool to lease from: add --drain-keep NODES or --drain-pool NODES")
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
                            drain_keep=args.drain_keep or 0, drain_pool_run_s=float(pool_run),
                            drain_lease=args.drain_lease == "on")


# The flags that shape reservations (their argparse dest): given with --reservations off they would do nothing.
_RESERVATION_SHAPERS = {
    "--reservation-wait": "reservation_wait", "--reservation-max-share": "reservation_max_share",
    "--reservation-grace": "reservation_grace", "--drain-pool": "drain_pool", "--drain-keep": "drain_keep",
    "--drain-pool-run": "drain_pool_run", "--drain-lease": "drain_lease",
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



def load_api(kubeconfig: str | None, connections: int | None = None):
    """A configured kubernetes ApiClient: --kubeconfig, else in-cluster, else $KUBECONFIG (`tessera bridge` too: the
    dispatcher hands it to raybridge/cli.py).

    `connections`: the most API connections kept open for reuse. The client's default is 5 per CPU (10 on a 2-core
    node), while every bind thread may call the API at once: beyond the pool, each call opened a connection, paid a
    TLS handshake and dropped it (bench/bind_latency.py, 5,000 nodes: 117 of the 145 bind samples in a profile were
    handshakes, their CPU taken from the next pod's filter)."""
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
    if connections is None:
        return client.ApiClient()
    settings = client.Configuration.get_default_copy()
    settings.connection_pool_maxsize = connections
    return client.ApiClient(settings)


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

    from ..serve import ServeOptions, Tls, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bool(args.tls_cert) != bool(args.tls_key) or (args.client_ca and not args.tls_cert):
        raise ValueError("--tls-cert and --tls-key go together, and --client-ca needs them")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--client-ca", args.client_ca)):
        if path and (problem := file_problem(path)) is not None:  # here, not by the parser: manifests name in-pod paths
            raise ValueError(f"{flag}: {problem}")
    _check_serve_flags(args)
    from ..http.limits import MAX_BODY_BYTES

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
    serve(opts, load_api(args.kubeconfig, connections=opts.threads + API_THREADS))
    return 0
