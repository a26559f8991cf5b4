"""`GET /inspect` and `tessera inspect`: who holds which slice, and why a pod does not fit."""

from __future__ import annotations

from ..core.cluster import fit_reason
from ..service import Extender


def cluster_map(extender: Extender) -> dict:
    with extender._lock:
        nodes = []
        for node in sorted(extender.cluster.nodes, key=lambda n: n.name):
            info = {g.index: g for g in extender.gpu_info.get(node.name, ())}
            gpus = [{"index": g, "free_milli": max(0, free), "holders": []} for g, free in enumerate(node.gpu_free)]
            for gpu in gpus:
                known = info.get(gpu["index"])
                if known is not None and (not known.healthy or known.oob_memory_mib):
                    gpu.update(healthy=known.healthy, oob_memory_mib=known.oob_memory_mib, reserved_milli=known.reserved_milli)
            for a in node.pods.values():
                for g in a.gpus:
                    if g < len(gpus):
                        gpus[g]["holders"].append({"pod": a.pod, "milli": a.milli})
            nodes.append({
                "name": node.name, "model": node.spec.gpu_model, "cpu_free_milli": node.cpu_free,
                "memory_free_mib": node.memory_free, "gpus": gpus,
            })
        return {"synced": extender.synced, "policy": extender.policy_name, "nodes": nodes,
                "reservations": len(extender.reservations), "not_counted": dict(extender.rejected),
                "forged": {extender.pods[u].key if u in extender.pods else u: why for u, why in extender.forged.items()},
                "unhealthy_gpus": extender.unhealthy_gpus(),
                "bad_objects": extender.watch_health.bad_objects(), "watch_down_s": extender.watch_health.failing()}


def pod_reasons(extender: Extender, key: str) -> dict:
    with extender._lock:
        info = next((i for i in extender.pods.values() if i.key == key), None)
        if info is None:
            return {"error": f"pod {key} is not in tessera's cache"}
        held = extender.cluster.assignments.get(key)
        if held is not None:
            return {"pod": key, "assigned": {"node": held.node, "gpus": list(held.gpus), "milli": held.milli}}
        request = extender.policy.request_for(info.request)
        reasons = {n.name: fit_reason(request, n) or "fits" for n in extender.cluster.nodes}
        return {"pod": key, "request": {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib,
                                         "gpu_count": request.gpu_count, "gpu_milli": request.gpu_milli,
                                         "gpu_models": sorted(request.gpu_models)}, "nodes": reasons}
