"""Every key of the contract: resources, labels and annotations, and the bounds on what they may hold."""

from __future__ import annotations

MILLI_PER_GPU = 1000  # the unit of GPU share: tessera.dev/gpu-milli is 1..1000 of one GPU

GPU_RESOURCE = "nvidia.com/gpu"
# the pod phases after which a pod holds nothing: its GPUs are free whatever its annotations say
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MILLI_RESOURCE = "tessera.dev/gpu-milli"
MODEL_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
INVENTORY_ANNOTATION = "tessera.dev/gpu-inventory"  # on a Node: written by the extender from its agent's report
GANG_NAME_ANNOTATION = "tessera.dev/gang-name"
GANG_SIZE_ANNOTATION = "tessera.dev/gang-size"
# How long the pod expects to run once started: "90m", "2h", "1h30m", "3600s" or a plain number of seconds.
# Written by users, read by the extender's reservations with backfill (extender/queue_reservations.py).
EXPECTED_RUNTIME_ANNOTATION = "tessera.dev/expected-runtime"
ASSIGNMENT_ANNOTATION = "tessera.dev/gpu-assignment"  # written at bind; read by the extender, the agent, the bridge
VISIBLE_DEVICES_ANNOTATION = "tessera.dev/visible-devices"
MAC_ANNOTATION = "tessera.dev/assignment-mac"
# The Ray bridge's own keys: read or written by raybridge only, listed here so that the extender's
# check for misspelt keys knows them.
RUNTIME_ANNOTATION = "tessera.dev/runtime"
ENTRYPOINT_ANNOTATION = "tessera.dev/entrypoint"
CONFIG_ANNOTATION = "tessera.dev/train-config"
PHASE_ANNOTATION = "tessera.dev/ray-phase"
PROGRESS_ANNOTATION = "tessera.dev/ray-progress"
LOST_ANNOTATION = "tessera.dev/ray-lost"  # written by the job on a member whose trainer it lost
REPLACES_ANNOTATION = "tessera.dev/replaces"
CREATED_BY_ANNOTATION = "tessera.dev/created-by"
BRIDGE_MAC_ANNOTATION = "tessera.dev/bridge-mac"  # the bridge's HMAC over the pod it created
# "true" on every member of an elastic Ray job whose owner lets Tessera move its trainers to make room
# (extender/moves.py, docs/defragmentation.md); "false" or absent: never moved.
MOVABLE_ANNOTATION = "tessera.dev/movable"

DOMAIN = "tessera.dev/"
# The keys a pod's owner writes (the rest Tessera writes itself): what a misspelt or misplaced key is
# compared with ("did you mean ...?", spelling.py's near misses of the domain, a user key set as a label).
USER_POD_KEYS = (GANG_NAME_ANNOTATION, GANG_SIZE_ANNOTATION, EXPECTED_RUNTIME_ANNOTATION, MOVABLE_ANNOTATION,
                 RUNTIME_ANNOTATION, ENTRYPOINT_ANNOTATION, CONFIG_ANNOTATION)
# Every tessera.dev/ key some part of Tessera reads or writes on a pod (labels included: a label key
# written as an annotation by mistake is still a key Tessera knows). A tessera.dev/ annotation outside
# this list is a misspelling ("gang-sise") that would otherwise be ignored without a word.
# tests/test_contract_annotations.py checks that every tessera.dev/ key in the repository's code is listed here.
KNOWN_POD_KEYS = frozenset({
    GANG_NAME_ANNOTATION, GANG_SIZE_ANNOTATION, EXPECTED_RUNTIME_ANNOTATION,  # written by users
    ASSIGNMENT_ANNOTATION, VISIBLE_DEVICES_ANNOTATION, MAC_ANNOTATION,  # written by Tessera's bind
    RUNTIME_ANNOTATION, ENTRYPOINT_ANNOTATION, CONFIG_ANNOTATION,  # raybridge, read
    PHASE_ANNOTATION, PROGRESS_ANNOTATION, LOST_ANNOTATION,  # raybridge and its jobs, written
    REPLACES_ANNOTATION, CREATED_BY_ANNOTATION, BRIDGE_MAC_ANNOTATION,  # raybridge's pods
    MOVABLE_ANNOTATION,  # written by users on an elastic Ray job's members, read by the extender's mover
    "tessera.dev/ray-job", "tessera.dev/ray-role", "tessera.dev/ray-cluster",  # labels of the Ray examples
    "tessera.dev/scheduler", "tessera.dev/gpu-node",  # node labels and taints (second-scheduler mode, the agent)
})

# What one object may make a reader hold or loop over. Generous for any real machine (the largest
# nodes have 16 GPUs), small enough that an annotation claiming 2^63 GPUs is refused in words instead
# of building a tuple that never finishes.
MAX_GPUS_PER_NODE = 256
MAX_GPU_MEMORY_MIB = 2**24  # 16 TiB per GPU
MAX_NAME_CHARS = 253  # a DNS subdomain, the longest name Kubernetes gives anything
MAX_ANNOTATION_CHARS = 64 * 1024  # the assignment and inventory annotations (a 256-GPU inventory is ~40 KiB)
MAX_EXPECTED_RUNTIME_S = 30 * 24 * 3600  # 30 days: longer is no estimate a reservation can plan around
MAX_GANG_SIZE = 10_000  # the gang check places every missing member on a scratch cluster: bounded work
