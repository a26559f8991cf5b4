"""ApiCache applies each object's states in resourceVersion order, even when a relist (a snapshot)
runs beside a watch that already applied newer events."""

import json
from types import SimpleNamespace

from extender.kube.cache import ApiCache
from extender.service import Extender
from extender.translate.objects import node_inventory
from testing.kube_objects import k8s_node, k8s_pod


def with_rv(obj, rv):
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


class ListedAt:
    """What the apiserver returned for a list: a snapshot at `rv` (no watch, no network)."""

    def __init__(self, rv, nodes, pods):
        self.rv, self.nodes, self.pods = rv, nodes, pods

    def _body(self, items):
        return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": str(self.rv)}, "items": items}))

    def list_node(self, **_):
        return self._body(self.nodes)

    def list_pod_for_all_namespaces(self, **_):
        return self._body(self.pods)


def test_a_relist_does_not_resurrect_a_pod_the_watch_deleted_nor_drop_one_it_added():
    ext = Extender()
    node = with_rv(k8s_node("a"), 1)
    ext.upsert_node(node_inventory(node))
    held = k8s_pod("p", milli=500, node="a", phase="Running", assignment={"node": "a", "gpus": [0], "milli": 500})
    newer = k8s_pod("q", milli=300, node="a", phase="Running", assignment={"node": "a", "gpus": [1], "milli": 300})
    cache = ApiCache(ListedAt(100, [node], [with_rv(dict(held), 90)]), ext)
    cache._pod("ADDED", with_rv(json.loads(json.dumps(held)), 90))
    # the watch, while a relist's list (taken at 100) is in flight: p deleted at 105, q added at 110
    cache._pod("DELETED", with_rv(json.loads(json.dumps(held)), 105))
    cache._pod("ADDED", with_rv(json.loads(json.dumps(newer)), 110))
    cache.relist()  # applies the snapshot: p at 90 (older than its deletion), q absent (added after)
    assert set(ext.cluster.assignments) == {"ml/q"}, "p came back from the stale list, or q was dropped"
    assert ext.cluster.by_name["a"].gpu_free[:2] == [1000, 700]
    # a later, newer state of a deleted pod's uid is still applied (the rule is order, not a ban)
    cache._pod("ADDED", with_rv(json.loads(json.dumps(held)), 120))
    assert "ml/p" in ext.cluster.assignments


def test_an_object_without_an_integer_resource_version_is_applied_as_it_comes():
    ext = Extender()
    cache = ApiCache(ListedAt(1, [], []), ext)
    cache._node("ADDED", k8s_node("x"))  # no resourceVersion at all
    assert "x" in ext.cluster.by_name
