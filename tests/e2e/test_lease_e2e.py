"""Leader election on a real coordination.k8s.io/v1 Lease in the 1.20.2 apiserver."""

from __future__ import annotations

import threading
import time

from kubernetes import client, config

from extender.kube.lease import LEADER_URL_ANNOTATION, LeaseConfig, LeaseElector


def _elector(kubeconfig: str, identity: str, relists: list, name: str) -> LeaseElector:
    api = client.CoordinationV1Api(config.new_client_from_config(config_file=kubeconfig))
    cfg = LeaseConfig("default", name, identity, f"http://{identity}:8888/tessera",
                      duration_s=3.0, renew_deadline_s=2.0, retry_s=0.3)
    return LeaseElector(api, cfg, on_elected=lambda: relists.append(identity))


def _wait(pred, timeout: float) -> float:
    started = time.monotonic()
    while not pred():
        assert time.monotonic() - started < timeout, "timed out"
        time.sleep(0.05)
    return time.monotonic() - started


def test_one_replica_binds_and_a_follower_takes_over_a_dead_leader(cluster):
    kubeconfig = str(cluster["dir"] / "kubeconfig")
    relists: list[str] = []
    a, b = (_elector(kubeconfig, who, relists, "lease-e2e") for who in ("replica-a", "replica-b"))
    stop_a, stop_b = threading.Event(), threading.Event()
    threading.Thread(target=a.run, args=(stop_a,), daemon=True).start()
    _wait(a.is_leader, 10)
    threading.Thread(target=b.run, args=(stop_b,), daemon=True).start()
    time.sleep(1.5)  # several rounds: b sees a live holder and stays a follower
    assert a.is_leader() and not b.is_leader()
    assert b.leader_url() == "http://replica-a:8888/tessera"
    assert relists == ["replica-a"]  # the leader relisted once, before its first bind

    # a crashes: it stops renewing without giving the Lease up (no release on kill -9)
    a.release = lambda: None
    stop_a.set()
    # it stops binding by itself once its renew deadline passes, before b may take over
    lapse = _wait(lambda: not a.is_leader(), 5)
    assert not b.is_leader()
    takeover = _wait(b.is_leader, 10)
    assert lapse <= 2.0 + 0.5 and takeover >= 0.5  # b waited for the 3 s lease to expire on its own clock
    assert relists == ["replica-a", "replica-b"]
    lease = client.CoordinationV1Api().read_namespaced_lease("lease-e2e", "default")
    assert lease.spec.holder_identity == "replica-b" and lease.spec.lease_transitions == 1
    assert lease.metadata.annotations[LEADER_URL_ANNOTATION] == "http://replica-b:8888/tessera"

    # a clean shutdown hands over at once: no waiting out the lease
    c = _elector(kubeconfig, "replica-c", relists, "lease-e2e")
    stop_c = threading.Event()
    threading.Thread(target=c.run, args=(stop_c,), daemon=True).start()
    time.sleep(1.0)
    assert not c.is_leader()
    stop_b.set()  # b's loop releases the Lease as it ends
    assert _wait(c.is_leader, 3.0) < 2.5
    stop_c.set()


def test_replicas_wait_for_the_installs_key_and_all_read_the_one_the_guide_made(cluster):
    """Four replicas started before the admin's step: none creates the Secret (the extender may not), each keeps
    reading, and once docs/admin-guide.md's block has made it they all hold the same one key. The block run again
    fails (AlreadyExists) and changes nothing; a rotation then signs in every replica."""
    import re
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes.client.exceptions import ApiException

    from extender import serve
    from extender.kube.assignment_key import load, read_keyring
    from extender.kube.key_rotation import rotate

    from .harness import create_assignment_key

    kubeconfig = cluster["dir"] / "kubeconfig"
    apis = [client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig))) for _ in range(4)]
    opts = serve.ServeOptions(host="127.0.0.1", port=0)  # no probe port: Waiting only keeps the reason

    def replica(api):
        return serve._retry(lambda: load(api, "default", "key-race"), "assignment key", wait_s=0.2,
                            waiting=serve.Waiting(opts, threading.Event()))

    with ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(replica, api) for api in apis]
        time.sleep(2.0)  # ten tries each
        assert not any(f.done() for f in waiting)
        try:
            apis[0].read_namespaced_secret("key-race", "default")
            raise AssertionError("a replica created the Secret")
        except ApiException as e:
            assert e.status == 404
        made = create_assignment_key(kubeconfig, "default", "key-race")
        assert made.returncode == 0, made.stderr
        rings = [f.result(timeout=30) for f in waiting]
    assert len({r.kids for r in rings}) == 1 and len(rings[0].keys) == 1 and len(rings[0].signing.secret) == 32
    assert re.fullmatch(r"key-\d{8}T\d{6}Z", rings[0].signing.entry)  # the label a rotation would add after
    again = create_assignment_key(kubeconfig, "default", "key-race")
    assert again.returncode != 0 and "AlreadyExists" in again.stderr, again.stderr
    assert read_keyring(apis[0], "default", "key-race").kids == rings[0].kids  # a restart reads the same key
    rotated = rotate(apis[0], "default", "key-race", label="99990101T000000Z")  # a second key: the newest signs
    with ThreadPoolExecutor(4) as pool:
        rings = list(pool.map(lambda api: load(api, "default", "key-race"), apis))
    assert {r.kids for r in rings} == {rotated.kids} and len(rotated.kids) == 2
    assert {r.signing.entry for r in rings} == {"key-99990101T000000Z"}
