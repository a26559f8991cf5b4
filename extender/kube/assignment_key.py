"""The keys that sign bind annotations, kept in a Secret the install creates and the extender only reads.

The admin creates the Secret once, at install, with one random 32-byte key under `key-<UTC date-time>`
(docs/admin-guide.md, "Create the assignment key": kubectl lines, the same form as a rotation's). The extender
holds `get` on that one Secret and no `secrets: create` (RBAC cannot limit create to a name, so creating it would
have let the extender create any Secret in its namespace). While the Secret does not exist, `load` raises
KeyMissing in words that name it and the step that creates it; `tessera serve` reads it again every few seconds,
not ready and binding nothing, until it does. Adding a key is the admin's step too (`rotate` in key_rotation.py,
or the kubectl lines in docs/assignment-key.md); the extender picks it up when it restarts.

A Secret from the releases before key ids holds one entry `key`: it is read as the keyring's legacy
key (keyring.py), so the pods it signed keep their GPUs after the upgrade. A Secret an older release's extender
created on its first start is read as it is: upgrading needs no step.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from tessera_contract.keyring import ENTRY_PREFIX, LEGACY_ENTRY, AssignmentSigner

KEY_FIELD = LEGACY_ENTRY  # the releases before key ids kept their one key here


def new_label(now: datetime.datetime | None = None) -> str:
    """A label that sorts after every earlier one: the UTC date-time, to the second."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")


def _entries(secret: dict, where: str) -> dict[str, bytes]:
    out = {}
    for entry, raw in (secret.get("data") or {}).items():
        if entry == LEGACY_ENTRY or entry.startswith(ENTRY_PREFIX):
            try:
                out[entry] = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise ValueError(f"{where}: data.{entry} is not base64") from None
    if not out:
        raise ValueError(f"{where} holds no assignment key (data.{LEGACY_ENTRY} or data.{ENTRY_PREFIX}<label>)")
    return out


def _read_raw(core: CoreV1Api, namespace: str, name: str) -> dict:
    return json.loads(core.read_namespaced_secret(name, namespace, _preload_content=False).data)


def read_keyring(core: CoreV1Api, namespace: str, name: str) -> AssignmentSigner:
    """The keyring in the Secret; ValueError in words when it holds none or a bad one."""
    where = f"secret {namespace}/{name}"
    entries = _entries(_read_raw(core, namespace, name), where)
    try:
        return AssignmentSigner.from_entries(entries)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


# Where the admin's step is; tests/test_keyring.py checks that the guide has this section.
INSTALL_STEP = 'docs/admin-guide.md, "Create the assignment key"'


class KeyMissing(LookupError):
    """The assignment key's Secret does not exist (yet): the install creates it, the extender never does."""


def missing_words(namespace: str, name: str) -> str:
    return (f"secret {namespace}/{name} does not exist. The install creates it, not the extender (its Role may read "
            f"that one Secret and create none): an admin runs the kubectl lines of {INSTALL_STEP} (one random "
            f"32-byte key under key-<UTC date-time>), with NS={namespace} SECRET={name}. Until then this replica "
            f"is not ready and binds nothing")


def load(core: CoreV1Api, namespace: str, name: str) -> AssignmentSigner:
    """The Secret's keyring; KeyMissing, in words, while the Secret does not exist (the install creates it);
    ValueError in words when it holds no usable key."""
    try:
        return read_keyring(core, namespace, name)
    except ApiException as e:
        if e.status == 404:  # also when the namespace itself is missing: the same step makes both
            raise KeyMissing(missing_words(namespace, name)) from None
        raise
