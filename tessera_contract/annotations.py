"""One encode and one decode per annotation that crosses programs; every decode bounded, every refusal in words.

  * gang (`gang-name`, `gang-size`): written by users, read by the extender (gang admission) and the
    bridge (a Ray job is a gang);
  * assignment (`gpu-assignment`, `visible-devices`, `assignment-mac`): written by the extender's
    bind, read by the extender's watch, the node agent's launcher and the bridge;
  * movable (`movable`): written by users on an elastic Ray job's members, read by the extender's
    mover (a trainer moved to make room: the job shrinks by one and regrows);
  * expected run time (`expected-runtime`): written by users, read by the extender's reservations
    with backfill (a short declared run may take a reserved node's spare GPUs);
  * Ray job (`runtime`, `entrypoint`, `train-config`): written by users, read by the bridge (which runs
    the job) and the extender (which refuses a pod that breaks it at filter, before it holds a GPU);
  * inventory (`gpu-inventory`, on a Node): the agent's report as the extender publishes it, read by
    the extender's watch.
The MAC is computed by a signer the caller holds (the keyring, tessera_contract/keyring.py):
this module only names where it goes and what each check result means.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from .errors import AnnotationError, RequestError
from .keys import (
    ASSIGNMENT_ANNOTATION,
    CONFIG_ANNOTATION,
    ENTRYPOINT_ANNOTATION,
    EXPECTED_RUNTIME_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    INVENTORY_ANNOTATION,
    MAC_ANNOTATION,
    MAX_ANNOTATION_CHARS,
    MAX_EXPECTED_RUNTIME_S,
    MAX_GANG_SIZE,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    MAX_NAME_CHARS,
    MILLI_PER_GPU,
    MOVABLE_ANNOTATION,
    RUNTIME_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)
from .values import DIGITS, duration_s, flag, load_json, printable, text, whole

# --- gang ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gang:
    name: str  # namespace-qualified: gangs of the same name in two namespaces are two gangs
    size: int


def decode_gang(annotations: Mapping[str, str], namespace: str) -> Gang | None:
    """The pod's gang, None when it names none; RequestError (AnnotationError when a category fits) in words."""
    name = annotations.get(GANG_NAME_ANNOTATION)
    if not name:
        return None
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise RequestError(f"{GANG_NAME_ANNOTATION} must be a name of at most {MAX_NAME_CHARS} printable characters "
                           "(no control characters: it is echoed into events and terminals)")
    raw = annotations.get(GANG_SIZE_ANNOTATION, "")
    if not raw:
        raise AnnotationError("half-gang", f"{GANG_NAME_ANNOTATION} {name[:60]!r} without {GANG_SIZE_ANNOTATION}: Tessera "
                              f"cannot tell how many members to wait for; add {GANG_SIZE_ANNOTATION}")
    if not isinstance(raw, str) or not DIGITS.fullmatch(raw.strip()) or not 1 <= int(raw) <= MAX_GANG_SIZE:
        # one message for "-2", "two", "0" and "20000": the rule and what was written
        raise AnnotationError("bad-value", f"{GANG_SIZE_ANNOTATION} must be a whole number 1..{MAX_GANG_SIZE}, "
                              f"got {str(raw)[:40]!r}")
    size = int(raw)
    return Gang(f"{namespace}/{name}", size)


def encode_gang(name: str, size: int) -> dict[str, str]:
    """The annotations that make a pod one of `size` members of gang `name` (unqualified: its namespace qualifies it)."""
    return {GANG_NAME_ANNOTATION: name, GANG_SIZE_ANNOTATION: str(size)}


# --- movable -------------------------------------------------------------------------------------

def decode_movable(annotations: Mapping[str, str]) -> bool:
    """Whether the pod's owner lets Tessera move it; AnnotationError in words for anything but a clear yes or no.

    Only a member of an elastic Ray job (`tessera.dev/runtime: ray` and a gang) can be moved: its job
    shrinks around the lost trainer and regrows when the bridge's replacement starts. Any other pod
    saying "true" would be deleted with nothing to bring it back, so that is refused, not taken.
    """
    raw = annotations.get(MOVABLE_ANNOTATION)
    if raw is None or raw == "false":
        return False
    if raw != "true":
        raise AnnotationError("bad-value", f"{MOVABLE_ANNOTATION} must be \"true\" or \"false\", got {str(raw)[:40]!r}")
    if annotations.get(RUNTIME_ANNOTATION) != "ray" or not annotations.get(GANG_NAME_ANNOTATION):
        raise AnnotationError("bad-value", f"{MOVABLE_ANNOTATION} \"true\" needs {RUNTIME_ANNOTATION}: ray and "
                              f"{GANG_NAME_ANNOTATION}: only a member of an elastic Ray job regrows after a move")
    return True


# --- Ray job -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayJob:
    """What a Ray job pod says beyond its gang: the function that builds the job, and its config (JSON text)."""

    entrypoint: str  # package.module:function
    config_json: str  # a JSON object, canonical (sorted keys)


def decode_entrypoint(raw: object) -> str:
    if not raw:
        raise AnnotationError("bad-value", f"{RUNTIME_ANNOTATION}: ray needs {ENTRYPOINT_ANNOTATION}, the function that "
                              "builds the job ('package.module:function')")
    text_ = raw if isinstance(raw, str) else ""
    module, sep, func = text_.partition(":")
    if (len(text_) > MAX_NAME_CHARS or not sep or not module or not func
            or not all(p.isidentifier() for p in module.split(".") + [func])):
        raise AnnotationError("bad-value", f"{ENTRYPOINT_ANNOTATION} must be 'package.module:function', got {str(raw)[:80]!r}")
    return text_


def decode_ray_job(annotations: Mapping[str, str]) -> RayJob | None:
    """The pod's Ray job, None when it is not one; AnnotationError in words when it half says it is.

    Without this the extender placed such pods and the bridge only logged why it would not run them:
    the user saw a bound pod whose job never started. `runtime` must be exactly "ray" (the one runtime);
    a Ray job is a gang (its name is the job's, its size the world size); `entrypoint` names the function
    that builds it; `train-config`, when given, is a JSON object. An `entrypoint` or `train-config`
    without `runtime: ray` would do nothing, so it is refused too.
    """
    runtime = annotations.get(RUNTIME_ANNOTATION)
    if runtime is None:
        stray = [k for k in (ENTRYPOINT_ANNOTATION, CONFIG_ANNOTATION) if k in annotations]
        if stray:
            raise AnnotationError("bad-value", f"{stray[0]} does nothing without {RUNTIME_ANNOTATION}: ray")
        return None
    if runtime != "ray":
        raise AnnotationError("bad-value", f"{RUNTIME_ANNOTATION} must be \"ray\" (the one runtime), got {str(runtime)[:40]!r}")
    if not annotations.get(GANG_NAME_ANNOTATION):
        raise AnnotationError("half-gang", f"{RUNTIME_ANNOTATION}: ray needs {GANG_NAME_ANNOTATION} and {GANG_SIZE_ANNOTATION}:"
                              " a Ray job is a gang, named for the job, of its world size")
    entrypoint = decode_entrypoint(annotations.get(ENTRYPOINT_ANNOTATION))
    try:  # bounded like every annotation: 64 KiB, and a 30,000-deep nesting is "not JSON", not a RecursionError
        config = load_json(annotations.get(CONFIG_ANNOTATION) or "{}", CONFIG_ANNOTATION)
    except RequestError as e:
        raise AnnotationError("bad-value", str(e)) from None
    if not isinstance(config, dict):
        raise AnnotationError("bad-value", f"{CONFIG_ANNOTATION} must be a JSON object")
    return RayJob(entrypoint, json.dumps(config, sort_keys=True))


# --- expected run time -----------------------------------------------------------------------------

def decode_expected_runtime(annotations: Mapping[str, str]) -> float | None:
    """Seconds the pod declares it will run, None when it declares nothing; AnnotationError('bad-value') in words.

    1 s to 30 days: a run time of 0 would let the pod backfill any reserved node, and one over 30 days
    is no estimate a reservation can plan around (MAX_EXPECTED_RUNTIME_S).
    """
    raw = annotations.get(EXPECTED_RUNTIME_ANNOTATION)
    if raw is None:
        return None
    try:
        return float(duration_s(raw, EXPECTED_RUNTIME_ANNOTATION, 1, MAX_EXPECTED_RUNTIME_S))
    except RequestError as e:
        raise AnnotationError("bad-value", str(e)) from None


# --- assignment ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """What bind gave a pod: its node, GPU indexes, milli of each, and the GPUs' UUIDs (index text when unknown)."""

    node: str
    gpus: tuple[int, ...]
    milli: int
    uuids: tuple[str, ...] = ()


class MacCheck(Protocol):
    status: str  # ok, missing, malformed, unknown (a key id the signer does not hold) or mismatch
    kid: str


class MacSigner(Protocol):
    """The keyring (tessera_contract/keyring.py), as far as the annotations need it."""

    def mac(self, uid: str, body: str) -> str: ...

    def check(self, uid: str, body: str, mac) -> MacCheck: ...


def encode_assignment(a: GpuAssignment, signer: MacSigner | None = None, uid: str = "") -> dict[str, str]:
    """What bind writes on the pod: the assignment's JSON, a visible-devices value, and with a signer its MAC."""
    ids = list(a.uuids) if a.uuids else [str(g) for g in a.gpus]
    body = json.dumps({"node": a.node, "gpus": list(a.gpus), "milli": a.milli, "uuids": ids}, separators=(",", ":"))
    out = {ASSIGNMENT_ANNOTATION: body, VISIBLE_DEVICES_ANNOTATION: ",".join(ids)}  # decode_visible_devices reads it
    if signer is not None:
        out[MAC_ANNOTATION] = signer.mac(uid, body)
    return out


def decode_visible_devices(raw: str, what: str) -> tuple[str, ...]:
    """The visible-devices annotation (the assignment's GPU ids, comma-separated) as a tuple, each id stripped.

    An empty id stays in the tuple: the reader decides that "no GPU" is an error (the launcher does).
    """
    raw = text(raw, f"{what}: {VISIBLE_DEVICES_ANNOTATION}", MAX_ANNOTATION_CHARS)
    ids = tuple(d.strip() for d in raw.split(","))
    if len(ids) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: {VISIBLE_DEVICES_ANNOTATION} names {len(ids)} GPUs, more than {MAX_GPUS_PER_NODE}")
    return ids


def decode_assignment(raw, what: str) -> GpuAssignment:
    """The assignment annotation's value; RequestError naming `what` when it is not one bind could have written."""
    what = f"{what}: unreadable {ASSIGNMENT_ANNOTATION}"
    body = load_json(text(raw, what, MAX_ANNOTATION_CHARS), what)
    if not isinstance(body, dict) or not isinstance(body.get("gpus"), list) or "node" not in body or "milli" not in body:
        raise RequestError(f"{what}: expected {{node, gpus, milli}}: {raw[:80]!r}")
    if len(body["gpus"]) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: more than {MAX_GPUS_PER_NODE} GPUs")
    gpus = tuple(whole(g, 0, MAX_GPUS_PER_NODE - 1, f"{what}: a GPU index") for g in body["gpus"])
    if len(set(gpus)) != len(gpus):
        raise RequestError(f"{what}: a GPU is named twice: {list(gpus)}")
    uuids = body.get("uuids") or []
    if not isinstance(uuids, list) or len(uuids) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: uuids must be a list of at most {MAX_GPUS_PER_NODE} strings")
    return GpuAssignment(
        node=text(body["node"], f"{what}: node"), gpus=gpus,
        milli=whole(body["milli"], 0, MILLI_PER_GPU, f"{what}: milli"),
        uuids=tuple(printable(u, f"{what}: a uuid") for u in uuids),
    )


def mac_verdict(annotations: Mapping[str, str], uid: str, signer: MacSigner | None) -> tuple[str, str]:
    """(why the assignment does not count or '', the key id its MAC names or ''); ('', '') with no signer."""
    body = annotations.get(ASSIGNMENT_ANNOTATION)
    if signer is None or not body:
        return "", ""
    check = signer.check(uid, str(body), annotations.get(MAC_ANNOTATION))
    why = {
        "ok": "",
        "missing": f"{ASSIGNMENT_ANNOTATION} not written by Tessera (no {MAC_ANNOTATION}): ignored",
        "malformed": f"{ASSIGNMENT_ANNOTATION} not written by Tessera ({MAC_ANNOTATION} is not a MAC Tessera writes): ignored",
        "unknown": f"{ASSIGNMENT_ANNOTATION} signed with key id {check.kid}, which this extender does not hold: ignored",
        "mismatch": f"{ASSIGNMENT_ANNOTATION} edited or copied (its {MAC_ANNOTATION} does not match): ignored",
    }[check.status]
    return why, check.kid


# --- inventory -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of a node's inventory annotation."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    healthy: bool = True
    oob_memory_mib: int = 0  # held by processes that belong to no Tessera assignment

    @property
    def reserved_milli(self) -> int:
        """Milli placement must not hand out: all of an unhealthy GPU, else the out-of-band memory's share.

        With the memory size unknown the share cannot be computed, and nothing is withheld.
        """
        if not self.healthy:
            return MILLI_PER_GPU
        if self.oob_memory_mib <= 0 or self.memory_mib <= 0:
            return 0
        return min(MILLI_PER_GPU, math.ceil(self.oob_memory_mib * MILLI_PER_GPU / self.memory_mib))


def encode_inventory(gpus: Iterable[Mapping]) -> str:
    """The annotation's value: one object per GPU with at least GpuInfo's fields (readers ignore any others).

    Compact and key-sorted, so the same report always gives the same text and the publisher can
    tell "unchanged" by comparing strings.
    """
    return json.dumps({"gpus": [dict(g) for g in gpus]}, separators=(",", ":"), sort_keys=True)


def decode_inventory(raw, node: str, model: str = "") -> tuple[GpuInfo, ...]:
    """The agent's per-GPU report, every field checked: its type, and a bound on every number."""
    what = f"node {node}: unreadable {INVENTORY_ANNOTATION}"
    body = load_json(text(raw, what, MAX_ANNOTATION_CHARS), what)
    listed = body.get("gpus") if isinstance(body, dict) else None
    if not isinstance(listed, list) or len(listed) > MAX_GPUS_PER_NODE:
        raise RequestError(f"{what}: expected {{\"gpus\": [...]}} with at most {MAX_GPUS_PER_NODE} GPUs")
    gpus = []
    for g in listed:
        if not isinstance(g, dict):
            raise RequestError(f"{what}: each GPU must be an object")
        gpus.append(GpuInfo(
            whole(g.get("index"), 0, MAX_GPUS_PER_NODE - 1, f"{what}: index"),
            printable(g.get("uuid", ""), f"{what}: uuid"), printable(g.get("model", model), f"{what}: model"),
            whole(g.get("memory_mib", 0), 0, MAX_GPU_MEMORY_MIB, f"{what}: memory_mib"),
            flag(g.get("healthy", True), f"{what}: healthy"),
            whole(g.get("oob_memory_mib", 0), 0, MAX_GPU_MEMORY_MIB, f"{what}: oob_memory_mib"),
        ))
    gpus.sort(key=lambda g: g.index)
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise RequestError(f"node {node}: {INVENTORY_ANNOTATION} must list GPUs 0..n-1")
    return tuple(gpus)
