"""The OpenAPI 3 description of the extender's endpoints (openapi.yaml beside this file).

One document for people (what each verb takes and answers) and for the fuzz tests, which
generate requests from it with schemathesis. The file is written for the default prefix
/tessera; the server rewrites the verbs' paths to its own `--prefix` when it serves it.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

DOC_PREFIX = "/tessera"


@cache
def _text() -> str:
    return resources.files(__package__).joinpath("openapi.yaml").read_text(encoding="utf-8")


def openapi_yaml(prefix: str = DOC_PREFIX) -> str:
    """The document with the verbs under `prefix` ("" for none, as create_app normalises it)."""
    if prefix == DOC_PREFIX:
        return _text()
    return _text().replace(f"\n  {DOC_PREFIX}/", f"\n  {prefix}/")
