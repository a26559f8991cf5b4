"""Annotation keys that miss Tessera's domain by a slip: `tesera.dev/gang-name`, `tessera.io/gang-size`.

The apiserver keeps every key as written and Tessera reads `tessera.dev/` keys only, so a key whose
domain was misspelt was ignored without a word: the pod ran with no gang, no declared run time, no
Ray job. `near_domain` says which `tessera.dev/` key such a key reads as, so that the extender reports
it like a misspelt key under the right domain.

Near, precisely: on the key lower-cased, and never for a key under `tessera.dev/` in any case of
letters (those have their own checks), a key is near when

  1. its domain (the part before the `/`) is one edit from `tessera.dev`: one character added,
     dropped or replaced, or two neighbours swapped (`tesera.dev`, `tessra.dev`, `tessera-dev`,
     `tessera.de`, `tesseradev`, `tesesra.dev`); it reads as `tessera.dev/` and its own name; or
  2. its domain's first label is `tessera` or one edit from it, and its name is a key users write or
     one edit from one (`tessera.io/gang-size`, `tessera.ai/gang-nme`, `tesera.com/expected-runtime`);
     it reads as that key; or
  3. it has no `/` and is `tessera.dev`, or one edit from it, then one `.`, `_` or `-` or nothing, then
     a key users write (`tessera.dev.gang-name`, `tessera.devgang-size`); it reads as that key.

Nothing else is near. Another vendor's domain is at least two edits from `tessera.dev` and, when it
starts with `tessera.`, its names are not Tessera's (`tessera.example.com/x`); a key without a domain
(`gang-name`) belongs to the pod's owner, as Kubernetes reserves unprefixed keys for the user.

Bounded: one length test per rule before any comparison, and a comparison is a few slices of strings
of at most 20 characters: a pod's thousands of keys cost a few microseconds each.
"""

from __future__ import annotations

from .keys import DOMAIN, USER_POD_KEYS

_DOMAIN = DOMAIN.rstrip("/")  # tessera.dev
_BRAND = _DOMAIN.partition(".")[0]  # tessera
_USER_NAMES = tuple(k.removeprefix(DOMAIN) for k in USER_POD_KEYS)
_SHORTEST_NAME = min(map(len, _USER_NAMES))
_LONGEST_NAME = max(map(len, _USER_NAMES))
_SEPARATORS = ".-_"
MAX_KEY_CHARS = 253 + 1 + 63  # the longest key the apiserver takes (a DNS subdomain, `/`, a name); longer is near nothing


def one_edit(a: str, b: str) -> bool:
    """Whether `a` equals `b` or is one edit from it (a character added, dropped or replaced, or two neighbours swapped)."""
    if a == b:
        return True
    la, lb = len(a), len(b)
    if abs(la - lb) > 1:
        return False
    i = 0
    while i < la and i < lb and a[i] == b[i]:
        i += 1
    if la == lb:
        return a[i + 1:] == b[i + 1:] or (a[i + 1:i + 2] == b[i:i + 1] and a[i:i + 1] == b[i + 1:i + 2]
                                          and a[i + 2:] == b[i + 2:])
    return a[i + 1:] == b[i:] if la > lb else a[i:] == b[i + 1:]


def _user_name(name: str) -> str | None:
    """The key users write that `name` is, or is one edit from (the first in USER_POD_KEYS' order)."""
    if not _SHORTEST_NAME - 1 <= len(name) <= _LONGEST_NAME + 1:
        return None
    return next((u for u in _USER_NAMES if one_edit(name, u)), None)


def near_domain(key: str) -> str | None:
    """The `tessera.dev/` key that `key` reads as when it misses Tessera's domain by a slip, else None (rules above)."""
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
        return None
    low = key.lower()
    if low.startswith(DOMAIN):
        return None
    domain, slash, name = low.partition("/")
    if not slash:
        return _joined(low)
    if len(_DOMAIN) - 1 <= len(domain) <= len(_DOMAIN) + 1 and one_edit(domain, _DOMAIN):
        return DOMAIN + key.partition("/")[2]
    label = domain.partition(".")[0]
    if len(_BRAND) - 1 <= len(label) <= len(_BRAND) + 1 and one_edit(label, _BRAND):
        user = _user_name(name)
        if user is not None:
            return DOMAIN + user
    return None


def _joined(low: str) -> str | None:
    """Rule 3: `tessera.dev` (or one edit from it) and a user key run together without the `/`."""
    for user in _USER_NAMES:
        if not low.endswith(user):
            continue
        head = low[:-len(user)]
        if head[-1:] and head[-1] in _SEPARATORS and one_edit(head[:-1], _DOMAIN):
            return DOMAIN + user
        if one_edit(head, _DOMAIN):
            return DOMAIN + user
    return None
