"""`tessera bridge`: the one privileged piece of the Ray integration. It speaks only Kubernetes.

Why so little: its ServiceAccount can create and delete pods in every namespace, so it must never
run, import or unpickle anything a tenant made. Each job's Ray cluster, trainers and controller run
inside the job's own pods under the job's own ServiceAccount (raybridge/job.py); the job writes
its phase and progress on its own pods, and marks a member whose trainer it lost
(`tessera.dev/ray-lost`). The bridge reads those pods as JSON objects and does what needs cluster
rights:
  * creates one replacement pod per lost or deleted member of a started job, in the job's
    namespace, from that pod's own spec (plain pods only: an owner recreates its own pods), never
    more live pods than the gang size;
  * deletes a lost pod only when it created it: the UID returned by its own create call is on its
    record (in memory, and an HMAC under the bridge's key on the pod for a restarted bridge: a
    `created-by` annotation alone proves nothing, tenants can write it), and the delete carries
    that UID as a precondition, so a same-named pod made later is never hit;
  * writes an Event on the lost pod.
It holds no Ray connection, no rendezvous store, no liveness channel.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import logging
import os
import secrets
import time
from dataclasses import dataclass, field

from .contract import BRIDGE_MAC_ANNOTATION, REPLACES_ANNOTATION
from .decide import controlling_owner, group_jobs, repair, replacement_pod

log = logging.getLogger("tessera.bridge")


def pod_mac(key: bytes, namespace: str, name: str, replaces: str) -> str:
    return hmac.new(key, f"tessera-bridge-pod|{namespace}/{name}|{replaces}".encode(), hashlib.sha256).hexdigest()


@dataclass
class _Job:
    bodies: dict[str, dict] = field(default_factory=dict)  # the last seen pod of each member: its replacement's template
    replaced: set[str] = field(default_factory=set)


class Bridge:
    def __init__(self, pods, writer, key: bytes | None = None) -> None:
        self.pods, self.writer = pods, writer
        self.key = key or secrets.token_bytes(32)  # a random key: a restarted bridge then deletes none of the old pods
        self.jobs: dict[str, _Job] = {}
        self.created: dict[str, str] = {}  # namespace/name -> UID of each pod this bridge created (or verified)
        self.replacements = 0
        self.deletes = 0
        self._reported: set[str] = set()

    def turn(self) -> None:
        snapshot = self.pods.snapshot()
        by_key = {f"{(p.get('metadata') or {}).get('namespace', 'default')}/{(p.get('metadata') or {}).get('name', '')}": p
                  for p in snapshot}
        jobs = group_jobs(snapshot)
        for error in jobs.errors:
            if error not in self._reported:
                log.warning("%s", error)
        # each said once while it lasts, and forgotten with its pod: 20,000 churned bad pods kept 20,000 messages
        self._reported = set(jobs.errors)
        for key in [k for k in self.created if k not in by_key]:  # gone: after a restart the MAC still proves ours
            del self.created[key]
        for key in [k for k in self.jobs if k not in jobs.members]:  # every pod of the job is gone
            del self.jobs[key]
        for key, members in jobs.members.items():
            job = self.jobs.setdefault(key, _Job())
            now = {m.key for m in members}
            gone = frozenset(k for k in job.bodies if k not in now)
            job.bodies.update({m.key: by_key[m.key] for m in members})
            r = repair(members, gone, frozenset(job.replaced))
            for name in r.replace:
                self._replace(key, job, name, by_key, members)
            for m in members:
                if m.key in r.delete and self._mine(m.key, m.uid, m.bridge_mac, m.replaces):
                    log.info("job %s: deleting lost pod %s (uid %s), which this bridge created", key, m.key, m.uid)
                    self.writer.delete(m.key, m.uid)
                    self.created.pop(m.key, None)
                    self.deletes += 1
            for k in gone:  # forget deleted pods once handled (replaced, or nothing to do)
                if k in job.replaced or not r.replace:
                    job.bodies.pop(k, None)

    def _mine(self, key: str, uid: str, mac: str, replaces: str) -> bool:
        """Created by this bridge: the UID its create call returned, or (after a restart) the pod's MAC
        under this bridge's key, which binds namespace, name and the pod it replaced."""
        if not uid:
            return False
        if self.created.get(key) == uid:
            return True
        ns, name = key.split("/", 1)
        if mac and hmac.compare_digest(mac, pod_mac(self.key, ns, name, replaces)):
            self.created[key] = uid
            return True
        return False

    def _replace(self, job_key: str, job: _Job, name: str, by_key: dict, members) -> None:
        pod = by_key.get(name) or job.bodies.get(name) or _like(name, by_key, members)
        if pod is None:
            return
        job.replaced.add(name)
        owner = controlling_owner(pod)
        if owner:
            log.info("job %s: pod %s lost; its owner %s recreates it", job_key, name, owner)
            return
        # never reuse a name this job had: "replaced" is kept by name
        body = replacement_pod(pod, taken=set(by_key) | set(job.bodies) | job.replaced)
        meta = body["metadata"]
        meta["annotations"][BRIDGE_MAC_ANNOTATION] = pod_mac(self.key, meta["namespace"], meta["name"],
                                                             meta["annotations"][REPLACES_ANNOTATION])
        uid = self.writer.create(body)
        new = f"{meta['namespace']}/{meta['name']}"
        if uid:
            self.created[new] = uid
            self.replacements += 1
        log.info("job %s: pod %s lost, asked for replacement %s", job_key, name, new)
        self.writer.event(name, (pod.get("metadata") or {}).get("uid", ""), "TrainerLost",
                          f"trainer lost; replacement pod {new} requested", warning=True)


def _like(name: str, by_key: dict, members) -> dict | None:
    """A body for a pod this bridge never saw (deleted while it was away; the job lists it as gone): a live
    member's pod under the gone pod's name. A job's members share their spec, apart from their names."""
    for m in members:
        if not m.lost and m.key in by_key:
            body = copy.deepcopy(by_key[m.key])
            meta = body["metadata"]
            meta["name"] = name.split("/", 1)[1]
            meta.pop("uid", None)
            (meta.get("annotations") or {}).pop(REPLACES_ANNOTATION, None)
            return body
    return None


def serve(api, metrics_listen: str, namespace: str | None = None, interval_s: float = 0.2,
          key_file: str | None = None) -> None:
    """The `tessera bridge` process: watch pods, serve /metrics, run the loop forever."""
    import threading

    from prometheus_client import CollectorRegistry, Gauge

    from .kube import PodWatch, PodWriter
    from .metrics import listen_address, serve_metrics

    listen_address(metrics_listen)  # before the watch syncs (long, on a large cluster)
    key = None
    if key_file:
        with open(key_file, "rb") as f:
            key = f.read().strip()
        if len(key) < 32:
            raise ValueError(f"--key-file {key_file}: the bridge's key must be at least 32 bytes")
    elif os.environ.get("TESSERA_BRIDGE_KEY"):
        key = os.environ["TESSERA_BRIDGE_KEY"].encode()
    watch = PodWatch(api, namespace)
    threading.Thread(target=watch.run, daemon=True, name="pod-watch").start()
    watch.synced.wait()
    bridge = Bridge(watch, PodWriter(api), key)
    registry = CollectorRegistry()
    Gauge("tessera_bridge_replacements", "replacement pods created", registry=registry).set_function(
        lambda: bridge.replacements)
    Gauge("tessera_bridge_deletes", "lost pods of its own deleted", registry=registry).set_function(lambda: bridge.deletes)
    Gauge("tessera_bridge_jobs", "Ray jobs followed", registry=registry).set_function(lambda: len(bridge.jobs))
    serve_metrics(registry, metrics_listen)
    log.info("bridge: following Ray job pods, metrics on %s", metrics_listen)
    while True:
        bridge.turn()
        time.sleep(interval_s)
