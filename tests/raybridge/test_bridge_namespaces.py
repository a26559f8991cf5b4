"""Issue 35, item 3: the bridge's pod writes are namespaced. It creates and deletes pods only where the apiserver
lets it (namespaces an admin enabled for Ray jobs, docs/admin-guide.md), never in Kubernetes' own namespaces even if a
RoleBinding is made there by mistake, and when a job's namespace is not enabled (a 403 on its create or delete) it says
so in words once per namespace and tries that namespace again only after a growing pause.

Before: the bridge held pods create and delete cluster-wide, and PodWriter turned a 403 into a refused create that the
slot's backoff retried, in the log only ("create ml/b-r1: 403 Forbidden"), for ever."""

from __future__ import annotations

import json
import logging

import pytest
from kubernetes.client.exceptions import ApiException

from raybridge.bridge import REFUSED_RETRY_FIRST_S, REFUSED_RETRY_MAX_S, Bridge, Forbidden, pod_mac
from raybridge.contract import BRIDGE_MAC_ANNOTATION, CREATED_BY_ANNOTATION, LOST_ANNOTATION, REPLACES_ANNOTATION
from raybridge.kube import PodWriter

from .test_bridge_k8s_only import KEY, Pods, Writer, started
from .test_contract_decide import pod

RBAC_DENIAL = ('pods is forbidden: User "system:serviceaccount:tessera-system:tessera-bridge" cannot {verb} resource '
               '"pods" in API group "" in the namespace "{ns}"')


def in_namespace(p: dict, ns: str) -> dict:
    p["metadata"]["namespace"] = ns
    return p


def a_job_with_a_lost_member(ns: str = "ml") -> Pods:
    lost = started(pod("b", "n2", extra={LOST_ANNOTATION: "trainer lost"}))
    return Pods([in_namespace(started(pod("a", "n1")), ns), in_namespace(lost, ns)])


class NotEnabled(Writer):
    """A writer whose apiserver refuses the bridge's pod writes (RBAC) in `refused` namespaces."""

    def __init__(self, pods: Pods, refused: set[str], verbs=("create", "delete")) -> None:
        super().__init__(pods)
        self.refused, self.verbs, self.tries = refused, verbs, []

    def create(self, body):
        ns = body["metadata"]["namespace"]
        self.tries.append(("create", ns))
        if ns in self.refused and "create" in self.verbs:
            raise Forbidden(ns, "create", RBAC_DENIAL.format(verb="create", ns=ns))
        return super().create(body)

    def delete(self, key, uid):
        ns = key.split("/", 1)[0]
        self.tries.append(("delete", ns))
        if ns in self.refused and "delete" in self.verbs:
            raise Forbidden(ns, "delete", RBAC_DENIAL.format(verb="delete", ns=ns))
        return super().delete(key, uid)


def said(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_a_job_in_kube_system_gets_nothing_created_deleted_or_written_even_with_rbac_and_is_said_once(caplog):
    """A RoleBinding made in kube-system by mistake (the writer here refuses nothing) still gets no pod written there:
    no replacement, no delete of a pod carrying the bridge's own MAC, no Event; the log says why, once."""
    pods = a_job_with_a_lost_member("kube-system")
    own = {CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "kube-system/x", LOST_ANNOTATION: "x",
           BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "kube-system", "c-r1", "kube-system/x", "job")}
    pods.pods["kube-system/c-r1"] = in_namespace(started(pod("c-r1", "n3", extra=own)), "kube-system")
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=iter(range(0, 10**6, 3600)).__next__)
    with caplog.at_level(logging.WARNING, logger="tessera.bridge"):
        for _ in range(5):
            bridge.turn()
    assert (w.created, w.deleted, w.events) == ([], [], [])
    assert not bridge.jobs, "nothing of a job in kube-system is followed"
    (words,) = said(caplog, "never creates or deletes pods there")
    assert "job kube-system/job is in namespace kube-system" in words and "whatever RBAC allows" in words


@pytest.mark.parametrize("ns", ["kube-system", "kube-public", "kube-node-lease"])
def test_the_pod_writer_itself_refuses_kubernetes_own_namespaces(ns):
    class Api:
        def __getattr__(self, name):
            raise AssertionError(f"{name} called for {ns}")

    writer = PodWriter(Api())
    with pytest.raises(ValueError, match=f"never writes pods in namespace {ns}"):
        writer.create({"metadata": {"namespace": ns, "name": "x"}})
    with pytest.raises(ValueError, match=f"never writes pods in namespace {ns}"):
        writer.delete(f"{ns}/x", "uid-x")


def test_a_namespace_not_enabled_is_said_once_in_words_and_tried_again_less_and_less_often(caplog):
    now = [0.0]
    pods = a_job_with_a_lost_member("team-b")
    w = NotEnabled(pods, refused={"team-b"})
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="tessera.bridge"):
        bridge.turn()
        assert w.tries == [("create", "team-b")] and bridge.refused_namespaces == 1
        (words,) = said(caplog, "is not enabled for Ray jobs")
        assert "namespace team-b is not enabled for Ray jobs: the apiserver refused the bridge's pods create" in words
        assert ("kubectl -n team-b create rolebinding tessera-bridge-jobs --clusterrole=tessera-bridge-jobs "
                "--serviceaccount=tessera-system:tessera-bridge") in words
        assert [(e[0], e[2], e[3]) for e in w.events] == [("team-b/b", "TesseraNamespaceNotEnabled", words)]
        # one try per pause, whatever the turns: 60 s, then 120, 240, 480, 600, 600 ...
        at = REFUSED_RETRY_FIRST_S
        for pause in (120.0, 240.0, 480.0, REFUSED_RETRY_MAX_S, REFUSED_RETRY_MAX_S):
            tries = len(w.tries)
            for now[0] in (at - 1, at - 0.5):
                bridge.turn()
            assert len(w.tries) == tries, f"tried before {at} s"
            now[0] = at
            bridge.turn()
            bridge.turn()
            assert len(w.tries) == tries + 1, f"one try at {at} s"
            at += pause
        assert len(said(caplog, "is not enabled for Ray jobs")) == 1 and len(w.events) == 1, "said once"
        # enabled meanwhile: the next try creates the replacement at once (the refusals cost the member's slot nothing)
        w.refused.clear()
        now[0] = at
        bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b-r1"] and bridge.refused_namespaces == 0
    assert said(caplog, "namespace team-b: the apiserver allows the bridge's pod writes again")


def test_one_namespace_not_enabled_leaves_the_others_repaired(caplog):
    off, on = a_job_with_a_lost_member("team-b"), a_job_with_a_lost_member("team-a")
    pods = Pods(list(off.pods.values()) + list(on.pods.values()))
    w = NotEnabled(pods, refused={"team-b"})
    bridge = Bridge(pods, w, KEY, clock=lambda: 0.0)
    for _ in range(3):
        bridge.turn()
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in w.created] == [("team-a", "b-r1")]
    assert w.tries.count(("create", "team-b")) == 1


def test_a_refused_delete_of_its_own_pod_is_said_once_and_not_sent_every_turn(caplog):
    """The namespace's RoleBinding went after the bridge made a pod there: its lost replacement cannot be deleted."""
    now = [0.0]
    own = {CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "team-b/b", LOST_ANNOTATION: "x",
           BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "team-b", "b-r1", "team-b/b", "job")}
    pods = Pods([in_namespace(started(pod("a", "n1")), "team-b"), in_namespace(started(pod("b-r1", "n3", extra=own)), "team-b")])
    w = NotEnabled(pods, refused={"team-b"}, verbs=("delete",))
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="tessera.bridge"):
        for now[0] in (0.0, 1.0, 2.0, 30.0):
            bridge.turn()
    assert w.tries.count(("delete", "team-b")) == 1 and w.deleted == []
    (words,) = said(caplog, "is not enabled for Ray jobs")
    assert "refused the bridge's pods delete there" in words
    assert "the lost pods it made for job team-b/job are not deleted" in words
    assert [e[2] for e in w.events].count("TesseraNamespaceNotEnabled") == 1  # on the pod it could not delete
    assert ("team-b/b-r1", "uid-b-r1", "TesseraNamespaceNotEnabled") in [e[:3] for e in w.events]


class _Api:
    """create_namespaced_pod / delete_namespaced_pod answering one ApiException."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message, self.calls = status, message, 0

    def _raise(self):
        self.calls += 1
        e = ApiException(status=self.status, reason="Forbidden")
        e.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": self.status,
                             "message": self.message})
        raise e

    def create_namespaced_pod(self, ns, body):
        self._raise()

    def delete_namespaced_pod(self, name, ns, body=None):
        self._raise()


@pytest.mark.parametrize("verb", ["create", "delete"])
def test_the_pod_writer_tells_an_rbac_refusal_from_admission_and_quota(verb, caplog):
    """All three answer 403 Forbidden; only the authorizer's names the missing right. A quota or Pod Security refusal
    stays a refused create (tried again after the slot's backoff), not a namespace that is not enabled."""
    body = {"metadata": {"namespace": "team-b", "name": "b-r1"}}

    def call(api):
        writer = PodWriter(api)
        return writer.create(body) if verb == "create" else writer.delete("team-b/b-r1", "uid-1")

    with pytest.raises(Forbidden) as refused:
        call(_Api(403, RBAC_DENIAL.format(verb=verb, ns="team-b")))
    assert (refused.value.namespace, refused.value.verb) == ("team-b", verb)
    for message in ('pods "b-r1" is forbidden: exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10',
                    'pods "b-r1" is forbidden: violates PodSecurity "restricted:latest": hostPID=true'):
        assert call(_Api(403, message)) in ("", None)
    assert call(_Api(409, "Conflict")) in ("", None)
