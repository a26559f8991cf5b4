"""The annotation contract between Tessera's three programs: the extender, the node agent and the Ray bridge.

Every `tessera.dev/` annotation and resource one program writes and another reads is named here
once, with one encode and one decode each (annotations.py), and one bounded reader for the values
inside them (values.py). Before this package the assignment annotation alone was parsed in three
places with three sets of rules (extender/translate/objects.py strict and bounded, gpu_sharing/assignment.py
and raybridge/contract.py lenient: `"milli": "500"` or a 2^63-element `gpus` list passed there).

Why a top-level package and not a module of the extender: the node agent's launcher runs in every
GPU pod and the bridge's job code in every Ray pod. The contract used to live in the extender's
Kubernetes adapter, so reading one annotation key loaded the kubernetes client: 0.56 s, about 500
modules and 32 MiB more resident memory than this package's 13 MiB (python -c 'import kubernetes.client'
against 'import tessera_contract', measured on the dev machine); the agent's launcher copied the key
rather than pay that. A package that imports only the standard library cannot start pulling them in
by accident, and tests/test_import_graph.py holds it to that: nothing here imports extender,
gpu_sharing or raybridge.
"""

from .annotations import (
    Gang,
    GpuAssignment,
    GpuInfo,
    MacSigner,
    RayJob,
    decode_assignment,
    decode_expected_runtime,
    decode_gang,
    decode_inventory,
    decode_movable,
    decode_ray_job,
    decode_visible_devices,
    encode_assignment,
    encode_gang,
    encode_inventory,
    mac_verdict,
)
from .errors import ANNOTATION_CATEGORIES, AnnotationError, RequestError
from .keys import (
    ASSIGNMENT_ANNOTATION,
    DOMAIN,
    EXPECTED_RUNTIME_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GPU_RESOURCE,
    INVENTORY_ANNOTATION,
    KNOWN_POD_KEYS,
    MAC_ANNOTATION,
    MEMORY_LABEL,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    MODEL_LABEL,
    MOVABLE_ANNOTATION,
    TERMINAL_PHASES,
    VISIBLE_DEVICES_ANNOTATION,
)
from .values import parse_quantity, timestamp

__all__ = [
    "ANNOTATION_CATEGORIES", "ASSIGNMENT_ANNOTATION", "DOMAIN", "EXPECTED_RUNTIME_ANNOTATION",
    "GANG_NAME_ANNOTATION", "GANG_SIZE_ANNOTATION",
    "GPU_RESOURCE", "INVENTORY_ANNOTATION", "KNOWN_POD_KEYS", "MAC_ANNOTATION", "MEMORY_LABEL", "MILLI_PER_GPU",
    "MILLI_RESOURCE", "MODEL_LABEL", "MOVABLE_ANNOTATION", "TERMINAL_PHASES", "VISIBLE_DEVICES_ANNOTATION",
    "AnnotationError", "Gang", "GpuAssignment", "GpuInfo", "MacSigner", "RayJob", "RequestError",
    "decode_assignment", "decode_expected_runtime", "decode_gang", "decode_movable", "decode_inventory", "decode_ray_job",
    "decode_visible_devices",
    "encode_assignment", "encode_gang", "encode_inventory",
    "mac_verdict", "parse_quantity", "timestamp",
]
