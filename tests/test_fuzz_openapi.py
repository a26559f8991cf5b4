"""The OpenAPI description of the endpoints, fuzzed by schemathesis (a short run; bench/fuzz.py runs 10,000 per verb)."""

from __future__ import annotations

import pytest
import yaml
from schemathesis import GenerationMode

from extender.http.openapi import openapi_yaml
from testing.fuzzkit import P, live
from testing.openapi_fuzz import Tally, fuzz, schema_for

VERBS = [f"{P}/{v}" for v in ("filter", "prioritize", "bind", "preempt")]


def test_the_served_document_lists_every_endpoint_under_the_servers_prefix():
    world = live()
    served = yaml.safe_load(world.client.get("/openapi.yaml").data)
    assert set(served["paths"]) == set(VERBS) | {"/healthz", "/readyz", "/inspect", "/metrics", "/openapi.yaml", "/"}
    moved = yaml.safe_load(openapi_yaml("/x/y"))
    assert "/x/y/bind" in moved["paths"] and "/healthz" in moved["paths"]
    operations = {(op.path, op.method) for op in (r.ok() for r in schema_for(world).get_all_operations())}
    assert operations >= {(v, "post") for v in VERBS}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", VERBS)
def test_generated_requests_get_documented_answers_and_change_nothing_when_refused(path, mode):
    tally = fuzz(live(), path, "POST", mode, examples=60, tally=Tally())
    assert tally.requests >= 30 and tally.state_changes_on_refusal == 0
    assert not any(code >= 500 for code in tally.statuses)
    if mode is GenerationMode.NEGATIVE:
        assert tally.refused > 0  # schema-breaking bodies are refused (some stay acceptable: keys are case-insensitive)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/inspect", "/metrics", "/"])
def test_the_other_endpoints(path):
    tally = fuzz(live(), path, "GET", GenerationMode.POSITIVE, examples=30, tally=Tally())
    assert tally.requests >= 1 and not any(code >= 500 for code in tally.statuses)
