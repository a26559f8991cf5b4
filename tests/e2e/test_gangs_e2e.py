"""Gangs as real jobs arrive (issue 33), through the real kube-scheduler 1.20.2 with the shipped scheduler config,
`tessera serve`, and the real Job controller and garbage collector (conftest's `controllers` cluster).

Members come the way controllers make them: a few, then the last one seconds later; one a second; 64 from one
Job; 160 from 20 gangs created member by member in turn. Each scenario has nodes of its own (a taint and a
label its pods tolerate and select), so they do not share room. Times are printed (run with -s to read them).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tessera_contract import ASSIGNMENT_ANNOTATION

from .harness import until

NS = "default"
ROOT = Path(__file__).resolve().parents[2]
GROUP_KEY = "e2e-gangs/group"


def make_nodes(env, group: str, count: int, gpus: int = 8, taint: bool = True, first: int = 0) -> list[str]:
    core = env["core"]
    names = [f"{group}-{i}" for i in range(first, first + count)]
    for name in names:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": "A100", "kubernetes.io/hostname": name, GROUP_KEY: group}}}
        if taint:
            body["spec"] = {"taints": [{"key": GROUP_KEY, "value": group, "effect": "NoSchedule"}]}
        core.create_node(body)
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
    until(f"{group} nodes in tessera's cache",
          lambda: set(names) <= {n["name"] for n in env["extender"].inspect()["nodes"]}, timeout=30)
    return names


def pod_spec(group: str, gpus: int = 1) -> dict:
    """On `group`'s nodes only; grace 0: no kubelet here confirms a deletion, a default grace would leave it Terminating."""
    return {"containers": [{"name": "c", "image": "none", "resources": {"limits": {
                "cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)}}}],
            "nodeSelector": {GROUP_KEY: group}, "tolerations": [{"key": GROUP_KEY, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0}


def make_member(env, name: str, group: str, gang: str = "", size: int = 0, labels: dict | None = None) -> None:
    annotations = {"tessera.dev/gang-name": gang, "tessera.dev/gang-size": str(size)} if gang else {}
    env["core"].create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "annotations": annotations, "labels": labels or {}}, "spec": pod_spec(group)})


def nodes_of(env, names: list[str]) -> dict[str, str]:
    """name -> node for those of `names` bound (with Tessera's assignment), read in one list call."""
    pods = env["core"].list_namespaced_pod(NS).items
    wanted = set(names)
    return {p.metadata.name: p.spec.node_name for p in pods if p.metadata.name in wanted and p.spec.node_name
            and ASSIGNMENT_ANNOTATION in (p.metadata.annotations or {})}


def events(env, name: str) -> list[str]:
    return [e.message for e in env["core"].list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items]


def holders(env, prefix: str) -> list[str]:
    seen = env["extender"].inspect()
    return [h["pod"] for n in seen["nodes"] for g in n["gpus"] for h in g["holders"] if h["pod"].startswith(f"{NS}/{prefix}")]


def delete_pods(env, names) -> None:
    for name in names:
        env["core"].delete_namespaced_pod(name, NS, grace_period_seconds=0)


@pytest.fixture(scope="module")
def env(controllers):
    return controllers


def test_a_gang_whose_last_member_comes_4_s_late_and_one_made_a_member_a_second_are_bound_within_a_minute(env):
    """The field's normal case: a controller creates members over seconds. Before: nothing bound after 6-7 min."""
    make_nodes(env, "late", 2)
    late = [f"late-{i}" for i in range(4)]
    for name in late[:3]:
        make_member(env, name, "late", "late", 4)
    time.sleep(4.0)
    assert not nodes_of(env, late), "a member was bound before its gang was complete"
    make_member(env, late[3], "late", "late", 4)
    last = time.monotonic()
    until("the late gang bound", lambda: len(nodes_of(env, late)) == 4, timeout=60,
          describe=lambda: {n: events(env, n)[-2:] for n in late})
    took_late = time.monotonic() - last

    drip = [f"drip-{i}" for i in range(4)]
    for name in drip:
        make_member(env, name, "late", "drip", 4)
        if name != drip[-1]:
            time.sleep(1.0)
            assert not nodes_of(env, drip), "a member was bound before its gang was complete"
    last = time.monotonic()
    until("the drip gang bound", lambda: len(nodes_of(env, drip)) == 4, timeout=60,
          describe=lambda: {n: events(env, n)[-2:] for n in drip})
    print(f"\ngang of 4, last member 4 s late: bound {took_late:.1f} s after it; one a second: "
          f"{time.monotonic() - last:.1f} s after the last")


def job(name: str, group: str, size: int) -> dict:
    template = {"metadata": {"annotations": {"tessera.dev/gang-name": name, "tessera.dev/gang-size": str(size)}},
                "spec": {**pod_spec(group), "restartPolicy": "Never"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"parallelism": size, "completions": size, "backoffLimit": 0, "template": template}}


def job_pods(env, name: str) -> list:
    return env["core"].list_namespaced_pod(NS, label_selector=f"job-name={name}").items


def test_a_job_of_64_is_bound_whole_on_8_nodes_and_not_at_all_on_7(env):
    nodes = make_nodes(env, "job64", 8)
    env["batch"].create_namespaced_job(NS, job("wide", "job64", 64))
    created = time.monotonic()

    def bound():
        pods = job_pods(env, "wide")
        return len([p for p in pods if p.spec.node_name]) == 64

    until("64 Job pods bound", bound, timeout=180, every=1.0,
          describe=lambda: sorted({(p.spec.node_name or "") for p in job_pods(env, "wide")}))
    took = time.monotonic() - created
    per_node = {}
    for p in job_pods(env, "wide"):
        per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
    assert per_node == dict.fromkeys(nodes, 8), per_node
    env["batch"].delete_namespaced_job("wide", NS, propagation_policy="Background")
    until("the Job's pods gone", lambda: not job_pods(env, "wide"), timeout=60)

    env["core"].delete_node(nodes[-1])  # 7 nodes: 56 GPUs for 64 members
    until("7 job64 nodes in tessera's cache", lambda: nodes[-1] not in {n["name"] for n in env["extender"].inspect()["nodes"]},
          timeout=30)
    env["batch"].create_namespaced_job(NS, job("narrow", "job64", 64))
    until("64 pods of the narrow Job", lambda: len(job_pods(env, "narrow")) == 64, timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # none bound, nothing held for it, at any moment
        assert not [p for p in job_pods(env, "narrow") if p.spec.node_name]
        assert not holders(env, "narrow"), "GPUs held for a gang that cannot fit"
        time.sleep(1.0)
    mine = {p.metadata.name for p in job_pods(env, "narrow")}
    said = [e.message for e in env["core"].list_namespaced_event(NS).items if e.involved_object.name in mine]
    assert any("gang default/narrow needs 64 pods placed together; only 56 fit now" in m for m in said), said[-4:]
    print(f"\nJob of 64 on 8 x 8 GPUs: all bound {took:.1f} s after creation; on 7 nodes none bound, nothing held for 20 s")
    make_nodes(env, "job64", 1, first=7)  # the node back: kube-scheduler retries them, the gang is admitted
    back = time.monotonic()
    until("the narrow Job bound once its 8th node is back", lambda: len([p for p in job_pods(env, "narrow")
                                                                         if p.spec.node_name]) == 64,
          timeout=180, every=1.0)
    print(f"the 8th node back: the waiting Job of 64 bound {time.monotonic() - back:.1f} s later")
    env["batch"].delete_namespaced_job("narrow", NS, propagation_policy="Background")


def test_twenty_gangs_of_8_created_in_turn_on_room_for_10_run_10_whole_and_the_rest_as_those_leave(env):
    make_nodes(env, "turns", 10)
    names = {g: [f"turns-{g:02d}-{m}" for m in range(8)] for g in range(20)}
    for m in range(8):  # member m of every gang, then member m + 1: the worst order for all-or-nothing
        for g in range(20):
            make_member(env, names[g][m], "turns", f"turns-{g:02d}", 8)
    everyone = [n for ns in names.values() for n in ns]

    def complete() -> set[int]:
        bound = nodes_of(env, everyone)
        counts = {g: sum(1 for n in ns if n in bound) for g, ns in names.items()}
        partial = {g: c for g, c in counts.items() if 0 < c < 8}
        assert not partial or time.monotonic() < partial_ok_until[0], f"gangs partly bound: {partial}"
        return {g for g, c in counts.items() if c == 8}

    def ten():
        done = complete()
        return done if len(done) == 10 else None

    partial_ok_until = [time.monotonic() + 3600]  # while Tessera binds a gang's members one API call at a time
    created = time.monotonic()
    first = until("10 gangs bound", ten, timeout=120, every=1.0)
    took_first, refills = time.monotonic() - created, []
    time.sleep(5.0)
    partial_ok_until[0] = 0.0  # settled: no gang may be partly bound from here on, between binding bursts
    assert complete() == first
    waiting = set(range(20)) - first
    for g in sorted(first):
        before = complete()
        delete_pods(env, names[g])
        partial_ok_until[0] = time.monotonic() + 10  # one gang's members are written over a second or so

        def another(before=before):
            return complete() - before

        left = time.monotonic()
        until(f"another gang bound once gang {g} left", another, timeout=90, every=1.0)
        refills.append(time.monotonic() - left)
    time.sleep(3.0)
    partial_ok_until[0] = 0.0
    assert complete() == waiting
    print(f"\n20 gangs of 8 on room for 10: 10 ran whole {took_first:.1f} s after the last member was created; each of "
          f"the other 10 ran within {max(refills):.1f} s of a gang leaving (median {sorted(refills)[len(refills) // 2]:.1f} s)")


def test_the_shipped_gang_job_example_runs_on_the_local_cluster(env):
    make_nodes(env, "example", 2, gpus=4, taint=False)
    body = yaml.safe_load((ROOT / "manifests/examples/gang-job.yaml").read_text())
    env["batch"].create_namespaced_job(NS, body)
    name = body["metadata"]["name"]
    until("the example's 4 pods bound", lambda: len([p for p in job_pods(env, name) if p.spec.node_name]) == 4,
          timeout=90, every=1.0, describe=lambda: [events(env, p.metadata.name)[-1:] for p in job_pods(env, name)])
    for p in job_pods(env, name):
        assert len(p.metadata.annotations[ASSIGNMENT_ANNOTATION].split('"gpus":[')[1].split("]")[0].split(",")) == 2


def test_a_podgroup_of_min_member_3_with_4_pods_is_bound_once_3_fit(env):
    """scheduler-plugins' PodGroup, as Kubeflow's training operator makes one: the pods carry its label."""
    make_nodes(env, "pg", 1, gpus=4)
    blockers = ["pg-block-0", "pg-block-1"]
    for name in blockers:
        make_member(env, name, "pg")
    until("the blockers bound", lambda: len(nodes_of(env, blockers)) == 2, timeout=60)
    env["custom"].create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", NS, "podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "trainer"},
        "spec": {"minMember": 3}})
    members = [f"pg-m-{i}" for i in range(4)]
    for name in members:
        make_member(env, name, "pg", labels={"scheduling.x-k8s.io/pod-group": "trainer"})
    time.sleep(8.0)  # 2 GPUs free for minMember 3: none may be bound
    assert not nodes_of(env, members), "a PodGroup member bound before minMember could be placed"
    said = [m for name in members for m in events(env, name)]
    assert any("PodGroup default/trainer needs 3 pods placed together; only 2 fit now" in m for m in said), said[:4]
    delete_pods(env, blockers[:1])
    freed = time.monotonic()
    until("3 of the PodGroup's pods bound", lambda: len(nodes_of(env, members)) == 3, timeout=60,
          describe=lambda: {n: events(env, n)[-1:] for n in members})
    took = time.monotonic() - freed
    time.sleep(3.0)
    assert len(nodes_of(env, members)) == 3  # the fourth waits for room: one GPU each, none left
    print(f"\nPodGroup minMember 3, 4 pods: 3 bound {took:.1f} s after room for 3 came")


def test_a_gang_whose_members_keep_apart_is_bound_by_kube_scheduler_one_per_node(env):
    """Required anti-affinity between a gang's own members: kube-scheduler judges it as siblings bind, so Tessera
    leaves those binds to it. A member refused while its gang was incomplete comes back only at kube-scheduler's
    flush of its unschedulable queue (up to 90 s: 1.20 moves a pod on a sibling's bind for pod affinity, not
    anti-affinity), and the GPUs held for it outlast that (gangs.PEER_HOLD_S): before, they lapsed at 60 s, and the
    gang waited out a backoff and a second flush."""
    nodes = make_nodes(env, "apart", 2, gpus=4)
    names = [f"apart-{i}" for i in range(2)]
    for name in names:
        spec = pod_spec("apart")
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"gang": "apart"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        env["core"].create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "labels": {"gang": "apart"},
            "annotations": {"tessera.dev/gang-name": "apart", "tessera.dev/gang-size": "2"}}, "spec": spec})
        if name == names[0]:  # as a controller does, the second some seconds later: the first has been refused
            until("the first refused, its gang incomplete",
                  lambda: any("to be created" in m for m in events(env, names[0])), timeout=60)
    last = time.monotonic()
    def both():
        found = nodes_of(env, names)
        return found if len(found) == 2 else None

    bound = until("both bound", both, timeout=150, describe=lambda: {n: events(env, n)[-2:] for n in names})
    assert sorted(bound.values()) == sorted(nodes), bound  # one per node, as their anti-affinity says
    print(f"\ngang of 2 that keeps apart: bound one per node {time.monotonic() - last:.1f} s after the last was created")
