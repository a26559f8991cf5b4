"""The shared contract: one encode and one decode per annotation, the same verdict in all three programs.

Before issue 13 the extender, the node agent and the Ray bridge each parsed tessera.dev/gpu-assignment
their own way: the agent launched a pod whose annotation said `"milli": "500"` (a string), the bridge
read `"gang-size": "٣"` (an Arabic-Indic three) as 3; the extender refused both. They now share one
decoder, and these tests hold each program to the extender's verdict.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from extender.core.model import PodRequest
from extender.kube.node_writer import current_state
from extender.translate.objects import parse_assignment
from gpu_sharing.assignment import AssignmentError, from_annotation
from raybridge.contract import ContractError, member
from tessera_contract import (
    ASSIGNMENT_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
    Gang,
    GpuAssignment,
    GpuInfo,
    RequestError,
    decode_assignment,
    decode_gang,
    decode_inventory,
    decode_visible_devices,
    encode_assignment,
    encode_gang,
    encode_inventory,
    parse_quantity,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_contract_and_its_readers_load_neither_kubernetes_nor_flask_nor_the_extender():
    """The agent's launcher runs in every GPU pod and the bridge's job code in every Ray pod: neither may drag in
    the extender's adapter (the kubernetes client) or HTTP shell (Flask) by importing the contract."""
    code = ("import sys, tessera_contract, tessera_contract.report, gpu_sharing.assignment, gpu_sharing.usage\n"
            "import raybridge.contract, raybridge.decide\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'flask', 'extender', 'werkzeug'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == "[]"


def test_quantities_read_as_the_kubernetes_client_reads_them():
    rng = random.Random(13)
    alphabet = "0123456789.eE+-kKMGTPEimnuNaIfty "
    samples = ["500m", "16Gi", "2k", "1ki", "NaN", "1e999999999", "1e999999999Ei", "0.5Gi", "", "sNaN", 5, 2.5]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(20_000)]

    def read(parse, value) -> str:
        try:
            return str(parse(value))
        except ValueError:
            return "refused"

    differ = [s for s in samples if read(parse_quantity, s) != read(client_parse_quantity, s)]
    assert differ == []


def test_each_annotation_decodes_what_its_encode_wrote():
    a = GpuAssignment("n1", (0, 3), 1000, ("GPU-a", "GPU-b"))
    assert decode_assignment(encode_assignment(a)[ASSIGNMENT_ANNOTATION], "pod ml/p") == a
    assert decode_visible_devices(encode_assignment(a)[VISIBLE_DEVICES_ANNOTATION], "pod ml/p") == a.uuids
    assert decode_gang(encode_gang("job", 4), "ml") == Gang("ml/job", 4)
    gpus = [GpuInfo(0, "GPU-a", "A100", 81920, True, 512), GpuInfo(1, "GPU-b", "A100", 81920, False, 0)]
    entries = [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib, "healthy": g.healthy,
                "oob_memory_mib": g.oob_memory_mib, "health_reason": "xid 79"} for g in gpus]
    assert decode_inventory(encode_inventory(entries), "n1") == tuple(gpus)
    assert [g.reserved_milli for g in gpus] == [7, 1000]  # ceil(512 / 81920 * 1000); an unhealthy GPU whole


HOSTILE_ASSIGNMENTS = {
    "milli as a string": {"node": "n1", "gpus": [0], "milli": "500"},
    "no node": {"gpus": [0], "milli": 500},
    "a GPU named twice": {"node": "n1", "gpus": [0, 0], "milli": 1000},
    "a boolean GPU index": {"node": "n1", "gpus": [True], "milli": 500},
    "300 GPUs": {"node": "n1", "gpus": list(range(300)), "milli": 1000},
    "milli over a GPU": {"node": "n1", "gpus": [0], "milli": 1001},
    "uuids not a list": {"node": "n1", "gpus": [0], "milli": 500, "uuids": "GPU-a"},
}


def _ray_pod(annotations: dict) -> dict:
    ann = {"tessera.dev/runtime": "ray", GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: "2",
           "tessera.dev/entrypoint": "raybridge.examples.resnet:build", **annotations}
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": ann}, "spec": {"nodeName": "n1"}}


@pytest.mark.parametrize("why", sorted(HOSTILE_ASSIGNMENTS))
def test_extender_agent_and_bridge_refuse_the_same_assignments(why):
    raw = json.dumps(HOSTILE_ASSIGNMENTS[why])
    request = PodRequest(name="ml/p", cpu_milli=0, memory_mib=0, gpu_count=1, gpu_milli=500)
    with pytest.raises(RequestError):
        parse_assignment({"metadata": {"annotations": {ASSIGNMENT_ANNOTATION: raw}}}, request)
    with pytest.raises(AssignmentError, match="unreadable tessera.dev/gpu-assignment"):
        from_annotation(raw, "env TESSERA_ASSIGNMENT")
    with pytest.raises(ContractError, match="unreadable tessera.dev/gpu-assignment"):
        member(_ray_pod({ASSIGNMENT_ANNOTATION: raw}))


def test_a_deeply_nested_annotation_is_refused_in_words_not_with_a_recursion_error():
    raw = "[" * 30_000 + "]" * 30_000  # under the size bound: the depth is what must be refused
    with pytest.raises(AssignmentError, match="not JSON"):
        from_annotation(raw, "env TESSERA_ASSIGNMENT")
    with pytest.raises(ContractError, match="train-config: not JSON"):
        member(_ray_pod({"tessera.dev/train-config": raw}))


@pytest.mark.parametrize("size", ["\u0663", "0", "10001", " ", "2.0"])
def test_the_bridge_reads_a_gang_size_as_the_extender_does(size):
    with pytest.raises(RequestError):
        decode_gang({GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: size}, "ml")
    with pytest.raises(ContractError, match="tessera.dev/gang-size"):
        member(_ray_pod({GANG_SIZE_ANNOTATION: size}))


@pytest.mark.parametrize("capacity", ["1e30", "1e999999999", "NaN", "-5", "x" * 100])
def test_the_publisher_reads_a_node_capacity_no_bigger_than_the_extender_would(capacity):
    """The publisher compares the Node's tessera.dev/gpu-milli capacity with what it should be; an absurd value is
    'unreadable' (-1: republish), not a 31-digit (or a billion-digit) int built from a node's status."""
    node = {"metadata": {}, "status": {"capacity": {"tessera.dev/gpu-milli": capacity}}}
    assert current_state(node).milli == -1
    assert current_state({"metadata": {}, "status": {"capacity": {"tessera.dev/gpu-milli": "2k"}}}).milli == 2000


@pytest.mark.parametrize("raw", ["  2 ", "1_0", "١٢", "²", "0x10", "1e3Gi", "1.2.3", "Gi", "", "+-1"])
def test_a_quantity_in_an_api_object_has_kubernetes_form(raw):
    """Decimal() reads " 2 ", "1_0" and Arabic-Indic digits ("١٢" was 12 GPUs); the apiserver writes none of them."""
    from tessera_contract.values import quantity

    with pytest.raises(RequestError, match="not a quantity"):
        quantity(raw, "gpus")


@pytest.mark.parametrize("raw, read", [("+3", 3), ("1e3", 1000), (".5", Decimal("0.5")), ("5.", 5), ("500m", Decimal("0.5")),
                                       ("2k", 2000), ("16Gi", 16 * 2**30)])
def test_every_form_kubernetes_writes_is_read(raw, read):
    from tessera_contract.values import quantity

    assert quantity(raw, "q") == read


# --- every number a tenant writes is refused with its range and what was written (issue 33, item 6) -------------

@pytest.mark.parametrize("size", ["-2", "0", "10001", "two", "99999999999", "2.0", "\u0663"])
def test_a_gang_size_out_of_range_says_the_range_and_what_it_got(size):
    """Before: "-2" was refused with "must be a whole number", which hid the rule."""
    with pytest.raises(RequestError) as e:
        decode_gang({GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: size}, "ml")
    assert str(e.value) == f"tessera.dev/gang-size must be a whole number 1..10000, got {size!r}"


@pytest.mark.parametrize("raw, words", [
    ("-5", "must be a duration such as 90m, 2h, 1h30m, 3600s or a whole number of seconds, 1 s to 2592000 s (30 days), "
           "got '-5'"),
    ("soon", "must be a duration such as 90m, 2h, 1h30m, 3600s or a whole number of seconds, 1 s to 2592000 s "
             "(30 days), got 'soon'"),
    ("0", "must be 1 s to 2592000 s (30 days), got '0' (0 s)"),
    ("31d", "must be 1 s to 2592000 s (30 days), got '31d' (2678400 s)"),
])
def test_an_expected_runtime_out_of_range_says_the_range_and_what_it_got(raw, words):
    from tessera_contract import decode_expected_runtime

    with pytest.raises(RequestError) as e:
        decode_expected_runtime({"tessera.dev/expected-runtime": raw})
    assert str(e.value) == f"tessera.dev/expected-runtime {words}"


@pytest.mark.parametrize("milli, words", [
    ("250m", "must be a whole number 1..1000, got '250m' (it counts thousandths of a GPU already: 250, not 250m)"),
    ("abc", "must be a whole number 1..1000, got 'abc'"),
    ("-3", "must be a whole number 1..1000, got '-3'"),
    ("1500", "must be a whole number 1..1000 (one GPU at most), got 1500"),
])
def test_a_gpu_milli_out_of_range_says_the_range_and_what_it_got(milli, words):
    from extender.translate.objects import pod_request

    pod = {"metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"tessera.dev/gpu-milli": milli}}}]}}
    with pytest.raises(RequestError) as e:
        pod_request(pod)
    assert str(e.value) == f"pod ml/p: tessera.dev/gpu-milli {words}"


def test_a_quantity_in_the_wrong_form_says_the_form_and_range_and_what_it_got():
    from tessera_contract.values import quantity

    with pytest.raises(RequestError) as e:
        quantity("lots", "ml/p cpu")
    assert str(e.value) == "ml/p cpu: not a quantity (Kubernetes' form such as 2, 500m or 16Gi, from 0 to 2^63), got 'lots'"


def test_the_agents_report_decodes_what_its_encode_wrote():
    """The one cross-program document besides the annotations: what the agent serves is what the extender reads (the
    whole GPU's memory_used_mib is written for people and not read)."""
    from tessera_contract.report import GpuDevice, GpuUse, decode_report, encode_report

    uid = "0b5e5a6c-1d2e-4f30-8a9b-0123456789ab"
    gpus = (GpuUse(GpuDevice(0, "GPU-a", "NVIDIA-A100", 81920, nvlink_peers=("GPU-b",)), ((uid, 2048),), 300, 4000),
            GpuUse(GpuDevice(1, "GPU-b", "NVIDIA-A100", 81920, healthy=False, health_reason="XID 79"), (), 0, 0))
    back = decode_report(encode_report("node-1", gpus))
    assert back == tuple(GpuUse(g.device, g.pods, g.unattributed_mib) for g in gpus)
