"""A hostile training entrypoint for tests/e2e/test_raybridge_e2e.py: importing it leaves a mark.

If the privileged bridge ever imported or ran a tenant's entrypoint, the file named by
TESSERA_E2E_HOSTILE_MARK would appear; the test checks that it never does."""

from __future__ import annotations

import os

if os.environ.get("TESSERA_E2E_HOSTILE_MARK"):
    with open(os.environ["TESSERA_E2E_HOSTILE_MARK"], "w") as f:
        f.write(f"imported in pid {os.getpid()}\n")


def build(config: dict):
    raise RuntimeError("a hostile entrypoint")
