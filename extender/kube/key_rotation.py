"""The admin's key rotation step, kept apart from what `tessera serve` imports.

Rotation writes the Secret (`secrets: update`); the extender itself only creates and reads it,
so its ServiceAccount holds no update right (tests/test_manifests.py checks RBAC against the calls
the extender's own modules make). Run it with an admin's credentials; docs/assignment-key.md has
the same step with kubectl.
"""

from __future__ import annotations

import base64
import logging
import os

from kubernetes.client import CoreV1Api

from tessera_contract.keyring import ENTRY_PREFIX, AssignmentSigner

from .assignment_key import _entries, _read_raw, new_label

log = logging.getLogger(__name__)


def rotate(core: CoreV1Api, namespace: str, name: str, label: str | None = None,
           key: bytes | None = None) -> AssignmentSigner:
    """Add a new key (the admin's step, with the admin's rights): it signs from the next start on.

    The older keys stay, so every running pod's MAC still verifies. The label defaults to now
    (UTC), which sorts after the labels Tessera made before; an existing label is refused, never
    overwritten (that would turn its pods' MACs unknown). The write carries the resourceVersion it
    read, so two admins rotating at once cannot lose each other's key (the second gets a 409).
    Returns the new keyring; restart the extender (every replica) to sign with it.
    """
    label = label or new_label()
    secret = _read_raw(core, namespace, name)
    entries = _entries(secret, f"secret {namespace}/{name}")
    entry = f"{ENTRY_PREFIX}{label}"
    if entry in entries:
        raise ValueError(f"secret {namespace}/{name} already holds {entry}: pick another label")
    entries[entry] = key if key is not None else os.urandom(32)
    ring = AssignmentSigner.from_entries(entries)  # checks the label, the key, and the keyring's size
    if ring.signing.entry != entry:
        raise ValueError(f"label {label!r} sorts before {ring.signing.entry}: the new key would not sign "
                         f"(labels sort as strings; default: the UTC date-time)")
    secret.setdefault("data", {})[entry] = base64.b64encode(entries[entry]).decode()
    core.replace_namespaced_secret(name, namespace, secret, _preload_content=False)
    log.info("secret %s/%s: added %s (kid %s); restart the extender to sign with it", namespace, name, entry,
             ring.signing.kid)
    return ring
