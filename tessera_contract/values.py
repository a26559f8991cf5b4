"""Bounded readers for the values inside objects and annotations: each refuses in words, none can run long.

What the API serves was written by tenants (annotations) and by nodes (status, the agent's
inventory); a compromised node may write anything there. Every number is type-checked and bounded
before it is used: `1e400` is not a GPU index, `true` is not a MiB count, `"1e999999999"` is not a
quantity worth the minutes int() would spend on it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal, DecimalException

from .errors import RequestError
from .keys import MAX_ANNOTATION_CHARS, MAX_NAME_CHARS

DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() accepts "²", which int() then refuses
MAX_QUANTITY_CHARS = 64  # "9223372036854775807" and a suffix; a 100 KiB "quantity" is not one
MAX_QUANTITY = Decimal(2**63)  # Kubernetes stores quantities as int64; "1e999999999" would take minutes to int()

# Kubernetes quantity suffixes (k8s.io/apimachinery resource.Quantity): decimal SI powers of ten
# ("K" read as "k", as the Python client reads it) and binary powers of two.
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "k": 3, "K": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("500m", "16Gi", "2k", 3) as a Decimal; ValueError when it is none.

    The same reading as the kubernetes Python client's parse_quantity, here so that the agent and the
    bridge need not import that client: a number Decimal() reads, then at most one suffix.
    """
    if isinstance(value, int | float | Decimal):
        return Decimal(value)
    text = str(value)
    number, scale = text, None
    if text[-2:] in _BINARY_EXPONENT:
        number, scale = text[:-2], Decimal(2) ** _BINARY_EXPONENT[text[-2:]]
    elif text[-1:] == "i" and len(text) >= 2 and text[-2] in _DECIMAL_EXPONENT:
        raise ValueError(f"{text}: unknown suffix {text[-2:]}")
    elif text[-1:] in _DECIMAL_EXPONENT:
        number, scale = text[:-1], Decimal(10) ** _DECIMAL_EXPONENT[text[-1]]
    try:
        return Decimal(number) if scale is None else Decimal(number) * scale
    except DecimalException:
        raise ValueError(f"not a quantity: {text[:80]!r}") from None


# A quantity as the apiserver writes one: ASCII digits, one optional sign, a decimal exponent or one suffix. Decimal()
# alone also reads " 2 ", "1_0" and Arabic-Indic digits ("١٢" was 12 GPUs), which no API object holds.
QUANTITY_RULE = "Kubernetes' form such as 2, 500m or 16Gi, from 0 to 2^63"
_QUANTITY = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkKMGTPE])?")


def quantity(value, what: str) -> Decimal:
    """A quantity from an API object, bounded: a string of at most 64 characters in Kubernetes' form, finite, 0 to 2^63."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(f"{what}: not a quantity: {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_QUANTITY_CHARS:
        raise RequestError(f"{what}: not a quantity ({len(value)} characters; {QUANTITY_RULE}): {value[:40]!r}...")
    if isinstance(value, str) and not _QUANTITY.fullmatch(value):
        raise RequestError(f"{what}: not a quantity ({QUANTITY_RULE}), got {value[:80]!r}")
    try:
        q = parse_quantity(value)
    except (ArithmeticError, ValueError, TypeError):
        raise RequestError(f"{what}: not a quantity ({QUANTITY_RULE}), got {str(value)[:80]!r}") from None
    if not q.is_finite() or not 0 <= q <= MAX_QUANTITY:
        raise RequestError(f"{what}: must be a finite quantity from 0 to 2^63, got {str(value)[:80]!r}")
    return q


def load_json(raw: str, what: str):
    """A JSON annotation, bounded: its size, and its depth (a RecursionError is not a ValueError)."""
    if len(raw) > MAX_ANNOTATION_CHARS:
        raise RequestError(f"{what}: {len(raw)} characters, over {MAX_ANNOTATION_CHARS}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError(f"{what}: not JSON: {raw[:80]!r}") from None


def whole(value, low: int, high: int, what: str) -> int:
    """A JSON integer within bounds: 1e400 (inf), 2.5, "3" and true are not GPU indexes or MiB."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{what} must be a whole number {low}..{high}, got {str(value)[:40]!r}")
    return value


# "3600" (seconds), or Go-duration-like whole units in order, each at most once: "2h", "90m", "1h30m", "3600s".
# ASCII digits, at most 7 per unit (no "1e9", no "²"), lower-case units, no sign, space or fraction.
_DURATION = re.compile(r"([0-9]{1,7})|(?:([0-9]{1,7})d)?(?:([0-9]{1,7})h)?(?:([0-9]{1,7})m)?(?:([0-9]{1,7})s)?")
_UNIT_S = (86400, 3600, 60, 1)


def duration_s(value, what: str, low: int, high: int) -> int:
    """A duration a person wrote ("90m", "2h", "1h30m", "3600s", "3600") as whole seconds within low..high."""
    shown = str(value)[:40]
    match = _DURATION.fullmatch(value) if isinstance(value, str) and 0 < len(value) <= 40 else None
    if match is None:
        raise RequestError(f"{what} must be a duration such as 90m, 2h, 1h30m, 3600s or a whole number of seconds, "
                           f"{_span(low, high)}, got {shown!r}")
    plain, *units = match.groups()
    seconds = int(plain) if plain is not None else sum(int(v) * s for v, s in zip(units, _UNIT_S, strict=True) if v)
    if not low <= seconds <= high:
        raise RequestError(f"{what} must be {_span(low, high)}, got {shown!r} ({seconds} s)")
    return seconds


def _span(low: int, high: int) -> str:
    """'1 s to 2592000 s (30 days)': the bounds in seconds, as they are checked, and the upper one as people say it."""
    for unit, one, many in ((86400, "day", "days"), (3600, "hour", "hours"), (60, "minute", "minutes")):
        if high >= unit and high % unit == 0:
            n = high // unit
            return f"{low} s to {high} s ({n} {one if n == 1 else many})"
    return f"{low} s to {high} s"


def text(value, what: str, limit: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise RequestError(f"{what} must be a string of at most {limit} characters, got {str(value)[:40]!r}")
    return value


def printable(value, what: str, limit: int = MAX_NAME_CHARS) -> str:
    """`text`, and no control or format character: a name a tenant or a node writes is echoed into filter reasons,
    Events, logs and `tessera inspect` on an admin's terminal, where ESC sequences and newlines would act."""
    value = text(value, what, limit)
    if not value.isprintable():
        raise RequestError(f"{what} must be printable text (no control characters), got {value[:40]!r}")
    return value


def flag(value, what: str) -> bool:
    """A JSON boolean; the string "false" is not true (bool("false") would be)."""
    if isinstance(value, bool):
        return value
    raise RequestError(f"{what} must be true or false, got {str(value)[:40]!r}")


def timestamp(value: object) -> float | None:
    """An RFC 3339 time the API server or kubelet wrote ("2026-11-30T21:00:46Z"), as epoch seconds; None if unreadable.

    Never a refusal: these fields are not the tenant's (the extender's reservations, the bridge's start-time check)."""
    if not isinstance(value, str) or not 20 <= len(value) <= 40:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None
