"""Assignment keys with ids: the newest signs, every key held verifies.

Here, in the contract, because two programs verify: the extender (whose start-up check, the one that stops a
start when a key changed, is extender/kube/keyring.py) and the node's device plugin, which gives a container
the GPUs of an assignment only when its MAC verifies (gpu_sharing/deviceplugin/).

The MAC that bind writes in `tessera.dev/assignment-mac` names the key that made it:

    v1:<kid>:<64 lowercase hex>     HMAC-SHA256(key, pod UID + "\\n" + assignment annotation)

The key id (kid) is not a name an admin picks but the first 12 hex digits of a SHA-256 over the key
itself (domain-separated). Why: a key replaced under the same name (a Secret deleted and recreated,
a key file overwritten) then gets a new kid, and the pods signed with the old one name a kid the
keyring lacks, which is what the start-up check looks for; with admin-chosen names a replaced key
would silently turn every running pod's assignment into an "edited" one. 48 bits of a hash over a
key of 16+ bytes tell nothing about the key that the MAC itself (a known message and its HMAC) does
not already offer an offline guesser.

Where the keys come from (a Secret, or the same layout mounted as a directory):

  * `key-<label>` entries: one key each. Labels order the keys (plain string order); the last signs,
    all verify. Tessera creates its first entry with a UTC date-time label (`key-20261130T125600Z`),
    and rotation adds a later one (`rotate` in assignment_key.py, or kubectl: docs/assignment-key.md).
  * `key`: the single key of the releases before key ids (and a plain `--assignment-key-file` is that
    one key). It sorts before every `key-<label>` and is the *legacy* key: it alone verifies MACs in
    the old bare form (64 hex digits, no kid), so a cluster upgrades without every running pod turning
    forged. New binds never write the bare form. Once `keys_in_use` shows no pod on its kid, remove it.

Every MAC value is checked for its exact form (ASCII, lowercase hex, the lengths above) before any
comparison, so a tenant's annotation (non-ASCII, overlong, empty, not hex) is simply invalid; the
old `hmac.compare_digest(str, str)` raised TypeError on non-ASCII and a lone surrogate in the body
raised UnicodeEncodeError, which stalled the pod watch.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAC_VERSION = "v1"
LEGACY_ENTRY = "key"  # the Secret entry (and key-file content) of the releases before key ids
ENTRY_PREFIX = "key-"
BARE = "(bare)"  # stands for the kid of a bare MAC that no key held verifies
MIN_KEY_BYTES = 16
MAX_KEYS = 32  # a keyring is a handful of keys; more is a mistake worth a clear error
KID_HEX = 12
_MAC = re.compile(r"v1:([0-9a-f]{12}):([0-9a-f]{64})", re.ASCII)
_BARE_MAC = re.compile(r"[0-9a-f]{64}", re.ASCII)
_LABEL = re.compile(r"[-._a-zA-Z0-9]{1,200}", re.ASCII)  # a Secret data key is [-._a-zA-Z0-9]+
MAX_MAC_CHARS = 200  # a longer value is not looked at further: invalid


def key_id(key: bytes) -> str:
    """The key's id: 12 hex digits of SHA-256 over it, so a different key gets a different id (two
    keys of one keyring sharing an id, a 1 in 2^48 chance, are refused when the keyring is built)."""
    return hashlib.sha256(b"tessera assignment key id\n" + key).hexdigest()[:KID_HEX]


def _message(uid: str, body: str) -> bytes:
    # surrogatepass: a JSON "\ud800" escape reaches us as a lone surrogate; it must not raise
    return f"{uid}\n{body}".encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class MacCheck:
    """What one MAC value says: `status` is ok, missing, malformed, unknown (a key this keyring
    lacks) or mismatch (a key held, but not this pod's UID and body); `kid` the key it names."""

    status: str
    kid: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class SigningKey:
    entry: str  # "key" (legacy) or "key-<label>": where it came from, and its place in the order
    secret: bytes = field(repr=False)
    kid: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kid", key_id(self.secret))


class AssignmentSigner:
    """A keyring of MAC keys: `mac` signs with the newest, `valid`/`check` accept any key held.

    Why a MAC and not the pod's managedFields: anyone who may edit a pod may write any
    annotation, and managedFields only says which client wrote a field, a name a client picks
    itself. A MAC cannot be made without a key (a Secret only the extender's ServiceAccount
    reads), and the UID inside it stops a valid annotation being copied onto another pod.

    `AssignmentSigner(key)` is a keyring of that one key, as the legacy key (the releases before key
    ids, and a plain key file): it also verifies bare MACs. `AssignmentSigner.from_entries` builds
    one from a Secret's (or mounted directory's) entries, see the module docstring.
    """

    __slots__ = ("keys", "signing", "legacy", "_by_kid")

    def __init__(self, key: bytes | None = None, *, entries: Mapping[str, bytes] | None = None) -> None:
        if (key is None) == (entries is None):
            raise ValueError("AssignmentSigner takes one key or the entries of a keyring")
        entries = {LEGACY_ENTRY: key} if key is not None else dict(entries or {})
        if not entries:
            raise ValueError(f"no assignment key: expected an entry {LEGACY_ENTRY!r} or {ENTRY_PREFIX}<label>")
        if len(entries) > MAX_KEYS:
            raise ValueError(f"{len(entries)} assignment keys: at most {MAX_KEYS}; remove the ones no pod uses")
        keys: list[SigningKey] = []
        for entry in sorted(entries):  # "key" < "key-..." : the legacy key is the oldest
            if entry != LEGACY_ENTRY and not (entry.startswith(ENTRY_PREFIX) and _LABEL.fullmatch(entry[len(ENTRY_PREFIX):])):
                raise ValueError(f"assignment key entry {entry!r}: expected {LEGACY_ENTRY!r} or {ENTRY_PREFIX}<label> "
                                 "(label: letters, digits, '-', '_', '.')")
            secret = entries[entry]
            if not isinstance(secret, bytes) or len(secret) < MIN_KEY_BYTES:
                size = len(secret) if isinstance(secret, bytes) else 0
                raise ValueError(f"the assignment key must be at least {MIN_KEY_BYTES} bytes; entry {entry!r} has {size}")
            keys.append(SigningKey(entry, secret))
        by_kid: dict[str, SigningKey] = {}
        for k in keys:
            if k.kid in by_kid:
                raise ValueError(f"assignment key entries {by_kid[k.kid].entry} and {k.entry} hold the same key (key id {k.kid})")
            by_kid[k.kid] = k
        self.keys: tuple[SigningKey, ...] = tuple(keys)
        self.signing: SigningKey = keys[-1]
        self.legacy: SigningKey | None = keys[0] if keys[0].entry == LEGACY_ENTRY else None
        self._by_kid = by_kid

    @classmethod
    def from_entries(cls, entries: Mapping[str, bytes]) -> AssignmentSigner:
        """The keys among `entries` (other entries, e.g. a mounted Secret's `..data`, are ignored)."""
        keys = {k: v for k, v in entries.items() if k == LEGACY_ENTRY or k.startswith(ENTRY_PREFIX)}
        return cls(entries=keys)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self.keys)

    def describe(self) -> str:
        """One line for logs and refusals: each key's kid and entry, oldest first, which one signs."""
        return ", ".join(f"{k.kid} ({k.entry}{', signs' if k is self.signing else ''}"
                         f"{', verifies bare MACs' if k is self.legacy else ''})" for k in self.keys)

    def mac(self, uid: str, body: str) -> str:
        """The MAC bind writes: `v1:<kid>:<hex>` with the newest key."""
        k = self.signing
        return f"{MAC_VERSION}:{k.kid}:{hmac.new(k.secret, _message(uid, body), hashlib.sha256).hexdigest()}"

    def check(self, uid: str, body: str, mac) -> MacCheck:
        """Total: any value that is not exactly a MAC Tessera writes is `malformed`, never an exception."""
        if not mac:
            return MacCheck("missing")
        if not isinstance(mac, str) or len(mac) > MAX_MAC_CHARS:
            return MacCheck("malformed")
        m = _MAC.fullmatch(mac)
        if m:
            kid, digest = m.group(1), m.group(2)
            key = self._by_kid.get(kid)
        elif _BARE_MAC.fullmatch(mac):
            key, digest = self.legacy, mac
            kid = key.kid if key else BARE
        else:
            return MacCheck("malformed")
        if key is None:
            return MacCheck("unknown", kid)
        expected = hmac.new(key.secret, _message(str(uid), str(body)), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected.encode(), digest.encode()):
            return MacCheck("ok", kid)
        # a bare MAC names no key: one that fails may be an edit, or the work of a legacy key since
        # replaced; it is reported as BARE so the start-up check weighs it like a kid we lack
        return MacCheck("mismatch", kid if m else BARE)

    def valid(self, uid: str, body: str, mac) -> bool:
        return self.check(uid, body, mac).ok

    def __repr__(self) -> str:
        return f"AssignmentSigner({self.describe()})"


def load_path(path: str) -> AssignmentSigner:
    """A key file or directory, as `--assignment-key-file` takes it: a file is one key (the legacy key); a
    directory (the Secret mounted as a volume) holds entries `key` and/or `key-<label>`, one file each, read as
    they are (not stripped: the same Secret read through the API must give the same key ids)."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        entries = {f.name: f.read_bytes() for f in p.iterdir()
                   if f.is_file() and (f.name == LEGACY_ENTRY or f.name.startswith(ENTRY_PREFIX))}
        try:
            return AssignmentSigner.from_entries(entries)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return AssignmentSigner(p.read_bytes().strip())
