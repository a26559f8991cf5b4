"""ForgeryLedger's own rules: one warning per new verdict, cleared when the annotation verifies."""

import logging

from extender.core.model import PodRequest
from extender.forgery import ForgeryLedger
from extender.translate.objects import PodInfo


def pod(forged: str = "", uid: str = "uid-p") -> PodInfo:
    return PodInfo(uid, "ml/p", PodRequest("ml/p", gpu_count=1, gpu_milli=500), "a", None, None, forged=forged)


def test_a_forgery_is_logged_once_per_verdict_not_once_per_watch_event(caplog):
    ledger = ForgeryLedger()
    with caplog.at_level(logging.WARNING, logger="extender.forgery"):
        assert ledger.note(pod("no MAC")) is True
        assert ledger.note(pod("no MAC")) is False  # the same pod's next status update
        assert ledger.note(pod("MAC does not match")) is True  # a new verdict is worth a new line
    assert [r.getMessage() for r in caplog.records] == ["pod ml/p: no MAC", "pod ml/p: MAC does not match"]
    assert ledger.reasons == {"uid-p": "MAC does not match"}


def test_an_annotation_that_verifies_again_clears_the_record():
    ledger = ForgeryLedger()
    ledger.note(pod("no MAC"))
    ledger.note(pod("no MAC", uid="uid-q"))
    assert ledger.note(pod()) is False
    assert ledger.reasons == {"uid-q": "no MAC"}
    ledger.forget("uid-q")
    ledger.forget("uid-never-seen")  # a deleted pod that was never forged: nothing to do
    assert ledger.reasons == {}
