"""The key that signs bind annotations, kept in a Secret the extender creates on its first start.

No install step for the admin: the first replica to start creates the Secret with 32 random
bytes; a replica that loses the creation race (409) reads the winner's. Every replica, and every
restart, then signs and checks with the same key. Only the extender's ServiceAccount may read it.
"""

from __future__ import annotations

import base64
import json
import logging
import os

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

KEY_FIELD = "key"


def _read(core: CoreV1Api, namespace: str, name: str) -> bytes:
    secret = json.loads(core.read_namespaced_secret(name, namespace, _preload_content=False).data)
    raw = (secret.get("data") or {}).get(KEY_FIELD)
    if not raw:
        raise ValueError(f"secret {namespace}/{name} has no data.{KEY_FIELD}")
    return base64.b64decode(raw)


def load_or_create(core: CoreV1Api, namespace: str, name: str) -> bytes:
    try:
        return _read(core, namespace, name)
    except ApiException as e:
        if e.status != 404:
            raise
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "tessera"}},
            "data": {KEY_FIELD: base64.b64encode(os.urandom(32)).decode()}}
    try:
        core.create_namespaced_secret(namespace, body, _preload_content=False)
        log.info("created the assignment key in secret %s/%s", namespace, name)
    except ApiException as e:
        if e.status != 409:  # another replica created it first: use theirs
            raise
    return _read(core, namespace, name)
