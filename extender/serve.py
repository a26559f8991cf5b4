"""`tessera serve`: wires the extender process together (API cache, Lease, HTTP server).

Plain HTTP runs on waitress (the server bench/extender_latency.py measures). waitress has no
TLS, so with `--tls-cert` the same app runs on cheroot (CherryPy's server), whose TLS context we
build ourselves: that is where client certificates are required when `--client-ca` is given, so
only a kube-scheduler holding a certificate signed by that CA can call the verbs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import threading
from dataclasses import dataclass

from .http.app import create_app
from .kube.agents import start_agent_puller
from .kube.assignment_key import load_or_create, load_path
from .kube.binder import ApiBinder
from .kube.cache import ApiCache
from .kube.contract import AssignmentSigner
from .kube.keyring import gate_readiness
from .kube.lease import LeaseConfig, LeaseElector
from .service import Extender

log = logging.getLogger("tessera")


@dataclass(frozen=True, slots=True)
class Tls:
    cert: str
    key: str
    client_ca: str = ""  # required client certificates when set

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.client_ca)
        return ctx

    def forward_context(self) -> ssl.SSLContext:
        """A follower calling the leader: trust the client CA's replicas, present our own certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.client_ca or None)
        ctx.check_hostname = False  # replicas are reached by pod IP; the CA is ours alone
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str
    port: int
    prefix: str = "/tessera"
    policy: str = "tessera"
    threads: int = 64
    tls: Tls | None = None
    leader_elect: bool = False
    lease_name: str = "tessera-extender"
    lease_namespace: str = ""
    lease_duration_s: float = 15.0
    advertise_url: str = ""
    assignment_key_file: str = ""
    assignment_key_secret: str = ""  # a Secret in the lease namespace, created on first start
    agent_interval_s: float = 10.0  # pull the node agents' reports this often (0: never); kube/agents.py
    accept_unknown_keys: bool = False  # start even when running pods name keys we lack (they count as forged)


def load_signer(path: str) -> AssignmentSigner | None:
    """The bind annotations' MAC keys: a key file or a mounted Secret (keyring.py); none means
    annotations are trusted as written."""
    if not path:
        log.warning("no assignment key (--assignment-key-secret or -file): pods' own assignment annotations are believed")
        return None
    return load_path(path)


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


def serve(opts: ServeOptions, api_client) -> None:
    """Run until SIGTERM/SIGINT; `api_client` is a configured kubernetes ApiClient."""
    from kubernetes.client import CoordinationV1Api, CoreV1Api

    core = CoreV1Api(api_client)
    if opts.assignment_key_secret:
        signer = _retry(lambda: load_or_create(core, lease_config(opts).namespace, opts.assignment_key_secret),
                        "assignment key")
    else:
        signer = load_signer(opts.assignment_key_file)
    extender = Extender(policy=opts.policy, signer=signer)
    if signer is not None:
        log.info("assignment keys: %s", signer.describe())
    gate_readiness(extender, signer, opts.accept_unknown_keys)  # exits, in words, if running pods name keys we lack
    stop = threading.Event()
    cache = ApiCache(core, extender, stop)
    threading.Thread(target=cache.start, daemon=True, name="cache").start()
    elector = lease_thread = None
    if opts.leader_elect:
        # a new leader binds from its own watch cache, no relist: the old leader stopped binding at its
        # renew deadline, a lease duration before we may take over, time enough for the watch to bring
        # its last binds (a relist here would race the watch threads and stall the renewals)
        elector = LeaseElector(CoordinationV1Api(api_client), lease_config(opts),
                               on_elected=lambda: _wait_synced(extender, stop))
        lease_thread = threading.Thread(target=elector.run, args=(stop,), daemon=True, name="lease")
        lease_thread.start()
    app = create_app(extender, ApiBinder(core), prefix=opts.prefix, leadership=elector,
                     forward_context=opts.tls.forward_context() if opts.tls else None)
    if puller := start_agent_puller(core, extender, lease_config(opts).namespace, elector, stop, opts.agent_interval_s):
        app.extensions["tessera"]["registry"].register(puller)
    log.info("serving on %s://%s:%d%s (policy %s%s)", "https" if opts.tls else "http", opts.host, opts.port,
             opts.prefix, opts.policy, f", lease {lease_config(opts).namespace}/{opts.lease_name}" if elector else "")
    if opts.tls:
        _serve_tls(app, opts, stop)
    else:
        _serve_plain(app, opts, stop)
    stop.set()
    if lease_thread is not None:
        lease_thread.join(10)  # its loop ends by releasing the Lease: a follower takes over at once


def _retry(fn, what: str, wait_s: float = 2.0):
    """Until the API answers: a replica started before the apiserver is reachable waits, it does not
    crash. A wrong answer (a Secret without a usable key: ValueError) ends the process in words."""
    import time

    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    while True:
        try:
            return fn()
        except (ApiException, HTTPError, OSError) as e:
            log.warning("%s: %s; retrying", what, e)
            time.sleep(wait_s)


def _wait_synced(extender: Extender, stop: threading.Event) -> None:
    """Elected before the first full list finished: bind only once the cache is whole."""
    while not extender.synced and not stop.wait(0.2):
        pass


def _serve_plain(app, opts: ServeOptions, stop: threading.Event) -> None:
    from waitress.server import create_server

    from .http.limits import waitress_options

    server = create_server(app, host=opts.host, port=opts.port, threads=opts.threads, ident="tessera", **waitress_options())
    _exit_on_signal(stop)
    server.run()  # returns once SystemExit reaches its loop (waitress then stops its worker threads)


def _serve_tls(app, opts: ServeOptions, stop: threading.Event) -> None:
    from cheroot import wsgi
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    assert opts.tls is not None
    from .http.limits import apply_to_cheroot

    server = wsgi.Server((opts.host, opts.port), app, numthreads=opts.threads, server_name="tessera")
    apply_to_cheroot(server)
    adapter = BuiltinSSLAdapter(opts.tls.cert, opts.tls.key)
    adapter.context = opts.tls.server_context()
    server.ssl_adapter = adapter
    _exit_on_signal(stop)
    try:
        server.safe_start()
    except SystemExit:
        pass
    finally:
        server.stop()


def _exit_on_signal(stop: threading.Event) -> None:
    """SIGTERM (the kubelet's stop) and SIGINT end the serving loop in the main thread."""

    def handler(*_):
        stop.set()
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
