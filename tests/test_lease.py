"""LeaseElector's rules against an API that keeps a Lease as the apiserver does (resourceVersion on each write)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from kubernetes.client.exceptions import ApiException

from extender.kube.lease import LeaseConfig, LeaseElector


class Leases:
    """One Lease; every write bumps its resourceVersion, and a write against a stale one gets 409."""

    def __init__(self):
        self.lease: dict | None = None
        self.version = 0

    def _stored(self, body):
        self.version += 1
        self.lease = json.loads(json.dumps(body))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return SimpleNamespace(data=json.dumps(self.lease).encode())

    def read_namespaced_lease(self, name, namespace, _preload_content=False):
        if self.lease is None:
            raise ApiException(status=404)
        return SimpleNamespace(data=json.dumps(self.lease).encode())

    def create_namespaced_lease(self, namespace, body, _preload_content=False):
        if self.lease is not None:
            raise ApiException(status=409)
        return self._stored(body)

    def replace_namespaced_lease(self, name, namespace, body, _preload_content=False):
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        return self._stored(body)

    def name_holder(self, identity):
        """Whoever may write the Lease puts a name in it."""
        self.lease["spec"]["holderIdentity"] = identity
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)


def elector(api, identity, clock):
    cfg = LeaseConfig("tessera-system", "tessera-extender", identity, f"https://{identity}", 15.0, 10.0, 2.0)
    return LeaseElector(api, cfg, clock=lambda: clock[0])


def test_a_lease_writer_naming_a_follower_does_not_make_two_binders():
    """Naming a follower in holderIdentity made it bind at its next round while the real holder still bound until
    its own next round; two replicas then gave one GPU's 700 milli to two pods. The named follower now waits the
    record out for the Lease's duration, as it would any other holder's."""
    clock, api = [0.0], Leases()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_once() and a.is_leader()
    assert not b.try_once() and not b.is_leader()
    api.name_holder("b")
    clock[0] = 1.0
    assert not b.try_once() and not b.is_leader(), "a record b did not write is not b's"
    clock[0] = 5.0
    assert not a.try_once() and not a.is_leader()  # a sees another holder and stops binding
    clock[0] = 1.0 + 15.0 + 0.1  # the record has not changed for the Lease's duration: b may take it
    assert b.try_once() and b.is_leader()
    clock[0] += 2.0
    assert b.try_once() and b.is_leader(), "its own record renews at once"
    assert not a.try_once() and not a.is_leader()
