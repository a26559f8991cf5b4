"""The assignment keyring on the real control plane: an upgraded Secret (the key file's key as the
legacy entry), a rotation with the extender restarted (every assignment still counted, new binds
under the new key id, no GPU booked twice), then the key replaced by an unknown one: the extender
refuses to start, in words, unless told to count those pods as forged."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube.assignment_key import load_or_create, read_keyring
from extender.kube.contract import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION
from extender.kube.key_rotation import rotate
from extender.kube.keyring import EXIT_UNKNOWN_KEYS, key_id

from .harness import KUBE_BIN, ROOT, ExtenderProcess, free_port
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

    first = load_or_create(api, NS, name)  # the extender's first start
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
