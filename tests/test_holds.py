"""Bind holds' own rules: a hold expires after its TTL, never while its bind call is in flight."""

from extender.holds import BindHolds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_expires_only_after_its_ttl_and_once_its_bind_call_returned():
    clock = Clock()
    holds = BindHolds(ttl_s=30, clock=clock)
    holds.hold("uid-p")
    clock.now += 31
    assert holds.expired() == []  # the API call is still in flight: a slow API server must not double-book
    holds.binding.discard("uid-p")  # the call returned; the watch has not confirmed
    clock.now -= 2  # 29 s after the hold
    assert holds.expired() == []
    clock.now += 1  # 30 s: the TTL is inclusive
    assert holds.expired() == ["uid-p"]


def test_a_filter_after_the_bind_returned_is_a_retry_and_a_dropped_hold_is_no_hold():
    holds = BindHolds(ttl_s=30, clock=Clock())
    holds.hold("uid-p")
    assert not holds.awaiting_watch("uid-p")  # bind still running: its own filter is not a retry
    holds.binding.discard("uid-p")
    assert holds.awaiting_watch("uid-p")
    holds.drop("uid-p")
    holds.drop("uid-p")  # the watch and an expiry may both drop it
    assert not holds.awaiting_watch("uid-p") and holds.expired() == [] and holds.expiry == {}
