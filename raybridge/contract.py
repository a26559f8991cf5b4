"""The job contract an ML engineer writes as pods, read from plain API dicts (camelCase).

A Ray training job is a gang of pods (docs/raybridge.md has a complete manifest):
  * `tessera.dev/runtime: ray` marks the pod as a trainer slot the bridge runs on Ray;
  * `tessera.dev/gang-name` / `tessera.dev/gang-size` (the extender's gang contract) name the job
    and its world size; the extender binds the gang whole or not at all;
  * `tessera.dev/entrypoint: module:function` builds the model, optimizer and data (raybridge.workload);
  * `tessera.dev/train-config` (JSON object) is passed to that function and to the job: steps,
    global_batch, checkpoint_every, checkpoint_dir, preprocess_actors, ...
Tessera writes `tessera.dev/gpu-assignment` at bind; the bridge reads it to give each trainer the
pod's node and GPU slice. The keys, and the decoding of the gang and assignment annotations, are the
shared contract's (tessera_contract): the bridge reads them exactly as the extender does. Pure
functions: the Kubernetes-facing code (kube.py) and the tests feed them dicts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tessera_contract import (
    ASSIGNMENT_ANNOTATION,
    GANG_NAME_ANNOTATION,
    TERMINAL_PHASES,
    RequestError,
    decode_assignment,
    decode_gang,
    decode_ray_job,
)
from tessera_contract.keys import (  # noqa: F401 (re-exported: the bridge's modules name them from here)
    BRIDGE_MAC_ANNOTATION,
    CONFIG_ANNOTATION,
    CREATED_BY_ANNOTATION,
    ENTRYPOINT_ANNOTATION,
    LOST_ANNOTATION,
    PHASE_ANNOTATION,
    PROGRESS_ANNOTATION,
    REPLACES_ANNOTATION,
    RUNTIME_ANNOTATION,
)
from tessera_contract.values import load_json, timestamp

BRIDGE_NAME = "tessera-bridge"


class ContractError(ValueError):
    """A pod that says it is a Ray job but breaks the contract; the message says how."""


@dataclass(frozen=True, slots=True)
class Slice:
    """Where Kubernetes (with Tessera) put one pod: node, GPU indices, milli per GPU, UUIDs."""

    node: str
    gpus: tuple[int, ...] = ()
    milli: int = 0
    uuids: tuple[str, ...] = ()
    pod: str = ""  # namespace/name: in the job's pods, the trainer is placed on the Ray node of this pod

    @property
    def num_gpus(self) -> float:
        """Ray's logical GPU count for this slice: milli / 1000 per GPU."""
        return len(self.gpus) * self.milli / 1000


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What every pod of one job agrees on."""

    key: str  # namespace/gang-name
    size: int
    entrypoint: str
    config_json: str  # canonical JSON text, so the spec stays hashable and frozen

    @property
    def config(self) -> dict:
        return json.loads(self.config_json)


@dataclass(frozen=True, slots=True)
class Member:
    """One pod of a job as the bridge sees it."""

    key: str  # namespace/name
    uid: str
    job: JobSpec
    slice: Slice | None  # None until bound with an assignment
    phase: str = ""
    deleting: bool = False
    replaces: str = ""
    ray_lost: bool = False  # the job says its trainer is gone (the pod itself may still run)
    job_phase: str = ""  # what the job wrote: Starting, Running, Recovering, Succeeded
    created_by: str = ""  # tessera.dev/created-by (anyone can write it: the bridge checks its MAC)
    bridge_mac: str = ""
    # pods of this job the job says it lost and that no longer exist (its progress annotation's "gone"):
    # how a restarted bridge, which never saw them, learns what to replace. Same namespace, at most the gang size.
    gone: tuple[str, ...] = ()
    created_s: float | None = None  # metadata.creationTimestamp, the apiserver's (seconds since the epoch)
    # a kubelet took the pod: it wrote the pod's status (start time, host IP, containers) or moved its phase on.
    # A pod bound to a node whose kubelet is gone stays Pending with none of these (raybridge/job.py).
    claimed: bool = False

    @property
    def lost(self) -> bool:
        return self.deleting or self.phase in TERMINAL_PHASES or self.ray_lost


def is_ray_pod(pod: dict) -> bool:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(RUNTIME_ANNOTATION) == "ray"


def _slice(ann: dict, node: str, key: str) -> Slice | None:
    raw = ann.get(ASSIGNMENT_ANNOTATION)
    if not raw or not node:
        return None
    try:
        a = decode_assignment(raw, f"pod {key}")
    except RequestError as e:
        raise ContractError(str(e)) from None
    if a.node != node:
        raise ContractError(f"pod {key}: {ASSIGNMENT_ANNOTATION} names node {a.node!r} but the pod is bound to {node!r}")
    return Slice(node=node, gpus=a.gpus, milli=a.milli, uuids=a.uuids)


def member(pod: dict) -> Member:
    """The bridge's view of a Ray job pod; ContractError in words when the pod breaks the contract."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ann = meta.get("annotations") or {}
    namespace = meta.get("namespace") or "default"
    key = f"{namespace}/{meta.get('name', '')}"
    if ann.get(RUNTIME_ANNOTATION) != "ray":
        raise ContractError(f"pod {key}: not a Ray job pod ({RUNTIME_ANNOTATION} is {ann.get(RUNTIME_ANNOTATION)!r})")
    try:  # the same decoders the extender's filter refuses such a pod with, before it holds a GPU
        gang, ray = decode_gang(ann, namespace), decode_ray_job(ann)
    except RequestError as e:
        raise ContractError(f"pod {key}: {e}") from None
    if gang is None or ray is None:  # decode_ray_job refuses runtime: ray without a gang name
        raise ContractError(f"pod {key}: a Ray job pod needs {GANG_NAME_ANNOTATION} (the job's name)")
    job = JobSpec(key=gang.name, size=gang.size, entrypoint=ray.entrypoint, config_json=ray.config_json)
    return Member(key=key, uid=str(meta.get("uid", "")), job=job, slice=_slice(ann, spec.get("nodeName") or "", key),
                  phase=str(status.get("phase") or ""), deleting=bool(meta.get("deletionTimestamp")),
                  replaces=ann.get(REPLACES_ANNOTATION, ""), ray_lost=bool(ann.get(LOST_ANNOTATION)),
                  job_phase=ann.get(PHASE_ANNOTATION, ""), created_by=ann.get(CREATED_BY_ANNOTATION, ""),
                  bridge_mac=ann.get(BRIDGE_MAC_ANNOTATION, ""), gone=_gone(ann.get(PROGRESS_ANNOTATION), namespace, gang.size),
                  created_s=timestamp(meta.get("creationTimestamp")), claimed=taken_by_kubelet(status))


def taken_by_kubelet(status: dict) -> bool:
    """Whether a kubelet has taken the pod (member.claimed)."""
    return (str(status.get("phase") or "Pending") != "Pending"
            or any(status.get(k) for k in ("startTime", "hostIP", "containerStatuses")))


def _gone(progress: object, namespace: str, size: int) -> tuple[str, ...]:
    """The `gone` list of the job's progress annotation: keys in the pod's own namespace, at most `size`.

    Written by the job, so the tenant's word: it can make the bridge replace pods only up to the gang
    size, as marking its own pods lost already can. Unreadable progress is no claim (the annotation is
    the job's report, not a request the bridge refuses)."""
    if not isinstance(progress, str) or not progress:
        return ()
    try:
        body = load_json(progress, "progress")
    except RequestError:
        return ()
    listed = body.get("gone") if isinstance(body, dict) else None
    if not isinstance(listed, list):
        return ()
    prefix = f"{namespace}/"
    ok = [k for k in listed[:size] if isinstance(k, str) and k.startswith(prefix) and _POD_NAME.fullmatch(k[len(prefix):])]
    return tuple(dict.fromkeys(ok))


# A pod name (RFC 1123 subdomain): a `gone` entry is one, or no claim. Checked because the bridge logs it and names
# an Event's target with it: a newline and ESC sequences in one forged a CRITICAL log line (audit, 2026-12-02).
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
