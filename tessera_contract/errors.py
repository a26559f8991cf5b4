"""The one error every program raises for input that breaks the contract, so each catches one type."""

from __future__ import annotations

# The fixed label set of tessera_pod_annotation_problems_total (a label per key would let tenants grow the series).
ANNOTATION_CATEGORIES = ("unknown-key", "half-gang", "bad-value", "zero-gpu-milli")


class RequestError(ValueError):
    """A pod request, node description or annotation that cannot be valid (the writer's mistake, not a misfit)."""


class AnnotationError(RequestError):
    """A pod's tessera.dev/ input that Tessera will not take silently; `category` is one of ANNOTATION_CATEGORIES."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category
