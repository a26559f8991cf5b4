"""The privileged bridge against a hostile tenant: what one tenant writes on its own pods must never stop
the bridge, make it flood the apiserver, or make it touch another job. Figures are the audit's (/tmp/h6)."""

from __future__ import annotations

import json
import logging

import pytest

from raybridge.bridge import KEY_MIN_BYTES, Bridge, load_key, pod_mac, serve
from raybridge.contract import BRIDGE_MAC_ANNOTATION, CREATED_BY_ANNOTATION, LOST_ANNOTATION, REPLACES_ANNOTATION

from .test_bridge_k8s_only import KEY, Pods, Writer, started
from .test_contract_decide import pod


def test_a_non_ascii_bridge_mac_is_no_mac_and_stops_nothing():
    """Before: hmac.compare_digest raised TypeError on a non-ASCII str; turn() raised, serve() had no guard,
    and the bridge crash-looped on every restart (it relists and meets the pod again)."""
    evil = started(pod("evil", "n1", size=1, extra={CREATED_BY_ANNOTATION: "tessera-bridge", LOST_ANNOTATION: "x",
                                                     REPLACES_ANNOTATION: "ml/x", BRIDGE_MAC_ANNOTATION: "\u00e9" * 64}))
    for mac in ("\u00e9" * 64, "AB" * 32, "0" * 63, "g" * 64, "0" * 6400):
        evil["metadata"]["annotations"][BRIDGE_MAC_ANNOTATION] = mac
        pods = Pods([evil])
        w = Writer(pods)
        bridge = Bridge(pods, w, KEY)
        bridge.turn()
        assert w.deleted == [] and bridge.job_errors == 0, mac


class Flaky(Writer):
    """An API client that raises something other than ApiException, for one namespace only."""

    def delete(self, key, uid):
        if key.startswith("bad/"):
            raise RuntimeError("client bug")
        super().delete(key, uid)


def test_one_jobs_exception_never_stops_the_other_jobs_and_is_logged_once(caplog):
    own = {LOST_ANNOTATION: "x", REPLACES_ANNOTATION: "bad/z", CREATED_BY_ANNOTATION: "tessera-bridge",
           BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "bad", "a", "bad/z", "job")}
    bad = started(pod("a", "n1", size=1, extra=own))
    bad["metadata"]["namespace"] = "bad"  # the bridge's own lost pod: deleted every turn, and the delete raises
    good = started(pod("b", "n2", size=1, gang="other", extra={LOST_ANNOTATION: "x"}))
    pods = Pods([bad, good])
    w = Flaky(pods)
    bridge = Bridge(pods, w, KEY)
    with caplog.at_level(logging.ERROR, logger="tessera.bridge"):
        for _ in range(5):
            bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["a-r1", "b-r1"], "the good job is repaired"
    assert bridge.job_errors == 5 and len([r for r in caplog.records if "bad/job" in r.getMessage()]) == 1


def test_serve_goes_on_when_a_whole_turn_raises(monkeypatch):
    """Before: `while True: bridge.turn()`: any exception ended the cluster-wide bridge."""

    class Watch:
        synced = type("E", (), {"wait": lambda self: None})()

        def __init__(self, *a):
            pass

        def run(self):
            pass

        def snapshot(self):
            raise RuntimeError("snapshot broke")

    class Stop(Exception):
        pass

    turns = []

    def sleep(_):
        turns.append(1)
        if len(turns) == 3:
            raise Stop

    monkeypatch.setattr("raybridge.kube.PodWatch", Watch)
    monkeypatch.setattr("raybridge.kube.PodWriter", lambda api: None)
    monkeypatch.setattr("raybridge.metrics.serve_metrics", lambda *a: None)
    monkeypatch.setattr("raybridge.bridge.time.sleep", sleep)
    monkeypatch.delenv("TESSERA_BRIDGE_KEY", raising=False)
    with pytest.raises(Stop):
        serve(object(), "127.0.0.1:9500")
    assert len(turns) == 3, "three turns raised, the loop went on"


def test_the_environment_key_has_the_key_files_minimum(monkeypatch, tmp_path):
    """Before: --key-file refused a key under 32 bytes, TESSERA_BRIDGE_KEY took one byte."""
    with pytest.raises(ValueError, match="TESSERA_BRIDGE_KEY: .* at least 32 bytes"):
        load_key(None, "k")
    short = tmp_path / "key"
    short.write_bytes(b"k" * (KEY_MIN_BYTES - 1))
    with pytest.raises(ValueError, match="--key-file"):
        load_key(str(short), None)
    assert load_key(None, "k" * KEY_MIN_BYTES) == b"k" * KEY_MIN_BYTES and load_key(None, None) is None
    monkeypatch.setenv("TESSERA_BRIDGE_KEY", "short")
    monkeypatch.setattr("raybridge.kube.PodWatch", lambda *a: pytest.fail("the bridge started its pod watch"))
    with pytest.raises(ValueError, match="TESSERA_BRIDGE_KEY"):
        serve(object(), "127.0.0.1:9500")


def _heavy_pods(n, rv="1"):
    """The audit's hostile pods: a 64-KiB train-config and a 64-KiB progress each (/tmp/h6/bridge_parse_cost.py)."""
    import json

    from raybridge.contract import CONFIG_ANNOTATION, PROGRESS_ANNOTATION

    cfg, prog = json.dumps({"k": [0] * 21500}), json.dumps({"gone": [], "x": [[]] * 16000})
    pods = [pod(f"p{i}", gang=f"j{i}", size=1, extra={CONFIG_ANNOTATION: cfg, PROGRESS_ANNOTATION: prog})
            for i in range(n)]
    for p in pods:
        p["metadata"]["resourceVersion"] = rv
    return pods


def test_a_pod_is_decoded_once_per_resource_version(monkeypatch):
    """Before: every 0.2-s turn decoded every Ray pod again: 1,000 hostile pods took 2.3 s a turn here.
    Now a turn decodes only pods whose (uid, resourceVersion) it has not met; a changed pod is decoded again.
    (Counted, not timed: the cost of a turn is the number of decodes.)"""
    from raybridge import decide

    decoded = []
    real = decide.member
    monkeypatch.setattr(decide, "member", lambda pod: decoded.append(pod["metadata"]["name"]) or real(pod))
    pods = Pods(_heavy_pods(200))
    bridge = Bridge(pods, Writer(pods), KEY)
    bridge.turn()
    assert len(decoded) == 200
    for _ in range(5):
        bridge.turn()
    assert len(decoded) == 200, "unchanged pods are not decoded again"
    changed = pods.pods["ml/p0"]
    changed["metadata"]["annotations"]["tessera.dev/gang-size"] = "x"
    changed["metadata"]["resourceVersion"] = "2"
    bridge.turn()
    assert decoded[200:] == ["p0"]
    assert any("ml/p0" in e for e in bridge._reported), "the new version is read"


def test_the_member_cache_is_bounded_and_forgets_deleted_pods():
    from raybridge.decide import MemberCache, group_jobs

    cache = MemberCache(bound=3)
    pods = _heavy_pods(5)
    assert len(group_jobs(pods, cache).members) == 5 and len(cache._last) == 3
    group_jobs(pods[:1], cache)
    assert list(cache._last) == [("uid-p0", "1")]


class _Page:
    def __init__(self, items, token, rv):
        self.items = items
        self.metadata = type("M", (), {"_continue": token, "resource_version": rv})()


class _PagedApi:
    """list_pod_for_all_namespaces in pages of `limit`, like the apiserver."""

    def __init__(self, pods):
        self.pods, self.calls = pods, []
        self.api_client = type("C", (), {"sanitize_for_serialization": staticmethod(lambda o: o)})()

    def list_pod_for_all_namespaces(self, limit=None, _continue=None):
        self.calls.append(limit)
        start = int(_continue or 0)
        end = start + limit if limit else len(self.pods)
        return _Page(self.pods[start:end], str(end) if end < len(self.pods) else None, "42")


def test_the_pod_watch_lists_in_pages():
    """Before: one unpaged list of every pod in the cluster."""
    from raybridge.kube import LIST_PAGE, PodWatch

    plain = [{"metadata": {"name": f"x{i}", "namespace": "a"}} for i in range(LIST_PAGE + 10)]
    ray = _heavy_pods(3)
    api = _PagedApi(plain + ray)
    pods, rv = PodWatch(api)._list()
    assert api.calls == [LIST_PAGE, LIST_PAGE] and rv == "42"
    assert [p["metadata"]["name"] for p in pods] == ["p0", "p1", "p2"], "only Ray pods kept"


def _progress(gone):
    import json

    from raybridge.contract import PROGRESS_ANNOTATION

    return {PROGRESS_ANNOTATION: json.dumps({"gone": gone})}


def test_a_gone_list_from_pods_that_never_ran_creates_nothing():
    """Before (/tmp/h6/bridge_gone_flood.py): four Pending, unbound pods of a gang of 10,000 listing 2,800 names
    each made the bridge create 9,996 pods in one turn, and 9,996 more at each rewrite of the list."""
    flood = [started(pod(f"m{i}", size=10000, phase="Pending", extra=_progress([f"ml/g-{i}-{j}" for j in range(2800)])))
             for i in range(4)]
    pods = Pods(flood)
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY)
    for _ in range(3):
        bridge.turn()
    assert w.created == []


def test_creates_are_capped_per_job_each_turn_and_a_namespace_holds_one_job():
    """A running, bound member may list gone pods (a restarted bridge never saw them), but one turn creates at most
    MAX_CREATES_PER_JOB_TURN for a job. Six such jobs in one namespace made 32 a turn there (a per-namespace cap);
    a namespace is one job's now (test_bridge_one_job_per_namespace.py), so they get none, and the job's cap is its
    namespace's: six namespaces, six jobs, 8 each."""
    from raybridge.bridge import MAX_CREATES_PER_JOB_TURN

    def job(i, ns):
        p = started(pod(f"m{i}", f"n{i}", size=10000, gang=f"j{i}", extra=_progress([f"{ns}/g{i}-{j}" for j in range(2800)])))
        p["metadata"]["namespace"] = ns
        return p

    pods = Pods([job(i, "ml") for i in range(6)])
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert w.created == []
    pods = Pods([job(i, f"t{i}") for i in range(6)])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY)
    bridge.turn()
    per_namespace = {}
    for c in w.created:
        per_namespace[c["metadata"]["namespace"]] = per_namespace.get(c["metadata"]["namespace"], 0) + 1
    assert per_namespace == {f"t{i}": MAX_CREATES_PER_JOB_TURN for i in range(6)}


def test_what_the_bridge_remembers_of_a_rewritten_gone_list_goes_with_it():
    """Before: every name ever tried stayed in the job's `replaced`, refused creates included (29,988 after
    three rewrites of the list in /tmp/h6/bridge_gone_flood.py). Now only names a pod still gives."""

    class Refusing(Writer):
        def create(self, body):
            return ""  # quota, admission

    member = started(pod("m", "n1", size=10000))
    pods = Pods([member])
    bridge = Bridge(pods, Refusing(pods), KEY)
    for rnd in range(20):
        member["metadata"]["annotations"].update(_progress([f"ml/g{rnd}-{j}" for j in range(50)]))
        bridge.turn()
    assert bridge.jobs["ml/job"].replaced <= {f"ml/g19-{j}" for j in range(50)}


def test_the_bridges_warning_events_are_rate_limited():
    """60 a minute across all tenants, as the extender's own (extender/kube/cache.py EVENTS_PER_MINUTE)."""
    from raybridge.bridge import EVENTS_PER_MINUTE

    lost = []
    for i in range(100):
        p = started(pod(f"a{i}", f"n{i}", size=1, gang=f"j{i}", extra={LOST_ANNOTATION: "x"}))
        p["metadata"]["namespace"] = f"t{i}"
        lost.append(p)
    pods = Pods(lost)
    w = Writer(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    bridge.turn()
    assert len(w.created) == 100 and len(w.events) == EVENTS_PER_MINUTE and bridge.events_dropped == 40


def test_gone_never_copies_another_jobs_live_pod():
    """Before: a job listing another job's live pod (same namespace) as gone made the bridge copy that pod's spec
    (its image, its ServiceAccount, its volumes) into a new pod: _replace looked names up across all Ray pods. (Two
    jobs in one namespace now get nothing at all; `gone` still never copies a pod that is not the job's.)"""
    victim = started(pod("victim", "n2", gang="other", size=1))
    victim["spec"]["serviceAccountName"] = "other-sa"
    evil = started(pod("evil", "n1", size=2, extra=_progress(["ml/victim"])))
    pods = Pods([evil, victim])
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert w.created == []


class Crashing(Writer):
    """Every pod the bridge creates fails at once (restartPolicy Never, the container exits: phase Failed)."""

    def create(self, body):
        uid = super().create(body)
        self.pods.pods[f"{body['metadata']['namespace']}/{body['metadata']['name']}"]["status"] = {"phase": "Failed"}
        return uid


def test_a_crash_looping_member_is_replaced_with_backoff():
    """Before (/tmp/h6/bridge_crashloop.py): 20,000 turns (67 min at 0.2 s) made 20,000 pods, 19,999 deletes
    and 20,000 Events, the 20,000th name found after trying 20,000. Now 10 s doubling to 10 min: 12 creates."""
    from raybridge.bridge import BACKOFF_MAX_S

    pods = Pods([started(pod("m0", "n1")), started(pod("m1", "n2", phase="Failed"))])
    w = Crashing(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    for _ in range(20000):
        bridge.turn()
        now[0] += 0.2
    names = [c["metadata"]["name"] for c in w.created]
    assert len(names) == 12 and names[-1] == "m1-r12" and len(w.events) == 12 and len(w.deleted) == 12
    assert bridge.jobs["ml/job"].slots["m1"].tries == 12
    now[0] += 2 * BACKOFF_MAX_S  # no replacement for 20 min: the slot starts over
    bridge.turn()
    assert w.created[-1]["metadata"]["name"] == "m1-r13" and bridge.jobs["ml/job"].slots["m1"].tries == 1


def test_replacements_per_job_stop_for_the_window_and_the_job_is_told():
    from raybridge.bridge import REPLACEMENTS_PER_WINDOW, WINDOW_S

    size = REPLACEMENTS_PER_WINDOW + 8
    pods = Pods([started(pod(f"m{i}", f"n{i}", size=size, extra={LOST_ANNOTATION: "x"})) for i in range(size)])
    w = Writer(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    for _ in range(10):
        bridge.turn()
        now[0] += 0.2
    assert len(w.created) == REPLACEMENTS_PER_WINDOW
    paused = [e for e in w.events if e[2] == "TesseraReplacementsPaused"]
    assert len(paused) == 1 and "no more of its pods" in paused[0][3]
    now[0] += WINDOW_S
    bridge.turn()
    assert len(w.created) == REPLACEMENTS_PER_WINDOW + 8


def test_a_refused_create_is_tried_again_after_the_backoff():
    """Before: a name whose create was refused (quota) was marked replaced and never tried again."""

    class RefusingOnce(Writer):
        refused = False

        def create(self, body):
            if not self.refused:
                self.refused = True
                return ""
            return super().create(body)

    pods = Pods([started(pod("a", "n1")), started(pod("b", "n2", extra={LOST_ANNOTATION: "x"}))])
    w = RefusingOnce(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    bridge.turn()
    now[0] += 5
    bridge.turn()
    assert w.created == []
    now[0] += 6
    bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b-r2"]


def test_renaming_the_gang_every_turn_stops_the_bridge_in_the_namespace():
    """Jobs are keyed by the gang name the tenant writes: renaming it every turn made a new job with a fresh window
    and backoff each time, 300 pods in a minute for a gang of 2 (audit, 2026-12-02); the namespace's window then held
    it to 64. A renamed pod has changed jobs: no job's word is taken in its namespace while it lives."""
    pods = Pods([started(pod("a", "n1", size=2)), started(pod("b", "n2", size=2, extra={LOST_ANNOTATION: "x"}))])
    w = Writer(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    for turn in range(300):  # a minute of 0.2-s turns
        for key in ("ml/a", "ml/b"):
            pods.pods[key]["metadata"]["annotations"]["tessera.dev/gang-name"] = f"g{turn}"
        bridge.turn()
        now[0] += 0.2
    assert [c["metadata"]["name"] for c in w.created] == ["b-r1"], "the first turn's, before any rename was seen"
    assert [reason for _, _, reason, _ in w.events].count("TesseraNamespaceShared") == 2, "said once, on each job's pod"


def test_successive_jobs_in_one_namespace_get_no_more_replacements_than_its_window():
    """A job is forgotten with its last pod: the next job in the namespace starts a fresh window of its own, so the
    namespace's (64 in 10 min) still bounds a tenant that runs job after job, each failing at once."""
    from raybridge.bridge import REPLACEMENTS_PER_NAMESPACE_WINDOW, REPLACEMENTS_PER_WINDOW

    size = REPLACEMENTS_PER_WINDOW + 8
    pods = Pods([])
    w = Writer(pods)
    now = [0.0]
    bridge = Bridge(pods, w, KEY, clock=lambda: now[0])
    made = []
    for j in range(3):
        pods.pods = {f"ml/j{j}-{i}": started(pod(f"j{j}-{i}", f"n{i}", size=size, gang=f"j{j}", extra={LOST_ANNOTATION: "x"}))
                     for i in range(size)}
        for _ in range(10):
            bridge.turn()
            now[0] += 0.2
        made.append(len(w.created))
    assert made == [REPLACEMENTS_PER_WINDOW, REPLACEMENTS_PER_NAMESPACE_WINDOW, REPLACEMENTS_PER_NAMESPACE_WINDOW]
    assert sum(reason == "TesseraReplacementsPaused" and "in namespace ml" in said for _, _, reason, said in w.events) == 1


def test_a_lingering_terminating_pod_of_the_bridges_own_is_deleted_once():
    """A replacement whose grace period the tenant set to 10^9 s stays Terminating; it was DELETEd every turn."""

    class Graceful(Writer):  # as the apiserver does: a delete sets deletionTimestamp, the pod stays
        def delete(self, key, uid):
            self.deleted.append((key, uid))
            if key in self.pods.pods:
                self.pods.pods[key]["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"

    pods = Pods([started(pod("a", "n1")), started(pod("b", "n2", extra={LOST_ANNOTATION: "x"}))])
    w = Graceful(pods)
    bridge = Bridge(pods, w, KEY)
    bridge.turn()
    pods.pods["ml/b-r1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"
    for _ in range(50):
        bridge.turn()
    assert [k for k, _ in w.deleted] == ["ml/b-r1"] and bridge.deletes == 1


@pytest.mark.parametrize("name", ["x\n2026-01-01 CRITICAL tessera.bridge: forged", "x\x1b]0;pwned\x07", "X", "a" * 254])
def test_a_gone_entry_that_is_no_pod_name_is_no_claim(name):
    """The bridge logs a `gone` name and targets an Event with it: a newline and ESC sequences forged log lines."""
    from raybridge.contract import _gone

    assert _gone(json.dumps({"gone": [f"ml/{name}", "ml/ok-1"]}), "ml", 4) == ("ml/ok-1",)


def test_one_namespaces_churn_leaves_the_others_their_events():
    """The bridge's Events were one budget for all tenants: one tenant's churn took all 60 a minute."""
    from raybridge.bridge import EVENTS_PER_NAMESPACE_MINUTE

    churn = [started(pod(f"m{i}", f"n{i}", size=40, extra={LOST_ANNOTATION: "x"})) for i in range(40)]
    other = started(pod("y", "n99", size=1, gang="other", extra={LOST_ANNOTATION: "x"}))
    other["metadata"]["namespace"] = "team-b"
    pods = Pods([*churn, other])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=lambda: 0.0)
    for _ in range(10):
        bridge.turn()
    lost = [key.split("/")[0] for key, _, reason, _ in w.events if reason == "TrainerLost"]
    assert lost.count("ml") == EVENTS_PER_NAMESPACE_MINUTE and lost.count("team-b") == 1


def test_a_bridge_mac_copied_onto_a_later_pod_of_the_same_name_gets_it_deleted_by_no_running_bridge():
    """The MAC binds namespace, name and the replaced pod, not the UID: copied onto a pod created later under the
    name of a replacement the bridge had deleted, it had that pod deleted too (audit, 2026-12-02). A pod created
    since the bridge started is its own only by the UID its create returned."""
    pods = Pods([started(pod("a", "n1")), started(pod("b", "n2", extra={LOST_ANNOTATION: "x"}))])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, started_s=1_000.0)
    bridge.turn()
    stolen = dict(pods.pods["ml/b-r1"]["metadata"]["annotations"])
    pods.pods["ml/b-r1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"
    bridge.turn()
    assert w.deleted == [("ml/b-r1", "uid-b-r1")]  # its own, by the UID its create returned
    copied = {k: stolen[k] for k in (REPLACES_ANNOTATION, CREATED_BY_ANNOTATION, BRIDGE_MAC_ANNOTATION)}
    later = started(pod("b-r1", "n3", extra={**copied, LOST_ANNOTATION: "x"}))
    later["metadata"].update(uid="someone-elses", creationTimestamp="1970-01-01T00:20:00Z")  # 1,200 s: after the start
    pods.pods["ml/b-r1"] = later
    for _ in range(3):
        bridge.turn()
    assert w.deleted == [("ml/b-r1", "uid-b-r1")]
    # a bridge that started after that pod was made (a restart) trusts the MAC, as it must for its own old pods
    restarted = Writer(pods)
    Bridge(pods, restarted, KEY, started_s=1_300.0).turn()
    assert restarted.deleted == [("ml/b-r1", "someone-elses")]
