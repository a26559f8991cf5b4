"""Kubernetes Node and Pod objects as the API sends them, small enough to write inline: a GPU node with its
`nvidia.com/gpu` capacity and product label (and optionally Tessera's inventory annotation), a pod with GPU or
slice limits (and optionally a Tessera assignment)."""

from __future__ import annotations

import json

from extender.translate.objects import ASSIGNMENT_ANNOTATION


def k8s_node(name, gpus=4, model="T4", cpu="32", memory="128Gi", inventory=None):
    meta = {"name": name, "labels": {"nvidia.com/gpu.product": model}}
    if inventory:
        meta["annotations"] = {"tessera.dev/gpu-inventory": json.dumps({"gpus": inventory})}
    alloc = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)}
    return {"metadata": meta, "status": {"allocatable": alloc, "capacity": alloc}}


def k8s_pod(name, milli=None, gpus=None, node="", assignment=None, cpu="1", phase="Pending", uid=None, ann=None):
    limits = {"cpu": cpu, "memory": "1Gi"}
    if milli:
        limits["tessera.dev/gpu-milli"] = str(milli)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    annotations = dict(ann or {})
    if assignment:
        annotations[ASSIGNMENT_ANNOTATION] = json.dumps(assignment)
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], "nodeName": node},
        "status": {"phase": phase},
    }
