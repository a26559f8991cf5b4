"""extender/kube/lean_core.py: the Binding and Event writes it sends are the generated client's requests, byte for
byte, and an answer that is not 2xx fails as the generated method fails (ApiException with the status)."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.kube.lean_core import LeanCore


class Answer:
    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data, self.reason, self.headers, self.response = status, data, "x", {}, self

    def read(self) -> bytes:
        return self.data


def recording_core(status: int = 201, data: bytes = b"{}"):
    api = client.ApiClient(client.Configuration(host="https://apiserver.example:6443"))
    sent = []

    def call_api(method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        sent.append((method, url, {k: v for k, v in (header_params or {}).items() if k != "User-Agent"}, body))
        return Answer(status, data)

    api.call_api = call_api
    return client.CoreV1Api(api), sent


BINDING = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                                                                 "annotations": {"tessera.dev/assignment": "{}"}},
           "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"namespace": "ml", "generateName": "tessera-"},
         "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "TesseraBound", "message": "m"}


@pytest.mark.parametrize("call,namespace,body", [("create_namespaced_binding", "ml", BINDING),
                                                 ("create_namespaced_event", "ml", EVENT)])
def test_the_lean_write_is_the_generated_clients_request(call, namespace, body):
    core, sent = recording_core()
    getattr(core, call)(namespace, body, _preload_content=False)
    getattr(LeanCore(core), call)(namespace, body)
    generated, lean = sent
    assert lean == generated and lean[0] == "POST" and lean[1].startswith("https://apiserver.example:6443/api/v1/namespaces/ml/")


def test_a_refused_write_raises_as_the_generated_method_does_and_other_calls_pass_through():
    core, sent = recording_core(409, b'{"kind":"Status","code":409,"message":"pod p is already assigned to node n2"}')
    with pytest.raises(ApiException) as generated:
        core.create_namespaced_binding("ml", BINDING)
    with pytest.raises(ApiException) as lean:
        LeanCore(core).create_namespaced_binding("ml", BINDING)
    assert lean.value.status == generated.value.status == 409
    assert "already assigned" in lean.value.body
    assert LeanCore(core).read_namespaced_pod == core.read_namespaced_pod  # everything else is the client's own
