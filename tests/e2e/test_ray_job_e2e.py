"""The Ray training example on real nodes (issue 34 item 4): manifests/examples/ray-training-job.yaml, three members
and its driver, trains in containers of the `ray` image on the whole install of tests/e2e/test_install_e2e.py (the
extender's Deployment, the agent, the device plugin and the bridge as shipped), with a Ray runtime of its own in its
pods; one member's container is killed, and the job recovers without it, the bridge's replacement pod is bound by
Tessera and started by a kubelet, and the job grows back to three.

The example's steps as its header says (the namespace, the job's Ray token Secret), and what differs for this
machine, with why:
  * the image: `scripts/image-build.sh --target ray`'s, loaded into each node (no registry);
  * the claim `training-checkpoints` (ReadWriteMany, the header's prerequisite) is bound to a hostPath volume: both
    kubelets run on this one host, so one directory is shared as a network file system would be (the control plane
    runs the persistentvolume-binder controller for it);
  * CPU requests lowered to 100m (the limits stay): the two nodes share this machine's 2 cores, and each kubelet
    advertises both, so the example's four 1-CPU asks beside the install's pods would not fit;
  * no cluster DNS: the members' TESSERA_RAY_HEAD names the driver pod's IP instead of the headless Service's name
    (`resnet-demo-head.resnet-demo.svc`, whose DNS record is that IP), so the driver starts first. A hostAliases
    entry for the name is not enough: `ray start` resolved it through gRPC, which did not read /etc/hosts (it
    timed out connecting to the GCS while a plain socket in the same container connected). The bridge's
    replacement pods copy the spec, so they carry it too;
  * the job's `steps`: a million, not the example's 2000, which ended (Succeeded) in about 3 minutes here, before
    the kills were done;
  * the NetworkPolicy is applied but not enforced: the CNI bridge plugin does not implement NetworkPolicy.

Then the baseline, in the same run: the same job restarted the DDP way (every pod deleted and created again, resuming
from its newest checkpoint), timed from a kill to its first step after the restart.

Last, with the bridge back: a whole node stopped (its kubelet, its containers and containerd, its pod bridge), the
node the driver is not on. The job goes on with the members left; the node lifecycle controller (in the control
plane here, as on a cluster) taints the node unreachable after its 40-s grace, so nothing more is placed there; a
replacement bound there before that is never taken by a kubelet, and the job gives it up after UNCLAIMED_AFTER_S
(raybridge/job.py) so the bridge replaces it again.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import shutil
import statistics
import subprocess
import time
import urllib.request

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from raybridge.contract import LOST_ANNOTATION, PROGRESS_ANNOTATION, REPLACES_ANNOTATION
from tessera_contract import ASSIGNMENT_ANNOTATION
from testing.local_cluster import ROOT

from .harness import NODE_SUMMARY as SUMMARY
from .harness import until, write_node_summary
from .test_install_e2e import NODES, install, kubectl, kubectl_env  # noqa: F401  (install: this module's fixture too)
from .test_nodes_e2e import IMAGE_BUILD, node_sh

EXAMPLE = ROOT / "manifests/examples/ray-training-job.yaml"
JOB = "resnet-demo"
RAY_IMAGE_IN_EXAMPLE = "ghcr.io/tessera-sched/tessera:0.1.0-ray"
HEAD_NAME = f"{JOB}-head.{JOB}.svc"
TRAIN_CONFIG = "tessera.dev/train-config"
STEPS = 1_000_000  # the example's 2000 steps took about 3 minutes here: done before the third kill


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield SUMMARY
    write_node_summary()


def header_commands() -> list[str]:
    """The example header's two `kubectl` lines that come before applying it: the namespace and the Ray token."""
    lines = [ln.lstrip("#").strip() for ln in EXAMPLE.read_text().splitlines() if ln.startswith("#")]
    wanted = [ln for ln in lines if ln.startswith((f"kubectl create namespace {JOB}",
                                                   f"kubectl -n {JOB} create secret generic {JOB}-ray"))]
    assert len(wanted) == 2, f"{EXAMPLE.name}'s header no longer reads as this test expects: {wanted}"
    return wanted


def for_this_machine(obj: dict, ray_image: str, head_ip: str = "") -> dict:
    """A copy of one of the example's objects with the module docstring's changes (pods only)."""
    obj = copy.deepcopy(obj)
    if obj["kind"] != "Pod":
        return obj
    spec = obj["spec"]
    for c in spec["containers"]:
        assert c["image"] == RAY_IMAGE_IN_EXAMPLE, c["image"]
        c["image"], c["imagePullPolicy"] = ray_image, "Never"
        resources = c.setdefault("resources", {})
        resources.setdefault("requests", {})["cpu"] = "100m"
        if "memory" in resources.get("limits", {}):
            resources["requests"].setdefault("memory", resources["limits"]["memory"])
    annotations = obj["metadata"].get("annotations") or {}
    if TRAIN_CONFIG in annotations:
        config = json.loads(annotations[TRAIN_CONFIG])
        annotations[TRAIN_CONFIG] = json.dumps({**config, "steps": STEPS})
    if head_ip:
        for c in spec["containers"]:
            (head,) = [e for e in c["env"] if e["name"] == "TESSERA_RAY_HEAD"]
            assert head["value"] == f"{HEAD_NAME}:6379", head
            head["value"] = f"{head_ip}:6379"
    return obj


def apply(cp, work, name: str, objs: list[dict]) -> None:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    kubectl(cp, "apply", "-f", str(path))


def progress(pod) -> dict:
    return json.loads((pod.metadata.annotations or {}).get(PROGRESS_ANNOTATION) or "{}")


def job_pods(api) -> dict:
    return {p.metadata.name: p for p in api.list_namespaced_pod(JOB).items}


def step_of(driver_ip: str) -> float:
    """The driver's `tessera_ray_job_step` (its :9600/metrics): the last completed step."""
    try:
        text = urllib.request.urlopen(f"http://{driver_ip}:9600/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    found = re.search(rf'^tessera_ray_job_step{{job="{JOB}/{JOB}"}} ([0-9.e+]+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def ended(api, pod) -> str:
    """Why a pod's container ended (exit code, reason) and its log's last lines: what a failed wait needs to say, since
    CI keeps no node logs."""
    done = [c.state.terminated for c in pod.status.container_statuses or [] if c.state and c.state.terminated]
    if not done:
        return ""
    try:
        tail = api.read_namespaced_pod_log(pod.metadata.name, JOB, tail_lines=6)
    except ApiException as e:
        tail = f"(no log: {e.reason})"
    return f" exit {done[0].exit_code} {done[0].reason or ''} log: {tail.strip()!r}"


def state(api) -> str:
    """The job's pods: node, phase, progress, why any ended, and the host's free disk (Ray's session files and the
    images live there; this workplace has seen a machine with 287 MB free): a wait's failure message here."""
    pods = "; ".join(f"{n} {p.spec.node_name} {p.status.phase} {p.status.reason or ''}{progress(p)}{ended(api, p)}"
                     for n, p in sorted(job_pods(api).items()))
    return f"{pods}; host disk free {shutil.disk_usage('/').free / 2**30:.1f} GiB"


@pytest.fixture(scope="module")
def job(install, tmp_path_factory):  # noqa: F811  (the install fixture imported above)
    cp, api = install["cp"], install["api"]
    work = tmp_path_factory.mktemp("rayjob")
    built = subprocess.run([str(IMAGE_BUILD), "--target", "ray"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    ray_image, archive, size, *_ = built.stdout.split()
    SUMMARY["image_ray_mib"] = int(size)
    for name in NODES:
        node_sh("import", str(cp), name, archive)
    SUMMARY["disk_free_gib_at_ray_job"] = round(shutil.disk_usage("/").free / 2**30, 1)  # CI's log carries it
    for line in header_commands():
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], env=kubectl_env(cp), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
    shared = work / "checkpoints"
    shared.mkdir()
    shared.chmod(0o1777)  # the pods run as user 10001
    apply(cp, work, "claim", [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{JOB}-checkpoints"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
            "hostPath": {"path": str(shared)}, "claimRef": {"namespace": JOB, "name": "training-checkpoints"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "training-checkpoints", "namespace": JOB},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{JOB}-checkpoints",
                  "resources": {"requests": {"storage": "1Gi"}}}}])
    objs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    members = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"]["tessera.dev/ray-role"] == "member"]
    assert len(members) == 3, [o["metadata"]["name"] for o in members]
    t0 = time.monotonic()
    apply(cp, work, "job", [for_this_machine(o, ray_image) for o in objs if o not in members])

    def create_driver():
        (driver,) = [o for o in objs if o["kind"] == "Pod" and o not in members]
        apply(cp, work, "driver", [for_this_machine(driver, ray_image)])
        return until("the driver running with its pod IP", lambda: (
            p := api.read_namespaced_pod(f"{JOB}-driver", JOB)).status.phase == "Running" and p.status.pod_ip and p,
            timeout=180, every=0.05, describe=lambda: state(api))

    def create_members(head_ip: str) -> None:
        apply(cp, work, "members", [for_this_machine(o, ray_image, head_ip) for o in members])

    driver = create_driver()
    create_members(driver.status.pod_ip)
    yield {"cp": cp, "api": api, "apps": install["apps"], "driver_ip": driver.status.pod_ip, "t0": t0,
           "create_driver": create_driver, "create_members": create_members,
           "train_config": members[0]["metadata"]["annotations"][TRAIN_CONFIG]}
    kubectl(cp, "delete", "namespace", JOB, "--wait=false")


def none_ended(api, ps: dict) -> dict:
    """The job's pods, or an AssertionError with `state` at once if one has ended: nothing has been killed yet, and a
    job that has not started replaces no member (decide.repair), so waiting on would only wait out the timeout."""
    if any(p.status.phase in ("Failed", "Succeeded") for p in ps.values()):
        raise AssertionError(f"a pod of the job ended before it trained: {state(api)}")
    return ps


def test_the_example_trains_in_containers_on_its_own_ray_runtime(job):
    api = job["api"]
    pods = until("the three members bound by Tessera and running, and the job training with all three", lambda: (
        ps := none_ended(api, job_pods(api))) and all(ASSIGNMENT_ANNOTATION in (ps[f"{JOB}-{i}"].metadata.annotations or {})
                                                      and ps[f"{JOB}-{i}"].status.phase == "Running" for i in range(3))
        and step_of(job["driver_ip"]) >= 1 and progress(ps[f"{JOB}-0"]).get("world") == 3 and ps,
        timeout=300, describe=lambda: state(api))
    print(f"\n[rayjob] the example applied to training with 3 members: {time.monotonic() - job['t0']:.1f} s")
    assert {pods[f"{JOB}-{i}"].spec.node_name for i in range(3)} <= set(NODES)
    first = step_of(job["driver_ip"])
    later = until("steps completing", lambda: (s := step_of(job["driver_ip"])) > first and s, timeout=60)
    assert later > first


KILLS = 3  # one member's container each time, the replacement running before the next


def test_killed_members_containers_are_replaced_by_the_bridge_and_training_goes_on(job):
    """A member's container is killed (SIGKILL, as the OOM killer or a crash does; restartPolicy Never, so its pod
    fails), three times, a different member each time: the job goes on with two (one step redone at most), marks the
    pod lost, the bridge creates the replacement, Tessera binds it, a kubelet starts it, and the job grows back to
    three. Timed from the kill to the next step the driver's metric shows, and as the job records it (from the
    member's last proof of life)."""
    api, ip = job["api"], job["driver_ip"]
    kill_to_step, recorded, redone = [], [], []
    for i in range(KILLS):
        pods = job_pods(api)
        slot = f"{JOB}-{i}"
        (victim,) = [p for n, p in pods.items() if n == slot or n.startswith(f"{slot}-r") and p.status.phase == "Running"]
        before, seen = step_of(ip), max(progress(p).get("recoveries", 0) for p in pods.values())
        killed = time.monotonic()
        node_sh("kill", str(job["cp"]), victim.spec.node_name, victim.status.container_statuses[0].container_id)
        until("a step completed after the kill", lambda b=before: step_of(ip) > b, timeout=120, every=0.05)
        kill_to_step.append((time.monotonic() - killed) * 1000)
        rec = until("the job's record of the recovery on its pods", lambda n=seen: next((
            pr for p in job_pods(api).values() if (pr := progress(p)).get("recoveries", 0) > n), None), timeout=120,
            describe=lambda: state(api))
        recorded.append(rec["last_recovery_s"] * 1000)
        redone.append(rec["steps_redone"] - sum(redone))
        lost = f"{JOB}/{victim.metadata.name}"
        replacement = until("the replacement bound by Tessera and running, the job back to three", lambda lost=lost: next((
            p for p in job_pods(api).values() if (p.metadata.annotations or {}).get(REPLACES_ANNOTATION) == lost
            and ASSIGNMENT_ANNOTATION in p.metadata.annotations and p.status.phase == "Running"
            and progress(p).get("world") == 3), None), timeout=300, describe=lambda: state(api))
        print(f"\n[rayjob] kill {i + 1}: {victim.metadata.name}'s container; the next step {kill_to_step[-1]:.0f} ms later "
              f"(the job's record: {recorded[-1]:.0f} ms), {redone[-1]} step(s) redone; {replacement.metadata.name} on "
              f"{replacement.spec.node_name} training, world 3, {time.monotonic() - killed:.1f} s after the kill")
        assert redone[-1] <= 1, rec
    SUMMARY["ray_job_recovered"] = True
    SUMMARY["recovery_ms_median"] = round(statistics.median(kill_to_step))
    SUMMARY["recovery_recorded_ms_median"] = round(statistics.median(recorded))
    job["kill_to_step_ms"] = kill_to_step


def test_the_same_job_restarted_the_ddp_way_takes_its_pods_time(job):
    """The baseline, same job, same run: what a DDP job on Kubernetes does when one worker dies (a Job or a
    PyTorchJob restarts every pod; the bridge is scaled to zero first): a member's container is killed, every pod
    of the job is deleted at once (grace 0: the fastest restart there is; the detection by an operator is not
    counted) and the example's pods are created again; the new trainers resume from the newest checkpoint on the
    shared claim. Timed from the kill to the first step completed after the restart."""
    api, cp = job["api"], job["cp"]
    # no bridge, as a DDP job has none: else it replaces the killed member into the restarted job (CI: five members)
    job["apps"].patch_namespaced_deployment_scale("tessera-bridge", "tessera-system", {"spec": {"replicas": 0}})
    until("no bridge pod", lambda: not api.list_namespaced_pod(
        "tessera-system", label_selector="app.kubernetes.io/name=tessera-bridge").items, timeout=120)
    pods = job_pods(api)
    (victim,) = [p for p in pods.values() if p.status.phase == "Running" and p.metadata.name.startswith(f"{JOB}-2")]
    killed = time.monotonic()
    node_sh("kill", str(cp), victim.spec.node_name, victim.status.container_statuses[0].container_id)
    at_stop = step_of(job["driver_ip"])  # the elastic job trains on until its driver goes: the driver first
    for name in sorted(pods, key=lambda n: n != f"{JOB}-driver"):
        api.delete_namespaced_pod(name, JOB, grace_period_seconds=0)

    def gone() -> bool:
        """None left (a pod created while they were deleted is deleted too)."""
        left = job_pods(api)
        for name in left:
            try:
                api.delete_namespaced_pod(name, JOB, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise
        return not left
    until("the job's pods gone", gone, timeout=120, every=1, describe=lambda: state(api))
    driver = job["create_driver"]()
    job["create_members"](driver.status.pod_ip)
    ip = driver.status.pod_ip
    step = until("the first step after the restart", lambda: (s := step_of(ip)) >= 1 and s, timeout=300, every=0.05,
                 describe=lambda: state(api))
    restart_ms = (time.monotonic() - killed) * 1000
    print(f"\n[rayjob] DDP-style restart: the first step after it (step {step:.0f}; {at_stop:.0f} when it was stopped) "
          f"{restart_ms:.0f} ms after the kill; the bridge's recovery: median {statistics.median(job['kill_to_step_ms']):.0f} ms")
    SUMMARY["ddp_restart_ms_median"] = round(restart_ms)
    every = json.loads(job["train_config"])["checkpoint_every"]
    assert at_stop - every - 1 <= step <= at_stop + every, (step, at_stop)  # from its newest checkpoint, not from scratch
    assert restart_ms > statistics.median(job["kill_to_step_ms"])


def ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def bridge_pod(api):
    """The bridge's one pod (None while there is none or more than one, or it is being deleted)."""
    pods = [p for p in api.list_namespaced_pod("tessera-system", label_selector="app.kubernetes.io/name=tessera-bridge").items
            if not p.metadata.deletion_timestamp]
    return pods[0] if len(pods) == 1 else None


def members_training(api, world: int = 3) -> dict:
    """The job's live members (not lost, not deleting), when they are `world` many, Running and the job at that world."""
    live = {n: p for n, p in job_pods(api).items() if n != f"{JOB}-driver" and not p.metadata.deletion_timestamp
            and LOST_ANNOTATION not in (p.metadata.annotations or {}) and p.status.phase == "Running"}
    return live if len(live) == world and all(progress(p).get("world") == world for p in live.values()) else {}


def test_a_stopped_node_takes_its_members_and_the_job_comes_back_on_the_other(job):
    """The node the driver is not on is stopped whole, as a machine going down: its kubelet, every container it
    ran (members, an extender replica if one was there), its containerd and its pod bridge. The bridge runs on the
    node kept, as it mostly will on a cluster (moved there first if it was not; with the bridge on the lost node, the
    replacement came 74 s after the stop, once the bridge's 30-s toleration of the taint had moved it).
    The job goes on without the members it lost (one step redone at most), and gets back to three members, all on
    the node left, each bound by Tessera and started by a kubelet. Runs last: the node does not come back."""
    api, apps, cp = job["api"], job["apps"], job["cp"]
    apps.patch_namespaced_deployment_scale("tessera-bridge", "tessera-system", {"spec": {"replicas": 1}})
    until("the bridge back", lambda: (b := bridge_pod(api)) and ready(b), timeout=180)
    driver = api.read_namespaced_pod(f"{JOB}-driver", JOB)
    ip, keep = driver.status.pod_ip, driver.spec.node_name
    (gone_node,) = [n for n in NODES if n != keep]
    members = until("the restarted job training with three", lambda: members_training(api), timeout=300,
                    describe=lambda: state(api))
    if not any(p.spec.node_name == gone_node for p in members.values()):  # all on the driver's node: move one over
        kubectl(cp, "cordon", keep)
        victim = next(iter(members.values()))
        node_sh("kill", str(cp), keep, victim.status.container_statuses[0].container_id)
        members = until("a replacement on the other node, the job at three", lambda: (ms := members_training(api)) and any(
            p.spec.node_name == gone_node for p in ms.values()) and ms, timeout=300, describe=lambda: state(api))
        kubectl(cp, "uncordon", keep)
    bridge = bridge_pod(api)
    if bridge.spec.node_name == gone_node:  # the usual case on a cluster: the bridge on another node than the lost one
        kubectl(cp, "cordon", gone_node)
        api.delete_namespaced_pod(bridge.metadata.name, "tessera-system")
        until("the bridge moved to the node kept", lambda: (b := bridge_pod(api)) and b.metadata.name != bridge.metadata.name
              and b.spec.node_name == keep and ready(b), timeout=180)
        kubectl(cp, "uncordon", gone_node)
    lost = sorted(n for n, p in members.items() if p.spec.node_name == gone_node)
    before = step_of(ip)
    seen = max(progress(p).get("recoveries", 0) for p in job_pods(api).values())
    redone_before = max(progress(p).get("steps_redone", 0) for p in job_pods(api).values())
    there = sorted(p.metadata.name for p in api.list_namespaced_pod("tessera-system").items if p.spec.node_name == gone_node)
    names_before = set(job_pods(api))
    stopped, stopped_at = time.monotonic(), datetime.datetime.now(datetime.UTC)
    node_sh("stop", str(cp), gone_node)
    until("a step completed after the node stopped", lambda: step_of(ip) > before, timeout=120, every=0.05)
    to_step_ms = (time.monotonic() - stopped) * 1000
    rec = until("the job's record of the recovery", lambda: next((pr for p in job_pods(api).values() if (
        pr := progress(p)).get("recoveries", 0) > seen), None), timeout=120, describe=lambda: state(api))
    tainted = until("the node tainted unreachable by the node lifecycle controller", lambda: any(
        t.key == "node.kubernetes.io/unreachable" for t in api.read_node(gone_node).spec.taints or []), timeout=180)
    tainted_s = time.monotonic() - stopped
    back = until("three members again, all on the node left, bound by Tessera", lambda: (ms := members_training(api)) and all(
        p.spec.node_name == keep and ASSIGNMENT_ANNOTATION in p.metadata.annotations for p in ms.values()) and ms,
        timeout=420, describe=lambda: state(api))
    back_s = time.monotonic() - stopped
    made = sorted(((p.metadata.creation_timestamp - stopped_at).total_seconds(), n, p.spec.node_name, p.status.phase)
                  for n, p in job_pods(api).items() if n not in names_before)
    print(f"\n[rayjob] node {gone_node} stopped with {', '.join(lost)} and tessera-system's {there}: the next step "
          f"{to_step_ms:.0f} ms after the stop began (the job's record: {rec['last_recovery_s'] * 1000:.0f} ms), the node "
          f"tainted {tainted_s:.1f} s after, three members again on {keep} {back_s:.1f} s after ({sorted(back)}); "
          f"replacements (created s after the stop, pod, node, phase): {made}")
    assert tainted
    assert len(set(back) - set(members)) == len(lost), (sorted(back), lost)  # each lost member replaced, the others kept
    assert rec["steps_redone"] - redone_before <= 1, rec
    SUMMARY["node_stop_recovered"] = True
    SUMMARY["node_stop_recovery_ms"] = round(to_step_ms)
    SUMMARY["node_stop_world_back_s"] = round(back_s, 1)
