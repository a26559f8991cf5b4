"""The keys that sign bind annotations, kept in a Secret the extender creates on its first start.

No install step for the admin: the first replica to start creates the Secret with one key of 32
random bytes under `key-<UTC date-time>`; a replica that loses the creation race (409) reads the
winner's. Every replica, and every restart, then signs and checks with the same keyring. Only the
extender's ServiceAccount may read it (get by name, and create), so the extender never writes it
again: adding a key is the admin's step (`rotate` below, or the kubectl lines in
docs/assignment-key.md), and the extender picks it up when it restarts.

A Secret from the releases before key ids holds one entry `key`: it is read as the keyring's legacy
key (keyring.py), so the pods it signed keep their GPUs after the upgrade.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import logging
import os
from pathlib import Path

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from .keyring import ENTRY_PREFIX, LEGACY_ENTRY, AssignmentSigner

log = logging.getLogger(__name__)

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


def load_or_create(core: CoreV1Api, namespace: str, name: str) -> AssignmentSigner:
    """The Secret's keyring; on the first start, a new Secret with one random key (race-safe)."""
    try:
        return read_keyring(core, namespace, name)
    except ApiException as e:
        if e.status != 404:
            raise
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "tessera"}},
            "data": {f"{ENTRY_PREFIX}{new_label()}": base64.b64encode(os.urandom(32)).decode()}}
    try:
        core.create_namespaced_secret(namespace, body, _preload_content=False)
        log.info("created the assignment keyring in secret %s/%s", namespace, name)
    except ApiException as e:
        if e.status != 409:  # another replica created it first: use theirs
            raise
    return read_keyring(core, namespace, name)


def load_path(path: str) -> AssignmentSigner:
    """`--assignment-key-file`: a file is one key (the legacy key); a directory (a Secret mounted as
    a volume) holds entries `key` and/or `key-<label>`, one file each, read as they are (not
    stripped: the same Secret read through the API must give the same key ids)."""
    p = Path(path)
    if p.is_dir():
        entries = {f.name: f.read_bytes() for f in p.iterdir()
                   if f.is_file() and (f.name == LEGACY_ENTRY or f.name.startswith(ENTRY_PREFIX))}
        try:
            return AssignmentSigner.from_entries(entries)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return AssignmentSigner(p.read_bytes().strip())
