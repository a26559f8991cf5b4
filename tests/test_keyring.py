"""The assignment keyring: key ids in the MAC, rotation, the legacy bare form, hostile MAC values,
the start-up check against a changed key, and the Secret that holds the keys."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube import assignment_key
from extender.kube.assignment_key import KeyMissing, load, read_keyring
from extender.kube.key_rotation import rotate
from extender.kube.keyring import EXIT_UNKNOWN_KEYS, check_keys, gate_readiness, keys_in_use
from extender.service import Extender
from extender.translate.objects import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION, AssignmentSigner, assignment_annotations, pod_info
from tessera_contract.keyring import BARE, MacCheck, key_id, load_path
from testing.kube_objects import k8s_node, k8s_pod

from .test_service import node_inventory

ROOT = Path(__file__).resolve().parents[1]
OLD, NEW, OTHER = b"old-key-0123456789abcdef", b"new-key-0123456789abcdef", b"other-key-0123456789abcdef"
BODY = json.dumps({"node": "a", "gpus": [0], "milli": 500, "uuids": ["0"]}, separators=(",", ":"))


def bare_mac(key: bytes, uid: str, body: str) -> str:
    """What the releases before key ids wrote: the hex HMAC alone."""
    return hmac.new(key, f"{uid}\n{body}".encode(), hashlib.sha256).hexdigest()


def signed(name: str, signer: AssignmentSigner | None, milli=500, gpus=(0,), node="a", mac: str | None = None,
           phase="Running") -> dict:
    body = json.dumps({"node": node, "gpus": list(gpus), "milli": milli, "uuids": [str(g) for g in gpus]},
                      separators=(",", ":"))
    pod = k8s_pod(name, milli=milli, node=node, phase=phase)
    pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = body
    pod["metadata"]["annotations"][MAC_ANNOTATION] = mac if mac is not None else signer.mac(pod["metadata"]["uid"], body)
    return pod


# --- hostile MAC values: invalid, never an exception (main raised TypeError / UnicodeEncodeError) -----

HOSTILE = ["é" * 64, "\u00ff", "v1:" + "é" * 70, "\ud800" * 64, "zz" * 32, "0" * 10_000, "", "0" * 63, "0" * 65,
           "A" * 64, "v1:" + "0" * 12 + ":" + "0" * 64 + "\n", "v2:" + "0" * 12 + ":" + "0" * 64, "v1::" + "0" * 64,
           "v1:" + "é" * 12 + ":" + "0" * 64, " " + "0" * 64]


@pytest.mark.parametrize("mac", HOSTILE, ids=range(len(HOSTILE)))
def test_a_mac_not_in_tesseras_exact_form_is_invalid_and_never_raises(mac):
    ring = AssignmentSigner(OLD)
    assert ring.valid("uid-p", BODY, mac) is False
    info = pod_info(signed("p", ring, mac=mac), ring)
    assert info.assignment is None and info.forged
    assert ("no " + MAC_ANNOTATION if not mac else "not a MAC Tessera writes") in info.forged


@pytest.mark.parametrize("mac", [None, 12, ["0" * 64], {"a": 1}])
def test_a_mac_that_is_not_a_string_is_invalid(mac):
    assert AssignmentSigner(OLD).valid("uid-p", BODY, mac) is False


def test_a_lone_surrogate_in_the_body_or_uid_is_signed_and_checked_without_raising():
    ring = AssignmentSigner(OLD)
    mac = ring.mac("uid-\ud800", BODY + "\udfff")  # a JSON "\ud800" escape reaches Python like this
    assert ring.valid("uid-\ud800", BODY + "\udfff", mac)
    assert not ring.valid("uid-\ud800", BODY, mac)


# --- key ids, rotation, legacy -----------------------------------------------------------------------


def test_the_mac_names_its_key_id_and_the_newest_key_signs():
    ring = AssignmentSigner(entries={"key-20261101T000000Z": OLD, "key-20261201T000000Z": NEW})
    mac = ring.mac("uid-p", BODY)
    version, kid, digest = mac.split(":")
    assert (version, kid) == ("v1", key_id(NEW)) and digest == bare_mac(NEW, "uid-p", BODY)
    assert ring.signing.entry == "key-20261201T000000Z" and ring.legacy is None


def test_after_rotation_the_old_key_still_verifies_and_the_new_key_signs():
    before = AssignmentSigner(entries={"key-a": OLD})
    after = AssignmentSigner(entries={"key-a": OLD, "key-b": NEW})
    old_mac = before.mac("uid-p", BODY)
    assert after.check("uid-p", BODY, old_mac).kid == key_id(OLD) and after.valid("uid-p", BODY, old_mac)
    assert after.mac("uid-p", BODY).startswith(f"v1:{key_id(NEW)}:")
    assert not before.valid("uid-p", BODY, after.mac("uid-p", BODY))  # and the old ring cannot verify the new kid


def test_a_bare_mac_from_before_key_ids_verifies_against_the_legacy_key():
    upgraded = AssignmentSigner(entries={"key": OLD, "key-20261201T000000Z": NEW})
    bare = bare_mac(OLD, "uid-p", BODY)
    assert upgraded.legacy is not None and upgraded.legacy.entry == "key"
    assert upgraded.check("uid-p", BODY, bare).status == "ok"
    assert upgraded.check("uid-p", BODY, bare).kid == key_id(OLD)  # counted under the legacy key's id
    assert upgraded.check("uid-q", BODY, bare) == MacCheck("mismatch", BARE)  # copied, or another key's: says no kid
    assert AssignmentSigner(OLD).valid("uid-p", BODY, bare)  # a plain key file is the legacy key
    assert upgraded.signing.entry == "key-20261201T000000Z"  # the legacy key sorts oldest: never signs beside a newer one
    # without a legacy key, a bare MAC names no key we hold: unknown, not an edit
    assert AssignmentSigner(entries={"key-b": NEW}).check("uid-p", BODY, bare).status == "unknown"
    assert AssignmentSigner(entries={"key-b": NEW}).check("uid-p", BODY, bare).kid == BARE


def test_an_unknown_key_id_makes_the_assignment_forged_with_a_reason_that_names_it():
    lost = AssignmentSigner(OTHER)
    ring = AssignmentSigner(entries={"key-a": OLD})
    info = pod_info(signed("p", lost), ring)
    assert info.assignment is None and info.kid == key_id(OTHER)
    assert f"signed with key id {key_id(OTHER)}, which this extender does not hold" in info.forged


def test_an_edited_assignment_under_a_known_key_is_a_mismatch():
    ring = AssignmentSigner(entries={"key-a": OLD})
    pod = signed("p", ring)
    pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = BODY.replace('"milli":500', '"milli":5')
    info = pod_info(pod, ring)
    assert "does not match" in info.forged and info.kid == key_id(OLD)


def test_keyrings_refuse_bad_keys_in_words():
    with pytest.raises(ValueError, match="16 bytes"):
        AssignmentSigner(entries={"key-a": b"short"})
    with pytest.raises(ValueError, match="hold the same key"):
        AssignmentSigner(entries={"key-a": OLD, "key-b": OLD})
    with pytest.raises(ValueError, match="expected 'key' or key-<label>"):
        AssignmentSigner(entries={"key-a b": OLD})
    with pytest.raises(ValueError, match="no assignment key"):
        AssignmentSigner.from_entries({"other": OLD})
    with pytest.raises(ValueError, match="at most"):
        AssignmentSigner(entries={f"key-{i:03}": OLD + bytes([i]) for i in range(40)})


# --- the start-up check ---------------------------------------------------------------------------


def extender_with(pods, ring: AssignmentSigner) -> Extender:
    ext = Extender(signer=ring)
    for n in ("a", "b"):
        ext.upsert_node(node_inventory(k8s_node(n)))
    for p in pods:
        ext.upsert_pod(pod_info(p, ring))
    return ext


def running_pods(signer, n=6):
    return [signed(f"p{i}", signer, milli=300, gpus=(i % 4,), node="a") for i in range(n)]


def test_a_changed_key_refuses_the_start_with_the_key_ids_held_and_found():
    pods = running_pods(AssignmentSigner(entries={"key-a": OLD}))
    replaced = AssignmentSigner(entries={"key-a": OTHER})  # the Secret lost and recreated, say
    verdict = check_keys(extender_with(pods, replaced).pods.values(), replaced)
    assert verdict.refuse and verdict.unknown_pods == 6 and verdict.verified == 0
    text = verdict.message()
    assert key_id(OLD) in text and key_id(OTHER) in text and "ml/p0" in text and "--accept-unknown-keys" in text


def test_a_rotated_keyring_passes_the_check_and_keeps_every_assignment():
    old = AssignmentSigner(entries={"key-a": OLD})
    pods = running_pods(old)
    rotated = AssignmentSigner(entries={"key-a": OLD, "key-b": NEW})
    ext = extender_with(pods, rotated)
    verdict = check_keys(ext.pods.values(), rotated)
    assert not verdict.refuse and verdict.verified == 6 and verdict.in_use == {key_id(OLD): 6}
    assert not ext.forged and ext.cluster.by_name["a"].gpu_free == [400, 400, 700, 700]
    # a new bind after the restart signs with the new key; both kinds count
    ext.mark_synced()
    ext.upsert_pod(pod_info(k8s_pod("fresh", milli=400), rotated))  # the watch brings it; verbs remember nothing
    a, uuids = ext.reserve("uid-fresh", "ml/fresh", "a")
    ann = assignment_annotations(a, uuids, rotated, "uid-fresh")
    assert ann[MAC_ANNOTATION].startswith(f"v1:{key_id(NEW)}:")
    again = extender_with([*pods, k8s_pod("fresh", milli=400, node="a", phase="Running", ann=ann)], rotated)
    assert keys_in_use(again.pods.values()) == {key_id(NEW): 1, key_id(OLD): 6}
    assert sorted(again.cluster.by_name["a"].gpu_free) == sorted(ext.cluster.by_name["a"].gpu_free)
    assert not again.forged


def test_a_tenants_made_up_key_ids_do_not_stop_the_start_while_tesseras_pods_outnumber_them():
    ring = AssignmentSigner(entries={"key-a": OLD})
    junk = [signed(f"junk{i}", None, node="b", mac=f"v1:{i:012x}:" + "0" * 64) for i in range(3)]
    verdict = check_keys(extender_with(running_pods(ring) + junk, ring).pods.values(), ring)
    assert verdict.unknown_pods == 3 and verdict.verified == 6 and not verdict.refuse
    # finished pods, pods never bound, and pods bound to a node that does not exist are not counted
    done = [signed(f"done{i}", None, node="b", mac=f"v1:{i:012x}:" + "0" * 64, phase="Succeeded") for i in range(9)]
    unbound = [signed(f"pend{i}", None, node="", mac=f"v1:{i:012x}:" + "0" * 64, phase="Pending") for i in range(9)]
    nowhere = [signed(f"nowhere{i}", None, node="nowhere", mac=f"v1:{i:012x}:" + "0" * 64, phase="Pending") for i in range(9)]
    ext = extender_with(running_pods(ring) + done + unbound + nowhere, ring)
    verdict = check_keys(ext.pods.values(), ring, ext.cluster.by_name)
    assert verdict.unknown_pods == 0 and verdict.verified == 6 and not verdict.refuse
    assert check_keys(ext.pods.values(), ring).refuse  # without the node list, 9 made-up "nowhere" pods would stop it
    exits = []
    gate_readiness(ext, ring, accept_unknown=False, exit_fn=exits.append)  # the gate passes the node list
    ext.mark_synced()
    assert not exits and ext.synced


def test_bare_macs_without_a_legacy_key_refuse_the_start():
    pods = [signed(f"p{i}", None, mac=bare_mac(OLD, f"uid-p{i}", json.dumps(
        {"node": "a", "gpus": [0], "milli": 500, "uuids": ["0"]}, separators=(",", ":")))) for i in range(2)]
    with_legacy = AssignmentSigner(entries={"key": OLD, "key-b": NEW})
    assert check_keys(extender_with(pods, with_legacy).pods.values(), with_legacy).verified == 2
    without = AssignmentSigner(entries={"key-b": NEW})
    verdict = check_keys(extender_with(pods, without).pods.values(), without)
    assert verdict.refuse and BARE in verdict.unknown and "bare MAC from before key ids" in verdict.message()
    # the legacy entry replaced by another key: the bare MACs cannot say which key made them: refuse too
    replaced = AssignmentSigner(entries={"key": OTHER, "key-b": NEW})
    ext = extender_with(pods, replaced)
    assert check_keys(ext.pods.values(), replaced).refuse and all("does not match" in why for why in ext.forged.values())


def test_the_gate_exits_before_ready_and_the_flag_lets_the_start_count_them_forged():
    pods = running_pods(AssignmentSigner(entries={"key-a": OLD}))
    replaced = AssignmentSigner(entries={"key-a": OTHER})
    exits = []
    ext = extender_with(pods, replaced)
    gate_readiness(ext, replaced, accept_unknown=False, exit_fn=exits.append)
    ext.mark_synced()
    assert exits == [EXIT_UNKNOWN_KEYS] and not ext.synced  # /readyz never said ready
    ext = extender_with(pods, replaced)
    gate_readiness(ext, replaced, accept_unknown=True, exit_fn=exits.append)
    ext.mark_synced()
    assert exits == [EXIT_UNKNOWN_KEYS] and ext.synced and len(ext.forged) == 6
    ext = extender_with(pods, AssignmentSigner(entries={"key-a": OLD, "key-b": NEW}))
    gate_readiness(ext, ext.signer, accept_unknown=False, exit_fn=exits.append)
    ext.mark_synced()
    assert exits == [EXIT_UNKNOWN_KEYS] and ext.synced


# --- the Secret ------------------------------------------------------------------------------------


class FakeSecrets:
    """CoreV1Api's Secret calls the key code makes, with the apiserver's 404/409 and resourceVersions. No create:
    the install makes the Secret (`installed`), and any attempt of the extender's to create one fails here."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()
        self.reads = 0

    def installed(self, namespace: str, name: str, entries: dict[str, bytes]) -> None:
        """What the admin's install step writes (docs/admin-guide.md, "Create the assignment key")."""
        data = {e: base64.b64encode(k).decode() for e, k in entries.items()}
        with self.lock:
            self.store[(namespace, name)] = {"metadata": {"name": name, "resourceVersion": "1"}, "data": data}

    def read_namespaced_secret(self, name, namespace, _preload_content=True):
        with self.lock:
            self.reads += 1
            obj = self.store.get((namespace, name))
        if obj is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(obj).encode())

    def replace_namespaced_secret(self, name, namespace, body, _preload_content=True):
        with self.lock:
            current = self.store[(namespace, name)]
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            obj = copy.deepcopy(body)
            obj["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            self.store[(namespace, name)] = obj


def test_a_missing_secret_is_not_created_and_the_words_name_it_and_the_install_step():
    api = FakeSecrets()
    with pytest.raises(KeyMissing) as missing:
        load(api, "tessera-system", "tessera-assignment-key")
    words = str(missing.value)
    assert "secret tessera-system/tessera-assignment-key does not exist" in words
    assert assignment_key.INSTALL_STEP in words and "not ready and binds nothing" in words
    assert "NS=tessera-system SECRET=tessera-assignment-key" in words  # the guide's block, with these names
    assert api.store == {}  # nothing created it
    guide = (ROOT / "docs/admin-guide.md").read_text()
    section = assignment_key.INSTALL_STEP.split('"')[1]
    assert re.search(rf"^#+ {re.escape(section)}$", guide, re.M), f"docs/admin-guide.md has no section {section!r}"


def test_other_api_errors_are_not_read_as_a_missing_secret():
    api = FakeSecrets()
    api.read_namespaced_secret = lambda *a, **kw: (_ for _ in ()).throw(ApiException(status=403, reason="Forbidden"))
    with pytest.raises(ApiException) as e:
        load(api, "ts", "k")
    assert e.value.status == 403


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_waits_for_the_installs_secret_not_ready_and_says_why_then_reads_it(caplog):
    """`tessera serve --assignment-key-secret` before the admin's step: it retries (as for an API that does not
    answer), logs what is missing and which step makes it, once (not every try), and its probe port, up from the
    first failed try, says alive and not ready, with the same words. Once the Secret exists it reads that key.
    Nothing listens for verbs meanwhile: serve binds them only after the key is read (run_servers)."""
    from extender import serve

    api, port, stop = FakeSecrets(), free_port(), threading.Event()
    opts = serve.ServeOptions(host="127.0.0.1", port=free_port(), probe_host="127.0.0.1", probe_port=port,
                              assignment_key_secret="tessera-assignment-key", lease_namespace="tessera-system")
    waiting = serve.Waiting(opts, stop)
    got: list = []

    def start() -> None:  # serve's own step (_signer), at a shorter interval
        got.append(serve._retry(lambda: load(api, "tessera-system", "tessera-assignment-key"), "assignment key",
                                wait_s=0.02, waiting=waiting))

    with caplog.at_level(logging.WARNING, logger="tessera"):
        worker = threading.Thread(target=start, daemon=True)
        worker.start()
        try:
            deadline = time.monotonic() + 10
            while api.reads < 5 or waiting.listener is None:
                assert time.monotonic() < deadline and worker.is_alive()
                time.sleep(0.01)
            assert probe(port, "/healthz") == (200, {"ok": True})  # alive: the kubelet does not restart it
            status, body = probe(port, "/readyz")
            assert status == 503 and body["ready"] is False
            assert body["reason"].startswith("assignment key: secret tessera-system/tessera-assignment-key does not exist")
            assert assignment_key.INSTALL_STEP in body["reason"]
            assert not got and api.store == {}
            api.installed("tessera-system", "tessera-assignment-key", {"key-20261130T125600Z": NEW})
            worker.join(10)
        finally:
            stop.set()
    assert [r.kids for r in got] == [(key_id(NEW),)]
    said = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(said) == 1 and "retrying every 0.02s" in said[0], said  # the same words once, not at every try
    assert waiting.why == "starting"


def test_the_signer_comes_from_the_installed_secret_in_the_lease_namespace():
    from extender import serve

    api = FakeSecrets()
    api.installed("tessera-system", "k", {"key-a": OLD, "key-b": NEW})
    opts = serve.ServeOptions(host="127.0.0.1", port=0, assignment_key_secret="k", lease_namespace="tessera-system")
    signer = serve._signer(opts, api, serve.Waiting(opts, threading.Event()))
    assert signer.kids == (key_id(OLD), key_id(NEW)) and signer.signing.kid == key_id(NEW)


def test_rotation_adds_a_signing_key_and_every_replica_reads_the_same_keyring():
    api = FakeSecrets()
    api.installed("ts", "k", {"key-20261130T125600Z": OLD})
    first = load(api, "ts", "k")
    ring = rotate(api, "ts", "k", label="99990101T000000Z")
    assert ring.kids == (first.signing.kid, ring.signing.kid) and ring.signing.entry == "key-99990101T000000Z"
    with ThreadPoolExecutor(4) as pool:
        rings = list(pool.map(lambda _: load(api, "ts", "k"), range(4)))
    assert {r.kids for r in rings} == {ring.kids} and all(r.signing.kid == ring.signing.kid for r in rings)
    with pytest.raises(ValueError, match="already holds key-99990101T000000Z"):
        rotate(api, "ts", "k", label="99990101T000000Z")
    with pytest.raises(ValueError, match="would not sign"):
        rotate(api, "ts", "k", label="00000000T000000Z")
    assert read_keyring(api, "ts", "k").kids == ring.kids  # refused rotations changed nothing


def test_a_rotation_that_lost_a_race_gets_a_conflict_not_a_lost_key(monkeypatch):
    api = FakeSecrets()
    api.installed("ts", "k", {"key-20261130T125600Z": OLD})
    stale = api.read_namespaced_secret("k", "ts")  # admin 1 read this, then admin 2 rotated
    rotate(api, "ts", "k", label="99990101T000000Z")
    monkeypatch.setattr(api, "read_namespaced_secret", lambda *a, **kw: stale)
    with pytest.raises(ApiException) as e:
        rotate(api, "ts", "k", label="99990102T000000Z")
    assert e.value.status == 409


def test_a_secret_from_before_key_ids_is_read_as_the_legacy_key_and_a_bad_one_refused_in_words():
    api = FakeSecrets()
    api.store[("ts", "k")] = {"metadata": {"name": "k", "resourceVersion": "1"},
                              "data": {"key": base64.b64encode(OLD).decode()}}
    ring = load(api, "ts", "k")
    assert ring.legacy is not None and ring.kids == (key_id(OLD),)
    assert ring.valid("uid-p", BODY, bare_mac(OLD, "uid-p", BODY))
    rotated = rotate(api, "ts", "k")
    assert rotated.legacy is not None and rotated.signing.entry != "key"
    api.store[("ts", "bad")] = {"metadata": {"name": "bad", "resourceVersion": "1"}, "data": {"other": "eA=="}}
    with pytest.raises(ValueError, match="ts/bad holds no assignment key"):
        load(api, "ts", "bad")
    api.store[("ts", "bad")]["data"] = {"key-x": "not base64!"}
    with pytest.raises(ValueError, match="data.key-x is not base64"):
        load(api, "ts", "bad")


def test_a_mounted_secret_directory_reads_the_same_key_ids_as_the_api(tmp_path):
    (tmp_path / "key").write_bytes(OLD)
    (tmp_path / "key-b").write_bytes(NEW + b"\n")  # read as is: the API would not strip it either
    (tmp_path / "..data").mkdir()
    (tmp_path / "ca.crt").write_text("not a key")
    ring = load_path(str(tmp_path))
    assert ring.kids == (key_id(OLD), key_id(NEW + b"\n")) and ring.legacy is not None
    single = tmp_path / "single.key"
    single.write_text(OLD.decode() + "\n")
    assert load_path(str(single)).kids == (key_id(OLD),)  # a key file: stripped, as before, the legacy key


def test_new_labels_sort_in_time():
    import datetime

    a = assignment_key.new_label(datetime.datetime(2026, 11, 30, 9, 5, 1, tzinfo=datetime.UTC))
    b = assignment_key.new_label(datetime.datetime(2026, 12, 1, 0, 0, 0, tzinfo=datetime.UTC))
    assert a == "20261130T090501Z" and a < b


def test_tessera_serve_takes_a_key_directory_and_the_accept_flag(tmp_path, monkeypatch):
    from extender import cli, serve
    from extender.cli import serve as serve_command

    (tmp_path / "key-a").write_bytes(OLD)
    (tmp_path / "key-b").write_bytes(NEW)
    seen = {}
    monkeypatch.setattr(serve_command, "load_api", lambda kubeconfig, **_: None)
    monkeypatch.setattr(serve, "serve", lambda opts, api: seen.setdefault("opts", opts))
    args = cli.build_parser().parse_args(["serve", "--assignment-key-file", str(tmp_path), "--accept-unknown-keys"])
    assert args.run(args) == 0
    opts = seen["opts"]
    assert opts.accept_unknown_keys and opts.assignment_key_file == str(tmp_path)
    assert serve.load_signer(opts.assignment_key_file).signing.kid == key_id(NEW)
    assert not cli.build_parser().parse_args(["serve"]).accept_unknown_keys
