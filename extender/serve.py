"""`tessera serve`: wires the extender process together (API cache, Lease, two or three HTTP listeners).

The verbs listener (`--listen`) answers kube-scheduler alone, in one of two safe ways:
  * mutual TLS (`--tls-cert/--tls-key/--client-ca`): only a client holding a certificate signed by
    that CA gets past the handshake (http/tlsfront.py runs handshakes off the request threads);
  * plain HTTP on loopback, beside a kube-scheduler on the same host (a static pod).
Plain HTTP, or TLS without client certificates, on any other address is refused at start unless
`--insecure-listen` says the operator means it.

The admin listener (`--admin-listen`, plain HTTP) carries healthz, readyz, metrics, inspect and
the OpenAPI document (http/admin.py): probes and Prometheus need no certificate and move no pod.
Both run on waitress (the server bench/extender_latency.py measures).

The probe listener (`--probe-listen`, plain HTTP, off unless given; the shipped Deployments give it and point
their liveness and readiness probes at it) answers only /healthz and /readyz, on its own port and thread
(http/probes.py): a flood of the admin port's connections, which waitress caps at 256, cannot make the kubelet
restart the extender.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass

from tessera_contract.keyring import load_path

from .core.backfill import BackfillSettings
from .core.openb_stats import default_workload as openb_task_mix
from .core.short_first import ShortFirstSettings
from .http.admin import create_admin_app, is_loopback, probe_answers
from .http.app import InFlight, create_app
from .http.forward import HolderForwarder, Peers, api_pod_reader, peer_identity
from .http.limits import MAX_BODY_BYTES
from .http.timing import wanted as server_timing_wanted
from .kube.agents import start_agent_puller
from .kube.assignment_key import KeyMissing
from .kube.assignment_key import load as load_key_secret
from .kube.binder import ApiBinder
from .kube.cache import BIND_EVENTS_PER_MINUTE, ApiCache, EventSink
from .kube.gang_binder import GangBinder
from .kube.keyring import gate_readiness
from .kube.lean_core import LeanCore
from .kube.lease import LeaseConfig, LeaseElector
from .kube.podgroups import start as start_pod_groups
from .kube.preemptor import DisruptionBudgets, Preemptor
from .service import Extender
from .translate.objects import AssignmentSigner

log = logging.getLogger("tessera")


@dataclass(frozen=True, slots=True)
class Tls:
    cert: str
    key: str
    client_ca: str = ""  # required client certificates when set
    server_name: str = ""  # the DNS name the replicas' server certificate carries (followers check it)

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.client_ca)
        return ctx

    def forward_context(self) -> ssl.SSLContext:
        """A follower calling the holder: verify its server certificate against the CA (for
        `server_name`), and present our own certificate, which the holder requires of any client."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.client_ca or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str
    port: int
    prefix: str = "/tessera"
    policy: str = "tessera"
    threads: int = 64
    preemption: str = "tessera"  # who deletes victims: tessera (kube/preemptor.py), scheduler (the verb), off
    tls: Tls | None = None
    leader_elect: bool = False
    lease_name: str = "tessera-extender"
    lease_namespace: str = ""
    lease_duration_s: float = 15.0
    advertise_url: str = ""
    assignment_key_file: str = ""
    assignment_key_secret: str = ""  # a Secret in the lease namespace, created by the install; only read here
    agent_interval_s: float = 10.0  # pull the node agents' reports this often (0: never); kube/agents.py
    accept_unknown_keys: bool = False  # start even when running pods name keys we lack (they count as forged)
    admin_host: str = "0.0.0.0"
    admin_port: int = 8889
    probe_host: str = ""  # the probe listener (http/probes.py); "" with port 0: none, the probes use the admin port
    probe_port: int = 0
    insecure_listen: bool = False  # the operator accepts verbs anyone on the network can call
    inspect_from_anywhere: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    backfill: BackfillSettings | None = None  # reservations with backfill (queue_reservations.py); None: off
    short_first: ShortFirstSettings | None = None  # shortest runs first (short_first_queue.py); None: off
    moves: bool = False  # move trainers of elastic Ray jobs that opted in to make room (moves.py, kube/preemptor.py)
    move_interval_s: float = 300.0
    # the kube-scheduler profiles Tessera serves: pods are evicted or moved only for their pods (displacement.py refusal)
    scheduler_names: tuple[str, ...] = ("default-scheduler",)

    def listeners(self) -> list[tuple[str, str, int]]:
        """(flag, host, port) of each listener this process opens: the verbs, the admin port, the probes if asked."""
        found = [("--listen", self.host, self.port), ("--admin-listen", self.admin_host, self.admin_port)]
        return found + ([("--probe-listen", self.probe_host, self.probe_port)] if self.probe_port else [])

    def check(self) -> None:
        """Refuse, in words, two listeners on one port, and a verbs listener that anyone on the network could call."""
        listeners = self.listeners()
        for i, (flag, host, port) in enumerate(listeners):
            for other, other_host, other_port in listeners[:i]:
                if port == other_port and _same_address(host, other_host):
                    said = (f"{other} and {flag} are both {host}:{port}" if host == other_host else
                            f"{other} {other_host}:{port} and {flag} {host}:{port} overlap")
                    raise ValueError(f"{said}: they need two ports")
        if self.threads < 2:
            raise ValueError(f"--threads {self.threads}: at least 2, so a bind never keeps the next filter waiting")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes {self.max_body_bytes} is too small for any kube-scheduler request")
        check_scheduler_names(self.scheduler_names)
        if self.insecure_listen or is_loopback(self.host):
            return
        if self.tls is None:
            raise ValueError(f"refusing plain HTTP on {self.host}:{self.port}: anyone who reaches it could call the "
                             "verbs (bind pods, hold GPUs). Use --tls-cert/--tls-key/--client-ca (mutual TLS), "
                             "--listen 127.0.0.1:PORT beside kube-scheduler, or --insecure-listen if you mean it")
        if not self.tls.client_ca:
            raise ValueError(f"refusing HTTPS without client certificates on {self.host}:{self.port}: anyone could "
                             "call the verbs. Add --client-ca (the CA that signed kube-scheduler's certificate), "
                             "or --insecure-listen if you mean it")


def _same_address(a: str, b: str) -> bool:
    """Two listen hosts that one port cannot serve twice: the same, or a wildcard of the other's family."""
    if a == b:
        return True
    wildcard = {"0.0.0.0": lambda h: ":" not in h, "::": lambda h: ":" in h}
    return any(w in wildcard and wildcard[w](h) for w, h in ((a, b), (b, a)))


MAX_SCHEDULER_NAMES = 16
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_scheduler_names(names: tuple[str, ...]) -> None:
    """Refuse, in words, --scheduler-name values no pod can carry: the apiserver requires a pod's schedulerName to be a
    DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters), so any other name serves nobody."""
    if not names:
        raise ValueError("--scheduler-name: at least one kube-scheduler profile name")
    if len(names) > MAX_SCHEDULER_NAMES:
        raise ValueError(f"--scheduler-name given {len(names)} times: at most {MAX_SCHEDULER_NAMES} profiles")
    for name in names:
        if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
            raise ValueError(f"--scheduler-name {name[:80]!r} is not a schedulerName a pod can have (a DNS subdomain: "
                             "lowercase letters, digits, '-' and '.', at most 253 characters), e.g. default-scheduler")


def load_signer(path: str) -> AssignmentSigner | None:
    """The bind annotations' MAC keys: a key file or a mounted Secret (keyring.py); none means
    annotations are trusted as written."""
    if not path:
        log.warning("no assignment key (--assignment-key-secret or -file): pods' own assignment annotations are believed")
        return None
    try:
        return load_path(path)
    except ValueError as e:  # the keyring's words name the entry; the admin wrote the path
        raise ValueError(f"--assignment-key-file {path}: {str(e).removeprefix(f'{path}: ')}") from None
    except OSError as e:
        raise ValueError(f"--assignment-key-file {path}: {e.strerror or e}") from None


def advertised_url(opts: ServeOptions) -> str:
    """Where the other replicas forward binds: --advertise-url, else this pod's IP (downward API)."""
    if opts.advertise_url:
        return opts.advertise_url
    host = os.environ.get("POD_IP") or socket.gethostname()
    scheme = "https" if opts.tls else "http"
    return f"{scheme}://{host}:{opts.port}{opts.prefix}"


def lease_config(opts: ServeOptions) -> LeaseConfig:
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    namespace = opts.lease_namespace or os.environ.get("POD_NAMESPACE") or "tessera-system"
    d = opts.lease_duration_s
    return LeaseConfig(namespace, opts.lease_name, identity, advertised_url(opts),
                       duration_s=d, renew_deadline_s=d * 2 / 3, retry_s=d / 7.5)


def make_extender(opts: ServeOptions, signer: AssignmentSigner | None) -> Extender:
    """The extender this process runs. It starts from openb's task mix (the aggregates embedded in the
    core, extender/core/openb_stats.py) and relearns from the pods it sees."""
    extender = Extender(policy=opts.policy, signer=signer, prior=openb_task_mix(),
                        backfill=opts.backfill, short_first=opts.short_first)
    extender.scheduler_names = frozenset(opts.scheduler_names)  # whose pods it evicts or moves for (displace_refusal)
    return extender


def serve(opts: ServeOptions, api_client) -> None:
    """Run until SIGTERM/SIGINT; `api_client` is a configured kubernetes ApiClient."""
    from kubernetes.client import CoordinationV1Api, CoreV1Api

    opts.check()
    check_ports_free(opts)  # before any API call and before saying where it serves

    core = LeanCore(CoreV1Api(api_client))  # the Binding and Event writes without the generated client's cost
    stop = threading.Event()
    waiting = Waiting(opts, stop)  # the probe port while the start waits (the API, the key's Secret)
    signer = _signer(opts, core, waiting)
    extender = make_extender(opts, signer)
    gate_readiness(extender, signer, opts.accept_unknown_keys)  # exits, in words, if running pods name keys we lack
    cache = ApiCache(core, extender, stop)
    elector = lease_thread = forwarder = None
    if opts.leader_elect:
        # a new leader binds from its own watch cache, no relist: the old leader stopped binding at its
        # renew deadline, a lease duration before we may take over, time enough for the watch to bring
        # its last binds (a relist here would race the watch threads and stall the renewals)
        elector = LeaseElector(CoordinationV1Api(api_client), lease_config(opts),
                               on_elected=lambda: _wait_synced(extender, stop))
        forwarder = _forwarder(opts, core, elector, waiting)  # before campaigning: a replica that cannot forward exits first
        lease_thread = threading.Thread(target=elector.run, args=(stop,), daemon=True, name="lease")
        lease_thread.start()
    in_flight = InFlight()  # filter and prioritize being answered: the bind Events wait for a gap (http/app.py)
    bind_events = EventSink(core, stop, per_minute=BIND_EVENTS_PER_MINUTE,  # its own budget: bad objects cannot starve it
                            defer_while=in_flight.busy)
    threading.Thread(target=bind_events.run, daemon=True, name="bind-events").start()
    extender.verb_preempts = opts.preemption == "scheduler"
    extender.moves.on, extender.moves.min_interval_s = opts.moves, opts.move_interval_s
    if opts.preemption == "tessera" or opts.moves or (opts.backfill is not None and opts.backfill.drain_lease):
        cache.preemptor = _preemptor(api_client, core, extender, elector, stop, preempt=opts.preemption == "tessera")
    threading.Thread(target=cache.start, daemon=True, name="cache").start()
    binder = ApiBinder(core)
    app = create_app(extender, binder, prefix=opts.prefix, leadership=elector, forwarder=forwarder,
                     max_body_bytes=opts.max_body_bytes, events=bind_events, timed=server_timing_wanted(),
                     in_flight=in_flight)
    _gangs(api_client, extender, binder, bind_events, elector, stop)
    if puller := start_agent_puller(core, extender, lease_config(opts).namespace, elector, stop, opts.agent_interval_s):
        app.extensions["tessera"]["registry"].register(puller)
    admin = create_admin_app(extender, app.extensions["tessera"]["registry"], prefix=opts.prefix,
                             inspect_from_anywhere=opts.inspect_from_anywhere)
    _say_where(opts, elected=elector is not None)
    run_servers(app, admin, opts, stop, probes=probe_answers(extender), probe=waiting.listener)
    stop.set()
    if lease_thread is not None:
        lease_thread.join(10)  # its loop ends by releasing the Lease: a follower takes over at once


def _say_where(opts: ServeOptions, elected: bool) -> None:
    probes_at = f", probes on http://{opts.probe_host}:{opts.probe_port}" if opts.probe_port else ""
    log.info("verbs on %s://%s:%d%s%s, admin on http://%s:%d%s (policy %s%s)", "https" if opts.tls else "http",
             opts.host, opts.port, opts.prefix, " (client certificates required)" if opts.tls and opts.tls.client_ca else "",
             opts.admin_host, opts.admin_port, probes_at, opts.policy,
             f", lease {lease_config(opts).namespace}/{opts.lease_name}" if elected else "")


def _gangs(api_client, extender: Extender, binder: ApiBinder, events: EventSink, elector, stop: threading.Event) -> None:
    """Gangs' two workers (extender/gangs.py): the watch of scheduler-plugins' PodGroups (their sizes), and the binder
    of admitted gangs' members that kube-scheduler is not binding itself (only the replica that binds acts)."""
    start_pod_groups(api_client, extender, stop)
    GangBinder(extender, binder, events, elector.is_leader if elector is not None else lambda: True).start(stop)


def _preemptor(api_client, core, extender: Extender, elector, stop: threading.Event, preempt: bool) -> Preemptor:
    """Tessera's own preemption and moves (kube/preemptor.py), with its own Event budget; only the replica that binds acts."""
    from kubernetes.client import PolicyV1Api

    events = EventSink(core, stop)
    threading.Thread(target=events.run, daemon=True, name="preemption-events").start()
    preemptor = Preemptor(extender, core, DisruptionBudgets(core, PolicyV1Api(api_client)), events,
                          may_act=elector.is_leader if elector is not None else (lambda: True), preempt=preempt)
    threading.Thread(target=preemptor.run, args=(stop,), daemon=True, name="preemptor").start()
    return preemptor


def _signer(opts: ServeOptions, core, waiting: Waiting) -> AssignmentSigner | None:
    """The keys that sign bind annotations: the Secret the install created (read, never created: until it exists
    this waits, not ready, with nothing listening for verbs, so nothing is bound unsigned), or a key file."""
    if opts.assignment_key_secret:
        namespace = lease_config(opts).namespace
        signer = _retry(lambda: load_key_secret(core, namespace, opts.assignment_key_secret), "assignment key",
                        waiting=waiting)
    else:
        signer = load_signer(opts.assignment_key_file)
    if signer is not None:
        log.info("assignment keys: %s", signer.describe())
    return signer


class Waiting:
    """What the probe port answers while the start waits for something outside the process: an API that does not
    answer, or the assignment key's Secret that the install has not created yet (an admin may take hours). Bound
    at the first failed try, not before (a start that never waits binds every listener first, as run_servers says):
    `/healthz` answers alive, so the kubelet does not restart a replica that only waits, and `/readyz` 503 with the
    reason. run_servers then gives the same listener the extender's own answers."""

    def __init__(self, opts: ServeOptions, stop: threading.Event) -> None:
        self.opts, self.stop = opts, stop
        self.listener = None
        self.why = "starting"

    def answers(self) -> dict:
        return {"/healthz": lambda: ({"ok": True}, 200),
                "/readyz": lambda: ({"ready": False, "nodes": 0, "reason": self.why}, 503)}

    def say(self, why: str) -> None:
        self.why = why
        if self.listener is None and self.opts.probe_port:
            from .http.probes import ProbeListener

            self.listener = ProbeListener(self.opts.probe_host, self.opts.probe_port, self.answers())
            threading.Thread(target=self.listener.serve, args=(self.stop,), daemon=True, name="probes").start()


RETRY_LOG_S = 60.0  # the same words again at most this often: a missing Secret may wait for hours


def _retry(fn, what: str, wait_s: float = 2.0, waiting: Waiting | None = None):
    """Until the API answers: a replica started before the apiserver is reachable waits, it does not
    crash; so does one whose assignment key Secret the install has not created yet (KeyMissing, whose words
    say which step creates it). Meanwhile `waiting`'s probe port says not ready, and why. A wrong answer
    (a Secret without a usable key: ValueError) ends the process in words."""
    import time

    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    said, said_at = "", 0.0
    while True:
        try:
            got = fn()
            if waiting is not None:
                waiting.why = "starting"
            return got
        except (ApiException, HTTPError, OSError, KeyMissing) as e:
            why = f"{what}: {e}"
            if why != said or time.monotonic() - said_at >= RETRY_LOG_S:
                log.warning("%s; retrying every %gs", why, wait_s)
                said, said_at = why, time.monotonic()
            if waiting is not None:
                waiting.say(why)
            time.sleep(wait_s)


def _wait_synced(extender: Extender, stop: threading.Event) -> None:
    """Elected before the first full list finished: bind only once the cache is whole."""
    while not extender.synced and not stop.wait(0.2):
        pass


def _forwarder(opts: ServeOptions, core, elector: LeaseElector, waiting: Waiting | None = None) -> HolderForwarder:
    """Followers forward binds only to a Ready replica like this one: same namespace, ServiceAccount
    and labels, read from this replica's own pod ($POD_NAME), at the verbs port (http/forward.py)."""
    cfg = lease_config(opts)
    read = api_pod_reader(core)
    own = _retry(lambda: read(cfg.namespace, cfg.identity), "reading this replica's pod", waiting=waiting)
    if own is None:
        raise ValueError(f"--leader-elect: this replica's pod {cfg.namespace}/{cfg.identity} does not exist; set "
                         "POD_NAME (downward API) to the pod's name: followers forward binds only to such pods")
    sa, labels = peer_identity(own)
    context = opts.tls.forward_context() if opts.tls else None
    server_name = (opts.tls.server_name if opts.tls else "") or f"tessera-extender.{cfg.namespace}.svc"
    peers = Peers(cfg.namespace, sa, labels, opts.port, opts.prefix, context, server_name, self_name=cfg.identity)
    return HolderForwarder(elector, peers, read)


def check_ports_free(opts: ServeOptions) -> None:
    """OSError in words when a listen address cannot be bound (a port in use, an address not here).

    Checked at start: the serving loop binds only after the watch, the keys and the Lease are set up,
    and a busy port found then came after the log had said where it serves.
    """
    for flag, host, port in opts.listeners():
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise OSError(f"{flag} {host}:{port}: cannot resolve {host}: {e.strerror}") from None
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress binds: TIME_WAIT is no conflict
            try:
                probe.bind(address)
                probe.listen(1)
            except OSError as e:
                why = "the port is in use (another tessera serve?)" if e.errno == errno.EADDRINUSE else e.strerror
                raise OSError(f"{flag} {host}:{port}: cannot listen: {why}") from None


def run_servers(app, admin, opts: ServeOptions, stop: threading.Event, probes: dict | None = None,
                probe=None) -> None:
    """Every listener bound before any answers (a probe that passes means the verbs port is open too); the admin
    loop and the probe listener (`probes`: path -> answer, http/probes.py; with --probe-listen) in threads of their
    own, the verbs (waitress, behind TlsFront with TLS) in this one until a signal. `probe`: the probe listener a
    start that had to wait already runs (serve.Waiting), answering not ready; it gets `probes` once the rest is bound."""
    from waitress.server import create_server

    from .http.limits import waitress_options
    from .http.probes import ProbeListener

    limits = waitress_options(max_request_body_size=opts.max_body_bytes)
    front = None
    if opts.tls is None:
        server = create_server(app, host=opts.host, port=opts.port, threads=opts.threads, ident="tessera", **limits)
    else:
        from .http.tlsfront import TlsFront

        private = tempfile.mkdtemp(prefix="tessera-verbs-")  # mode 0700: only this user reaches the socket
        path = os.path.join(private, "verbs.sock")
        server = create_server(app, unix_socket=path, unix_socket_perms="600", threads=opts.threads, ident="tessera",
                               **limits)
        front = TlsFront(opts.host, opts.port, opts.tls.server_context(), path,
                         idle_s=float(limits.get("channel_timeout", 60)),
                         max_connections=int(limits.get("connection_limit", 256)))
    admin_server = admin_listener(admin, opts)
    running = probe is not None
    if not running and opts.probe_port and probes:
        probe = ProbeListener(opts.probe_host, opts.probe_port, probes)
    _exit_on_signal(stop)
    threading.Thread(target=admin_server.run, daemon=True, name="admin").start()
    if running:
        probe.answers = probes or probe.answers  # every listener is bound now: /readyz may say ready from here on
    elif probe is not None:
        threading.Thread(target=probe.serve, args=(stop,), daemon=True, name="probes").start()
    try:
        if front is None:
            server.run()  # returns once SystemExit reaches its loop (waitress then stops its worker threads)
            return
        threading.Thread(target=server.run, daemon=True, name="verbs").start()
        try:
            front.serve(stop)
        except SystemExit:
            pass
        finally:
            server.close()
    finally:
        admin_server.close()


def admin_listener(admin, opts: ServeOptions):
    """The admin port's waitress server (bound, not yet serving): four threads, the limits of http/limits.py, and at
    most ADMIN_PER_PEER connections kept per peer address, so one pod's half-sent requests cannot hold them all."""
    from waitress.server import create_server

    from .http.limits import cap_per_peer, waitress_options

    return cap_per_peer(create_server(admin, host=opts.admin_host, port=opts.admin_port, threads=4, ident="tessera-admin",
                                      **waitress_options()))


def _exit_on_signal(stop: threading.Event) -> None:
    """SIGTERM (the kubelet's stop) and SIGINT end the serving loop in the main thread."""

    def handler(*_):
        stop.set()
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
