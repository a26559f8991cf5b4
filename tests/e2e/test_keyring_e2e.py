"""The assignment keyring on the real control plane: an upgraded Secret (the key file's key as the
legacy entry), a rotation with the extender restarted (every assignment still counted, new binds
under the new key id, no GPU booked twice), then the key replaced by an unknown one: the extender
refuses to start, in words, unless told to count those pods as forged. And the install's step: an
extender started before the Secret exists waits, not ready and binding nothing, until the admin
guide's block makes it, then binds under that key."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube.assignment_key import INSTALL_STEP, read_keyring
from extender.kube.key_rotation import rotate
from extender.kube.keyring import EXIT_UNKNOWN_KEYS
from extender.translate.objects import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION
from tessera_contract.keyring import key_id
from testing.local_cluster import KUBE_BIN, ROOT, ExtenderProcess, free_port

from .harness import create_assignment_key
from .test_kube_e2e import NS, make_node, make_pod

SECRET = "keyring-e2e"
KEY_ARGS = ("--assignment-key-secret", SECRET, "--lease-namespace", NS)
SLICE = {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "300"}


def wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def pods(api, names):
    return {p.metadata.name: p for p in api.list_namespaced_pod(NS).items if p.metadata.name in names}


def bind(api, names):
    for n in names:
        make_pod(api, n, SLICE, models=["K80"], reserved=True)

    def all_bound():
        got = pods(api, names)
        return got if len(got) == len(names) and all(p.spec.node_name for p in got.values()) else None

    return wait(all_bound, 90, f"{names} bound")


def milli_per_gpu(api) -> dict:
    used: dict = {}
    for pod in api.list_namespaced_pod(NS).items:
        ann = pod.metadata.annotations or {}
        if pod.spec.node_name and pod.spec.node_name.startswith("kr-") and ASSIGNMENT_ANNOTATION in ann:
            a = json.loads(ann[ASSIGNMENT_ANNOTATION])
            for g in a["gpus"]:
                used[(a["node"], g)] = used.get((a["node"], g), 0) + a["milli"]
    return used


def test_rotation_keeps_every_assignment_and_an_unknown_key_stops_the_start(cluster):
    api, work, original = cluster["api"], cluster["dir"], cluster["extender"]
    for n in ("kr-0", "kr-1"):
        make_node(api, n, 2, "K80", reserved=True)  # 4 GPUs: 12 slices of 300 milli, and no 13th
    legacy = original.key_file.read_bytes().strip()  # what signed every pod so far: the upgrade's legacy key
    api.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                      "data": {"key": base64.b64encode(legacy).decode()}})
    original.kill()
    ext = ExtenderProcess(work / "kubeconfig", original.port, work / "keyring.log", args=KEY_ARGS)
    first, second = [f"kr-a{i}" for i in range(6)], [f"kr-b{i}" for i in range(6)]
    try:
        ext.start()
        for p in bind(api, first).values():
            assert p.metadata.annotations[MAC_ANNOTATION].startswith(f"v1:{key_id(legacy)}:")

        ring = rotate(api, NS, SECRET)  # the admin's step; then a restart of the extender
        ext.kill()
        ext.start()
        seen = ext.inspect()
        assert not [p for p in seen["forged"] if p.startswith(f"{NS}/kr-")]
        holders = {h["pod"] for n in seen["nodes"] for g in n["gpus"] for h in g["holders"]}
        assert {f"{NS}/{n}" for n in first} <= holders  # the old key's assignments still hold their GPUs
        for p in bind(api, second).values():
            assert p.metadata.annotations[MAC_ANNOTATION].startswith(f"v1:{ring.signing.kid}:")
        used = milli_per_gpu(api)
        assert len(used) == 4 and max(used.values()) <= 1000  # 12 x 300 on 4 GPUs: none booked twice
        make_pod(api, "kr-extra", SLICE, models=["K80"], reserved=True)
        time.sleep(5)
        assert not api.read_namespaced_pod("kr-extra", NS).spec.node_name  # no GPU has 300 milli left

        # the key replaced by one no pod was signed with (the Secret lost and recreated, say)
        ext.kill()
        api.delete_namespaced_secret(SECRET, NS)
        api.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                          "data": {"key-20300101T000000Z": base64.b64encode(os.urandom(32)).decode()}})
        log = work / "keyring-refused.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(work / "kubeconfig"),
                 "--listen", f"127.0.0.1:{free_port()}", *KEY_ARGS], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            try:
                rc = proc.wait(120)
            finally:
                if proc.poll() is None:
                    proc.kill()
        text = log.read_text()
        assert rc == EXIT_UNKNOWN_KEYS, text[-2000:]
        assert "does not hold" in text and key_id(legacy) in text and ring.signing.kid in text, text[-2000:]
        assert "--accept-unknown-keys" in text

        # told to, it starts and counts them as forged (their GPUs then look free: the admin's choice)
        forced = ExtenderProcess(work / "kubeconfig", original.port, work / "keyring-forced.log",
                                 args=(*KEY_ARGS, "--accept-unknown-keys"))
        forced.start()
        try:
            forged = forced.inspect()["forged"]
            assert f"signed with key id {ring.signing.kid}" in forged[f"{NS}/kr-b0"]
            assert f"signed with key id {key_id(legacy)}" in forged[f"{NS}/kr-a0"]
        finally:
            forced.kill()
    finally:
        ext.kill()
        for n in (*first, *second, "kr-extra"):
            try:
                api.delete_namespaced_pod(n, NS, grace_period_seconds=0)
            except ApiException:
                pass
        wait(lambda: not pods(api, {*first, *second, "kr-extra"}), 60, "the keyring pods to go")
        try:
            api.delete_namespaced_secret(SECRET, NS)
        except ApiException:
            pass
        original.start()  # later tests talk to the key-file extender again


def doc_block(name: str) -> str:
    text = (ROOT / "docs/assignment-key.md").read_text()
    m = re.search(rf"<!-- {name}:begin -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert m, f"no {name} block in docs/assignment-key.md"
    return m.group(1)


def test_the_documented_kubectl_steps_rotate_count_and_remove_keys(cluster):
    if not (KUBE_BIN / "kubectl").is_file():
        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN}")
    api, name = cluster["api"], "doc-keyring"
    env = dict(os.environ, KUBECONFIG=str(cluster["dir"] / "kubeconfig"), NS=NS, SECRET=name,
               PATH=f"{KUBE_BIN}:{os.environ['PATH']}")

    def run(block: str, **extra) -> str:
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_block(block)], env=dict(env, **extra),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return out.stdout

    made = create_assignment_key(cluster["dir"] / "kubeconfig", NS, name)  # the install's step
    assert made.returncode == 0, made.stderr
    first = read_keyring(api, NS, name)
    mac = {MAC_ANNOTATION: f"v1:{first.signing.kid}:" + "0" * 64}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "doc-keyring-pod", "annotations": mac},
           "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "none"}]}}  # stays unbound
    api.create_namespaced_pod(NS, pod)
    try:
        time.sleep(1.1)  # the rotation's label is the date-time to the second: after the first key's
        run("rotate")
        ring = read_keyring(api, NS, name)
        assert len(ring.keys) == 2 and first.signing.kid in ring.kids and ring.signing.kid != first.signing.kid
        listed = run("keys-in-use")
        assert re.search(rf"^\s*1 {first.signing.kid}$", listed, re.M), listed
        for k in ring.keys:
            assert f"{k.entry} {k.kid}\n" in listed, listed
        run("remove-key", ENTRY=first.signing.entry)
        assert read_keyring(api, NS, name).kids == (ring.signing.kid,)
    finally:
        api.delete_namespaced_pod("doc-keyring-pod", NS, grace_period_seconds=0)
        api.delete_namespaced_secret(name, NS)


def probe(port: int, path: str) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:
        return None, {}


def test_an_extender_started_before_the_install_step_waits_unready_then_binds_under_that_key(cluster):
    """The shipped arguments (--assignment-key-secret, --probe-listen) with no Secret yet: the replica creates none,
    its probe port says alive and not ready in words that name the Secret and the step, no verbs port is open and a
    slice pod waits; the admin guide's block makes the Secret, and the replica starts and signs with its key."""
    api, work, original = cluster["api"], cluster["dir"], cluster["extender"]
    name, probes = "install-key-e2e", free_port()
    make_node(api, "kr-install", 1, "K80", reserved=True)
    original.kill()
    ext = ExtenderProcess(work / "kubeconfig", original.port, work / "install-key.log",
                          args=("--assignment-key-secret", name, "--lease-namespace", NS,
                                "--probe-listen", f"127.0.0.1:{probes}"))
    # returns once /readyz says 200; the wait spans the admin's step below, slow on a loaded 2-core machine
    starting = threading.Thread(target=ext.start, kwargs={"ready_within": 300}, daemon=True)
    starting.start()
    def not_ready_because():
        status, body = probe(probes, "/readyz")
        return body if status == 503 and "does not exist" in body.get("reason", "") else None

    try:
        body = wait(not_ready_because, 30, "the probe port to say why it is not ready")
        assert f"secret {NS}/{name} does not exist" in body["reason"] and INSTALL_STEP in body["reason"]
        assert probe(probes, "/healthz") == (200, {"ok": True})  # alive: the kubelet would not restart it
        make_pod(api, "kr-install-0", SLICE, models=["K80"], reserved=True)
        time.sleep(3)
        assert not api.read_namespaced_pod("kr-install-0", NS).spec.node_name  # nothing bound unsigned
        assert probe(ext.admin_port, "/readyz")[0] is None  # nor any listener but the probes' open
        with pytest.raises(ApiException) as missing:
            api.read_namespaced_secret(name, NS)
        assert missing.value.status == 404  # it created none
        made = create_assignment_key(work / "kubeconfig", NS, name)
        assert made.returncode == 0, made.stderr
        starting.join(120)
        assert not starting.is_alive() and probe(probes, "/readyz")[0] == 200
        ring = read_keyring(api, NS, name)
        pod = wait(lambda: (p := api.read_namespaced_pod("kr-install-0", NS)).spec.node_name and p, 90,
                   "the waiting slice pod bound")
        assert pod.metadata.annotations[MAC_ANNOTATION].startswith(f"v1:{ring.signing.kid}:")
        assert "does not exist" in (work / "install-key.log").read_text()
    finally:
        ext.kill()
        try:
            api.delete_namespaced_pod("kr-install-0", NS, grace_period_seconds=0)
        except ApiException:
            pass
        wait(lambda: not pods(api, {"kr-install-0"}), 60, "the pod to go")
        for delete in (lambda: api.delete_namespaced_secret(name, NS), lambda: api.delete_node("kr-install")):
            try:
                delete()
            except ApiException:
                pass
        original.start()
