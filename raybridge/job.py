"""The job's own runtime: what runs inside a Ray job's pods, under the job's ServiceAccount.

Why here and not in the bridge: the job's code (its entrypoint, its checkpoints, its trainers'
results) is the tenant's. It runs in the pods Tessera admitted for that job, in its namespace,
with its identity, in a Ray cluster of its own that no other job joins (a per-job Ray token), so
nothing it does reaches another job or a privileged identity.

Three entries (`python -m raybridge.job ...`, or `tessera job ...`):
  * `driver`: the job's head, a small pod of its own (no GPU) in the job's namespace. Starts the
    job's Ray head (no dashboard, token auth) and runs `JobRunner`: reads the job's pods (list in
    its own namespace), starts the trainers once the gang is bound, lets `JobController` recover
    them, and writes phase and progress on the job's own pods (patch in its own namespace). A
    member whose trainer it lost gets `tessera.dev/ray-lost`, so the bridge replaces that pod.
  * `member`: each admitted gang pod. Joins the job's Ray cluster as a node that advertises only
    its own assignment: one `tessera-pod:<ns>.<name>` resource (its trainer lands there and
    nowhere else) and the number of GPUs Tessera assigned it.
  * `train`: the same recovery on any Ray cluster, no Kubernetes (docs/raybridge.md, "Plain Ray").

The job's ServiceAccount needs: pods list, patch in its own namespace (manifests/examples/
ray-training-job.yaml has the Role). Nothing cluster-wide. RBAC cannot narrow that patch to the
job's own pods, and a check here would bind nothing (this runs beside the tenant's code, under the
same account): the namespace is the job's alone (docs/raybridge.md, "One namespace per job").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field

from .contract import LOST_ANNOTATION, PHASE_ANNOTATION, PROGRESS_ANNOTATION, ContractError, JobSpec, Member, Slice
from .decide import decide, group_jobs

log = logging.getLogger("tessera.job")
MIN_TOKEN = 32  # characters of the job's Ray token (RAY_AUTH_TOKEN)


class OwnPods:
    """The job's view of Kubernetes: its own namespace only, as its own ServiceAccount."""

    def __init__(self, api, namespace: str) -> None:
        self.api, self.namespace = api, namespace

    def snapshot(self) -> list[dict]:
        listed = self.api.list_namespaced_pod(self.namespace)
        return [self.api.api_client.sanitize_for_serialization(p) for p in listed.items]

    def annotate(self, key: str, annotations: dict[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        ns, name = key.split("/", 1)
        if ns != self.namespace:
            raise ValueError(f"{key}: the job writes only pods of its own namespace {self.namespace}")
        try:
            self.api.patch_namespaced_pod(name, ns, {"metadata": {"annotations": annotations}})
        except ApiException as e:
            log.warning("annotate %s: %s %s", key, e.status, e.reason)


# A replacement bound to a node whose kubelet stopped stays Pending there: nothing tells Ray, and Kubernetes evicts
# it only after the node's taint toleration (300 s by default; DefaultTolerationSeconds), and even then it stays
# Terminating until the node returns. A kubelet takes a pod bound to it within a second of the bind (its own watch);
# 60 s leaves room for a kubelet that restarts or is slow under load, and gives the node lifecycle controller
# (40-s grace) time to taint the node, so that the next replacement is placed elsewhere (tests/e2e/test_ray_job_e2e.py).
UNCLAIMED_AFTER_S = 60.0


@dataclass
class _State:
    spec: JobSpec
    controller: object
    lost: set[str] = field(default_factory=set)
    marked: set[str] = field(default_factory=set)  # members already marked lost on their pod
    superseded: set[str] = field(default_factory=set)  # lost members whose replacement pod exists
    unclaimed_since: dict[str, float] = field(default_factory=dict)  # bound pods no kubelet took yet: first seen
    written_at: float = 0.0
    written_shape: tuple = ()
    done: bool = False


class JobRunner:
    """One job's loop, inside the job: the pods say who is bound; the controller trains and recovers."""

    def __init__(self, pods, gang: str, options: dict | None = None, steps_per_turn: int = 20,
                 progress_every_s: float = 30.0, pod_resources: bool = True, controller_factory=None,
                 metrics=None, unclaimed_after_s: float = UNCLAIMED_AFTER_S) -> None:
        self.pods, self.gang = pods, gang
        self.unclaimed_after_s = unclaimed_after_s
        self.metrics = metrics  # the controller's JobMetrics (the driver serves its registry); None: its own
        self.options = options or {}
        self.steps_per_turn, self.progress_every_s = steps_per_turn, progress_every_s
        self.pod_resources = pod_resources
        self.state: _State | None = None
        self._factory = controller_factory
        self.waiting = ""

    def _members(self) -> tuple[Member, ...]:
        jobs = group_jobs([p for p in self.pods.snapshot() if _gang(p) == self.gang])
        for error in jobs.errors:
            log.warning("%s", error)
        members = [ms for ms in jobs.members.values()]
        return members[0] if members else ()

    def turn(self) -> bool:
        """One pass; False once the job is done (or every pod is gone)."""
        members = self._members()
        st = self.state
        if not members:
            if st is not None:
                st.controller.close()
            return st is None
        if st is not None and all(m.deleting for m in members):
            log.info("job %s: all its pods are being deleted, stopping its trainers", st.spec.key)
            st.controller.close()
            return False
        if st is None and all(m.job_phase == "Succeeded" for m in members):
            return False
        if st is not None:
            st.lost.update(st.controller.take_lost())
        running = None if st is None else frozenset(st.controller.group.actors) | frozenset(st.controller.joining)
        d = decide(members, running, frozenset(st.lost) if st else frozenset(), frozenset(), st.done if st else False)
        self.waiting = d.waiting
        if d.start:
            st = self._start(members[0].job, dict(d.start))
        if st is None:
            return True
        for name, s in d.add:
            log.info("job %s: pod %s bound on %s, its trainer joins", st.spec.key, name, s.node)
            st.controller.add(name, self._placed(name, s))
        for name in d.remove:
            st.controller.remove(name)
            st.lost.add(name)
        for name in self._unclaimed(st, members):
            log.warning("job %s: pod %s is bound but no kubelet took it in %.0f s (its node is down?): its trainer is "
                        "given up and the pod marked lost, so the bridge replaces it", st.spec.key, name, self.unclaimed_after_s)
            st.controller.abandon(name)
            st.lost.add(name)
        by_key = {m.key: m for m in members}
        st.superseded = {m.replaces for m in members if m.replaces}
        for name in sorted(st.lost - st.marked):  # the bridge replaces a pod the job marks lost
            if name in by_key and not by_key[name].lost:
                self.pods.annotate(name, {LOST_ANNOTATION: "trainer lost"})
            st.marked.add(name)
        self._train(st, by_key)
        return not st.done

    def _unclaimed(self, st: _State, members: tuple[Member, ...]) -> list[str]:
        """Bound pods of the running job that no kubelet has taken for unclaimed_after_s (UNCLAIMED_AFTER_S)."""
        now = time.monotonic()
        waiting = {m.key for m in members if m.slice is not None and not m.claimed and not m.lost and m.key not in st.lost}
        st.unclaimed_since = {k: st.unclaimed_since.get(k, now) for k in waiting}
        return sorted(k for k, t in st.unclaimed_since.items() if now - t >= self.unclaimed_after_s)

    def _placed(self, name: str, s: Slice) -> Slice:
        """The slice with the pod's own Ray resource (the member advertises it) when running in pods."""
        if not self.pod_resources:
            return s
        return Slice(s.node, s.gpus, s.milli, s.uuids, pod=name)

    def _start(self, spec: JobSpec, slices: dict[str, Slice]) -> _State:
        from .controller import JobController, Options

        config = spec.config
        factory = self._factory or (lambda: JobController(spec.key, spec.entrypoint, config,
                                                          Options.from_config(config, **self.options), self.metrics))
        ctl = factory()
        st = self.state = _State(spec, ctl)
        log.info("job %s: gang of %d bound, starting trainers", spec.key, spec.size)
        ctl.start({name: self._placed(name, s) for name, s in slices.items()})
        self._write(st, set(slices), force=True)
        return st

    def _train(self, st: _State, by_key: dict) -> None:
        from .controller import JobFailed

        if st.done:
            return
        target = st.spec.config.get("steps")
        ctl = st.controller
        try:
            for _ in range(self.steps_per_turn):
                if target is not None and ctl.step_done >= int(target):
                    ctl.run(int(target))  # marks Succeeded
                    st.done = True
                    break
                report = ctl.step()
                if report.recovery:
                    r = report.recovery
                    log.info("job %s: recovered from losing %s in %.3f s (detected after %.3f s), %d step(s) redone, "
                             "world %d", st.spec.key, ", ".join(r.lost), r.seconds, r.detection_s, r.redone, r.world)
                if ctl.has_lost:
                    break  # let the next turn mark the lost pods at once: their replacements start sooner
        except JobFailed as e:
            log.warning("%s", e)
        self._write(st, set(by_key), force=st.done)
        if st.done:
            ctl.close()

    def _write(self, st: _State, present: set[str], force: bool = False) -> None:
        now = time.monotonic()
        ctl = st.controller
        recs = ctl.history.recoveries
        # each patch is an event for every watcher of pods: phase, world or recoveries at once, the step now and then
        shape = (ctl.phase, ctl.world, len(recs))
        if not force and shape == st.written_shape and now - st.written_at < self.progress_every_s:
            return
        st.written_at, st.written_shape = now, shape
        progress = {"step": ctl.step_done, "world": ctl.world,
                    "loss": round(ctl.history.losses.get(ctl.step_done, 0.0), 6),
                    "recoveries": len(recs), "steps_redone": sum(r.redone for r in recs),
                    "last_recovery_s": round(recs[-1].total_s, 3) if recs else None,
                    "last_detection_s": round(recs[-1].detection_s, 3) if recs else None,
                    # trainers lost whose pods are gone and not replaced yet: a restarted bridge replaces them from this
                    "gone": sorted(k for k in st.lost if k not in present and k not in st.superseded)[:st.spec.size]}
        for name in (set(ctl.group.members) | set(ctl.joining)) & present:
            self.pods.annotate(name, {PHASE_ANNOTATION: ctl.phase, PROGRESS_ANNOTATION: json.dumps(progress, sort_keys=True)})


def _gang(pod: dict) -> str:
    from tessera_contract import GANG_NAME_ANNOTATION

    return ((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_NAME_ANNOTATION, "")


# --- entries ---------------------------------------------------------------------------------------

def require_token(env: dict) -> str:
    """The job's Ray token (from its Secret): Ray refuses every connection without it."""
    token = env.get("RAY_AUTH_TOKEN", "")
    if env.get("RAY_AUTH_MODE") != "token" or len(token) < MIN_TOKEN:
        raise ContractError(f"the job's Ray cluster needs RAY_AUTH_MODE=token and a RAY_AUTH_TOKEN of at least {MIN_TOKEN} "
                            "characters from the job's Secret (docs/raybridge.md); refusing to start an open Ray cluster")
    return token


def member_resources(namespace: str, name: str, assignment: str) -> tuple[dict[str, float], int]:
    """What a member pod's Ray node advertises: its own pod resource, and its assigned GPUs only."""
    from tessera_contract import RequestError, decode_assignment

    from .placement import pod_resource

    try:
        gpus = len(decode_assignment(assignment, f"pod {namespace}/{name}").gpus) if assignment else 0
    except RequestError as e:
        raise ContractError(str(e)) from None
    return {pod_resource(f"{namespace}/{name}"): 1000.0}, gpus


def member_command(env: dict) -> list[str]:
    """`ray start` for a member pod, from its environment (downward API and the job's Secret)."""
    require_token(env)
    for key in ("TESSERA_RAY_HEAD", "POD_NAME", "POD_NAMESPACE"):
        if not env.get(key):
            raise ContractError(f"the member pod needs {key} in its environment (manifests/examples/ray-training-job.yaml)")
    resources, gpus = member_resources(env["POD_NAMESPACE"], env["POD_NAME"], env.get("TESSERA_GPU_ASSIGNMENT", ""))
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={env['TESSERA_RAY_HEAD']}",
           f"--resources={json.dumps(resources, sort_keys=True)}", f"--num-gpus={gpus}",
           f"--num-cpus={int(env.get('TESSERA_RAY_CPUS', '1'))}", "--disable-usage-stats", "--block"]
    if env.get("POD_IP"):
        cmd.append(f"--node-ip-address={env['POD_IP']}")
    return cmd


def head_command(env: dict, port: int = 6379) -> list[str]:
    """`ray start --head` for the job's driver pod: no dashboard, no GPUs, token auth."""
    require_token(env)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--include-dashboard=false",
           "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats"]
    if env.get("POD_IP"):
        cmd.append(f"--node-ip-address={env['POD_IP']}")
    return cmd


def _driver(args) -> int:
    import subprocess

    from kubernetes import client, config

    from .metrics import JobMetrics, serve_metrics

    env = dict(os.environ)
    subprocess.run(head_command(env), check=True)
    import ray

    ray.init(address="auto", include_dashboard=False, log_to_driver=False)
    config.load_incluster_config()
    api = client.CoreV1Api()
    host = env.get("POD_IP") or "127.0.0.1"
    metrics = JobMetrics()
    runner = JobRunner(OwnPods(api, env["POD_NAMESPACE"]), args.gang, {"rendezvous_host": host, "detached": False},
                       progress_every_s=args.progress_every, metrics=metrics)
    serve_metrics(metrics.registry, args.metrics_listen)
    while runner.turn():
        time.sleep(args.interval)
    return 0


def _member(_args) -> int:
    cmd = member_command(dict(os.environ))
    os.execv(cmd[0], cmd)
    return 1


def _listen(value: str) -> str:
    """--metrics-listen read as argparse reads a flag: a bad one is said in one line, before the Ray head starts."""
    from .metrics import listen_address

    try:
        listen_address(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--metrics-listen ")) from None
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raybridge.job", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("driver", help="the job's Ray head and controller (the job's driver pod)")
    d.add_argument("--gang", required=True, help="the job's tessera.dev/gang-name")
    d.add_argument("--interval", type=float, default=0.05)
    d.add_argument("--progress-every", type=float, default=30.0)
    d.add_argument("--metrics-listen", type=_listen, default="0.0.0.0:9600",
                   help="HOST:PORT where the driver serves the job's tessera_ray_job_* metrics (default 0.0.0.0:9600)")
    d.set_defaults(run=_driver)
    m = sub.add_parser("member", help="join the job's Ray cluster with this pod's assignment (a gang pod)")
    m.set_defaults(run=_member)
    from .plain import add_train_parser

    add_train_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except ContractError as e:
        print(f"raybridge.job: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
