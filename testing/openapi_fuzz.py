"""Schemathesis over extender/http/openapi.yaml against the app in-process (WSGI), with the state checked.

Used by tests/test_fuzz_openapi.py (a few hundred requests per verb) and bench/fuzz.py (10,000 per
verb). Each generated request must get an answer the document allows (status code, content type,
body schema), never a 5xx, an error in words when refused, and leave the extender's placement state
(free capacity, assignments, reservations) as it was unless it was a successful bind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from testing.fuzzkit import Live, P, check_answer, refused

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class Tally:
    requests: int = 0
    statuses: Counter = field(default_factory=Counter)
    refused: int = 0
    binds_done: int = 0
    state_changes_on_refusal: int = 0


def schema_for(world: Live):
    return schemathesis.openapi.from_wsgi("/openapi.yaml", world.app)


def fuzz(world: Live, path: str, method: str, mode: GenerationMode, examples: int, tally: Tally) -> Tally:
    """Send `examples` generated requests (hypothesis may stop early on a tiny input space); raise on the first failure."""
    operation = schema_for(world)[path][method]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(case=operation.as_strategy(mode))
    def one(case):
        before, calls = world.extender.snapshot(), len(world.binder.calls)
        response = case.call()
        tally.requests += 1
        tally.statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)
        if not path.startswith(P + "/"):  # healthz, inspect, metrics: the document's checks are the whole contract
            assert world.extender.snapshot() == before
            return
        answer = check_answer(response.status_code, response.content, path)
        after = world.extender.snapshot()
        if refused(response.status_code, answer):
            tally.refused += 1
            if after.placement != before.placement or len(world.binder.calls) != calls:
                tally.state_changes_on_refusal += 1
                raise AssertionError(f"{method} {path} refused {case.body!r:.300} but changed the extender's state")
        elif path.endswith("/bind"):
            tally.binds_done += 1
        if response.status_code >= 400:
            assert after.pods == before.pods, f"{method} {path}: a {response.status_code} changed the pods known"

    one()
    return tally
