"""A follower forwards a bind only to the Lease holder's pod: a Ready extender replica (same
namespace, ServiceAccount and labels), at its pod IP and the verbs port, over HTTP(S), no proxy,
no redirect. Anything else is refused in words and nothing is sent (a local listener records
every connection to prove it)."""

from __future__ import annotations

import socket
import ssl
import threading

import orjson
import pytest

from extender.http.app import create_app
from extender.http.forward import FORWARDED_HEADER, HolderForwarder, Peers, peer_identity
from testing.fuzzkit import live
from tests.pki import make_pki

LABELS = {"app.kubernetes.io/name": "tessera-extender"}
BIND = orjson.dumps({"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-a"})


class Recorder:
    """A TCP listener that counts connections and answers each request with a fixed HTTP reply."""

    def __init__(self, reply: bytes = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"Error":""}',
                 context: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.reply, self.context, self.connections, self.requests = reply, context, 0, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                if self.context:
                    conn = self.context.wrap_socket(conn, server_side=True)
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head = data.split(b"\r\n\r\n", 1)[0].lower()
                length = int(head.split(b"content-length:", 1)[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
                while len(data.split(b"\r\n\r\n", 1)[1]) < length:  # the whole body, then answer
                    data += conn.recv(65536)
                self.requests.append(data)
                conn.sendall(self.reply)
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()


class FixedHolder:
    def __init__(self, name: str) -> None:
        self.name = name

    def holder(self) -> str:
        return self.name


def replica(name="tessera-extender-abc", ip="127.0.0.1", sa="tessera-extender", labels=None, ready=True, phase="Running",
            deleting=False) -> dict:
    meta = {"name": name, "namespace": "tessera-system", "labels": dict(LABELS if labels is None else labels)}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"serviceAccountName": sa},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def forwarder(pods: dict, holder: str, port: int, context=None, hostname="") -> HolderForwarder:
    peers = Peers("tessera-system", "tessera-extender", LABELS, port, "/tessera", context, hostname, self_name="me")
    return HolderForwarder(FixedHolder(holder), peers, lambda ns, name: pods.get((ns, name)))


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


def test_a_ready_replica_gets_the_bind_at_its_pod_ip_and_the_verbs_port(recorder):
    pods = {("tessera-system", "leader-0"): replica("leader-0")}
    status, body = forwarder(pods, "leader-0", recorder.port).forward(BIND, 5)
    assert (status, body) == (200, b'{"Error":""}')
    assert recorder.connections == 1
    head = recorder.requests[0].decode()
    assert head.startswith("POST /tessera/bind HTTP/1.1") and f"{FORWARDED_HEADER}: 1" in head


@pytest.mark.parametrize("holder, pod, why", [
    ("", None, "no replica holds the bind lease"),
    ("me", replica("me"), "names this replica"),
    ("http://127.0.0.1:1/x", None, "is not a pod name"),
    ("ghost", None, "is not a pod in tessera-system"),
    ("tenant-pod", replica("tenant-pod", sa="default"), "does not run as ServiceAccount tessera-extender"),
    ("lookalike", replica("lookalike", labels={"app": "x"}), "lacks the extender's labels"),
    ("starting", replica("starting", ready=False), "is not Ready"),
    ("done", replica("done", phase="Succeeded"), "is not Ready"),
    ("going", replica("going", deleting=True), "is being deleted"),
    ("no-ip", replica("no-ip", ip=""), "has no pod IP"),
    ("host-ip", replica("host-ip", ip="evil.example.com"), "has no pod IP"),
    ("url-ip", replica("url-ip", ip="file:///etc/passwd"), "has no pod IP"),
])
def test_a_holder_that_is_not_a_ready_extender_replica_gets_nothing(recorder, holder, pod, why):
    pods = {("tessera-system", holder): pod} if pod else {}
    status, body = forwarder(pods, holder, recorder.port).forward(BIND, 5)
    answer = orjson.loads(body)
    assert status == 200 and why in answer["Error"] and answer["Error"].startswith("tessera: not forwarding")
    assert recorder.connections == 0  # nothing was sent anywhere


def test_a_pod_in_another_namespace_is_not_looked_up():
    asked = []
    peers = Peers("tessera-system", "tessera-extender", LABELS, 8888)
    fw = HolderForwarder(FixedHolder("x"), peers, lambda ns, name: asked.append((ns, name)))
    fw.forward(BIND, 1)
    assert asked == [("tessera-system", "x")]


def test_a_redirect_from_the_holder_is_handed_back_not_followed():
    target = Recorder()
    redirect = Recorder(reply=(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{target.port}/x\r\n"
                               "Content-Length: 0\r\n\r\n").encode())
    try:
        status, body = forwarder({("tessera-system", "l"): replica("l")}, "l", redirect.port).forward(BIND, 5)
        assert status == 307 and body == b"" and target.connections == 0
    finally:
        target.close()
        redirect.close()


def test_the_holders_server_certificate_is_checked_against_the_ca(tmp_path):
    pki = make_pki(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(pki / "server.crt", pki / "server.key")
    good = Recorder(context=server)
    rogue_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    rogue_ctx.load_cert_chain(pki / "rogue.crt", pki / "rogue.key")
    rogue = Recorder(context=rogue_ctx)
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    pods = {("tessera-system", "l"): replica("l")}
    try:
        status, body = forwarder(pods, "l", good.port, client, "127.0.0.1").forward(BIND, 5)
        assert (status, body) == (200, b'{"Error":""}')
        status, body = forwarder(pods, "l", rogue.port, client, "127.0.0.1").forward(BIND, 5)
        assert status == 200 and "cannot reach the leader" in orjson.loads(body)["Error"] and not rogue.requests
        # the right CA but a name the certificate does not carry
        status, body = forwarder(pods, "l", good.port, client, "elsewhere.example").forward(BIND, 5)
        assert "cannot reach the leader" in orjson.loads(body)["Error"] and len(good.requests) == 1
    finally:
        good.close()
        rogue.close()


class Follower:
    def is_leader(self):
        return False


FOLLOWER = Follower()


def test_the_bind_verb_forwards_through_the_forwarder_when_not_leader(recorder):
    world = live()
    fw = forwarder({("tessera-system", "l"): replica("l")}, "l", recorder.port)
    app = create_app(world.extender, world.binder, prefix="/tessera", leadership=FOLLOWER, forwarder=fw)
    answer = app.test_client().post("/tessera/bind", data=BIND, content_type="application/json")
    assert answer.status_code == 200 and answer.get_json() == {"Error": ""} and recorder.connections == 1
    assert not world.binder.calls  # the follower itself bound nothing
    again = app.test_client().post("/tessera/bind", data=BIND, headers={FORWARDED_HEADER: "1"})
    assert "does not hold the lease" in again.get_json()["Error"] and recorder.connections == 1


def test_a_follower_forwards_a_gang_members_filter_to_the_leader_and_judges_other_pods_itself(recorder):
    """A gang is admitted by the replica that binds it (gangs.py): filters of its members go where its binds go."""
    import json

    world = live()
    fw = forwarder({("tessera-system", "l"): replica("l")}, "l", recorder.port)
    app = create_app(world.extender, world.binder, prefix="/tessera", leadership=FOLLOWER, forwarder=fw)
    body = json.loads(json.dumps(world.pending))
    lone = app.test_client().post("/tessera/filter", json=body).get_json()
    assert "NodeNames" in lone and recorder.connections == 0  # a pod in no gang: answered here
    body["Pod"]["metadata"]["annotations"] = {"tessera.dev/gang-name": "g", "tessera.dev/gang-size": "2"}
    answer = app.test_client().post("/tessera/filter", json=body)
    assert answer.get_json() == {"Error": ""} and recorder.connections == 1  # the recorder's answer, relayed
    assert recorder.requests[0].decode().startswith("POST /tessera/filter HTTP/1.1")


def test_peer_identity_drops_revision_labels_and_needs_a_service_account():
    own = replica("me", labels={**LABELS, "pod-template-hash": "abc"})
    assert peer_identity(own) == ("tessera-extender", LABELS)
    with pytest.raises(ValueError, match="no ServiceAccount or no labels"):
        peer_identity(replica("me", sa=""))


def test_peers_over_https_need_the_certificates_name():
    with pytest.raises(ValueError, match="server certificate carries"):
        Peers("ns", "sa", LABELS, 8888, context=ssl.create_default_context())


def test_a_slow_holder_cannot_hold_a_forwarded_bind_past_its_timeout():
    """The socket timeout bounds each read: a holder sending one byte every 0.4 s held the follower's thread (and
    kube-scheduler's bind) for as long as its answer lasted. The whole exchange now has a deadline."""
    import time

    server = socket.create_server(("127.0.0.1", 0))

    def dribble():
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            answer = b'{"Error":""}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer))
            for ch in answer:
                time.sleep(0.4)
                try:
                    conn.sendall(bytes([ch]))
                except OSError:
                    return

    threading.Thread(target=dribble, daemon=True).start()
    fw = forwarder({("tessera-system", "tessera-extender-abc"): replica()}, "tessera-extender-abc", server.getsockname()[1])
    started = time.monotonic()
    status, body = fw.forward(b"{}", timeout_s=1.0)
    assert time.monotonic() - started < 2.5
    assert status == 200 and b"did not answer within 1 s" in body
    server.close()
