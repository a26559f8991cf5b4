"""Writes bind decisions to the API: a Binding whose annotations the apiserver merges into the pod."""

from __future__ import annotations

import json

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from ..state import BindFailure


class ApiBinder:
    def __init__(self, api: CoreV1Api) -> None:
        self.api = api

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        body = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            # _preload_content=False: the client cannot deserialise the Binding it gets back
            self.api.create_namespaced_binding(namespace, body, _preload_content=False)
        except ApiException as e:
            message = _message(e)
            if e.status == 409:
                try:
                    pod = self.api.read_namespaced_pod(name, namespace, _preload_content=False)
                    on = (json.loads(pod.data).get("spec") or {}).get("nodeName") or ""
                except ApiException:
                    on = ""
                raise BindFailure(message, already_on=on) from None
            raise BindFailure(f"{e.status}: {message}") from None


def _message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except (TypeError, ValueError):
        return str(e.reason)
