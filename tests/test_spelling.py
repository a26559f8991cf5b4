"""tessera_contract/spelling.py: which keys miss Tessera's domain by a slip, and what they read as (issue 33, item 6)."""

from __future__ import annotations

import pytest

from tessera_contract.spelling import near_domain, one_edit


@pytest.mark.parametrize("a, b, near", [
    ("tessera.dev", "tessera.dev", True),
    ("tesera.dev", "tessera.dev", True),  # dropped
    ("tesssera.dev", "tessera.dev", True),  # added
    ("tessera-dev", "tessera.dev", True),  # replaced
    ("tessera.dve", "tessera.dev", True),  # neighbours swapped
    ("etssera.dev", "tessera.dev", True),  # swapped at the start
    ("tessa.dev", "tessera.dev", False),  # two dropped
    ("tessera.io", "tessera.dev", False),
    ("tessera.edv", "tessera.dev", True),
    ("tessera.vde", "tessera.dev", False),  # a rotation is two edits
    ("", "a", True),
    ("", "ab", False),
])
def test_one_edit(a, b, near):
    assert one_edit(a, b) is near and one_edit(b, a) is near


@pytest.mark.parametrize("key, reads_as", [
    ("tesera.dev/gang-name", "tessera.dev/gang-name"),
    ("tessera.de/anything", "tessera.dev/anything"),  # rule 1 keeps the name as written
    ("tesseradev/Gang-Name", "tessera.dev/Gang-Name"),
    ("tessera.io/gang-size", "tessera.dev/gang-size"),
    ("tessera.example.com/expected-runtim", "tessera.dev/expected-runtime"),  # rule 2: tessera.<any>/ and a user key
    ("tesera.com/train-config", "tessera.dev/train-config"),
    ("tessera.dev_entrypoint", "tessera.dev/entrypoint"),  # rule 3
    ("tesera.dev.expected-runtime", "tessera.dev/expected-runtime"),
    ("tessera.dev.runtime", "tessera.dev/runtime"),
])
def test_what_a_near_key_reads_as(key, reads_as):
    assert near_domain(key) == reads_as


@pytest.mark.parametrize("key", [
    "tessera.dev/gang-name", "Tessera.dev/gang-name",  # Tessera's domain (capitals have their own message)
    "tessera.example.com/x", "tessera.io/app", "tesseract.io/gang-name",  # rule 2 needs a user key and a near label
    "tessa.dev/x", "tessera.dev.example.com/x",  # two edits, or a longer domain that only starts like it
    "gang-name", "tessera-gang-name", "tessera.dev.foo",  # no domain: the owner's own key
    "x" * 400, "",
])
def test_keys_that_are_not_near(key):
    assert near_domain(key) is None
