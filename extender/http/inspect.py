"""`GET /inspect` and `tessera inspect`: who holds which slice, and why a pod does not fit."""

from __future__ import annotations

from dataclasses import fields

from tessera_contract import TERMINAL_PHASES

from ..core.cluster import fit_reason
from ..queue_reservations import when
from ..service import Extender


def _node_entry(extender: Extender, node) -> dict:
    info = {g.index: g for g in extender.gpu_info.get(node.name, ())}
    # a GPU unhealthy under its pods has negative free in the cluster state: show 0, never below
    gpus = [{"index": g, "free_milli": max(0, free), "holders": []} for g, free in enumerate(node.gpu_free)]
    for gpu in gpus:
        known = info.get(gpu["index"])
        if known is not None and (not known.healthy or known.oob_memory_mib):
            gpu.update(healthy=known.healthy, oob_memory_mib=known.oob_memory_mib, reserved_milli=known.reserved_milli)
    for a in node.pods.values():
        for g in a.gpus:
            if g < len(gpus):
                gpus[g]["holders"].append({"pod": a.pod, "milli": a.milli})
    return {"name": node.name, "model": node.spec.gpu_model, "cpu_free_milli": node.cpu_free,
            "memory_free_mib": node.memory_free, "gpus": gpus}


def cluster_map(extender: Extender) -> dict:
    with extender.reading():
        nodes = [_node_entry(extender, node) for node in sorted(extender.cluster.nodes, key=lambda n: n.name)]
        return {"synced": extender.synced, "policy": extender.policy_name, "nodes": nodes,
                "reservations": len(extender.bind_holds), "not_counted": dict(extender.rejected),
                "nominations": [{"pod": n.key, "priority": n.priority, "node": n.node, "victims_left": sorted(n.victims.values()),
                                 **({"moves": dict(sorted(n.moves.items()))} if n.moves else {})}
                                for n in extender.nominations.by_uid.values()],
                "moves": extender.moves.listing(),
                "queue_reservations": extender.queue_reservations.listing(),
                "drain_leases": extender.queue_reservations.lease_listing(),
            "gang_drains": [{"gang": key[1], "nodes": sorted(d.nodes), "since": when(d.made_s), "gpus": d.gpus}
                            for key, d in sorted(extender.gangs.drains.by_gang.items())],
                "forged": {extender.pods[u].key if u in extender.pods else u: why for u, why in extender.forged.items()},
                "unhealthy_gpus": extender.unhealthy_gpus(),
                "bad_objects": extender.watch_health.bad_objects(), "watch_down_s": extender.watch_health.failing()}


def pod_reasons(extender: Extender, key: str) -> dict:
    """Everything Tessera knows of one pod, with a `status` and `why` in words for each case it
    has seen: bound, waiting in a gang, pending (per-node reasons), a bad object the watch set
    aside, an assignment not counted or forged. Only a pod it never saw gets an error."""
    bad = [b for b in extender.watch_health.bad_objects() if b["kind"] == "Pod" and b["key"] == key]
    with extender.reading():
        info = next((i for i in extender.pods.values() if i.key == key), None)
        if info is None:
            if bad:
                return {"pod": key, "status": "rejected",
                        "why": f"Tessera will not place this pod until this is fixed: {bad[-1]['reason']}"}
            return {"error": f"pod {key} is not in tessera's cache (Tessera has not seen it: check the name; in the "
                             "second-scheduler install, a pod comes to Tessera only with schedulerName tessera-scheduler)"}
        out: dict = {"pod": key, "request": _request_words(info.request)}
        notes = []
        if info.uid in extender.rejected:
            notes.append(f"its GPU assignment is not counted: {extender.rejected[info.uid]}")
        if info.uid in extender.forged:
            notes.append(f"its assignment annotation was set aside: {extender.forged[info.uid]}")
        if notes:
            out["notes"] = notes
        held = extender.cluster.assignments.get(key)
        if held is not None and not info.node and info.in_gang:
            gpus = ", ".join(map(str, held.gpus)) or "none"
            return {**out, "status": "admitted", "why": f"its gang was admitted: GPU(s) {gpus} of {held.node} are held "
                                                        "for it while it is bound",
                    "assigned": {"node": held.node, "gpus": list(held.gpus), "milli": held.milli}}
        if held is not None:
            return {**out, "status": "bound", "why": f"on {held.node}, GPU(s) {', '.join(map(str, held.gpus)) or 'none'}, "
                                                     f"{held.milli} milli each",
                    "assigned": {"node": held.node, "gpus": list(held.gpus), "milli": held.milli}}
        if info.node:
            return {**out, "status": "bound", "why": f"on {info.node} (placed without a Tessera GPU assignment)"}
        if info.phase in TERMINAL_PHASES:
            return {**out, "status": info.phase.lower(), "why": f"finished ({info.phase}); it holds nothing"}
        gang = _gang_words(extender, info)
        if gang is not None:
            return {**out, "status": "waiting in gang", "why": gang}
        request = extender.placer.request_for(info.request)
        reasons = {n.name: fit_reason(request, n) or "fits" for n in extender.cluster.nodes}
        _, why = _pod_cause(extender, info)
        if (nominated := extender.nominations.by_uid.get(info.uid)) is not None:
            left = sorted(nominated.victims.values())
            doing = (f"moving {', '.join(f'{k} to {d}' for k, d in sorted(nominated.moves.items()))} off {nominated.node}"
                     if nominated.moves else f"preempting on {nominated.node}")
            why = (f"{doing}; the room is held for it"
                   + (f" while {', '.join(left)} terminate{'s' if len(left) == 1 else ''}" if left else "") + f". {why}")
        return {**out, "status": "pending", "why": why + extender.queue_reservations.note(info.key), "nodes": reasons}



# Pending pods whose reasons the summary works out (each costs one pass over the nodes); the rest
# are counted, not explained, so /inspect?summary=1 stays cheap however many pods wait.
MAX_EXPLAINED = 300


def _pending(extender: Extender) -> list:
    return [i for i in extender.pods.values()
            if not i.node and i.phase not in TERMINAL_PHASES and i.key not in extender.cluster.assignments]


def _gang_words(extender: Extender, info) -> str | None:
    """Why a gang member is still waiting, or None when it is not in a gang (or its gang runs: then it waits as any pod)."""
    if not info.in_gang:
        return None
    placed, seen, required, short = extender.gang_status(info)
    if required and placed >= required and not short:
        return None
    why = f"{gang_name(info)} has {placed} of {required or '?'} members placed, {seen} seen"
    return f"{why}: {short.removeprefix('tessera: ')}" if short else why


def gang_name(info) -> str:
    return f"gang {info.gang.name}" if info.gang is not None else f"PodGroup {info.pod_group}"


def _pod_cause(extender: Extender, info) -> tuple[str, str]:
    """(cause, words) for a pending pod: the cause groups pods, the words explain this one."""
    gang = _gang_words(extender, info)
    if gang is not None:
        return "waiting for its gang", gang
    if held := extender.held_for_shorter_runs(info):
        return "held for shorter runs", held.removeprefix("tessera: ")
    request = extender.placer.request_for(info.request)
    counts: dict[str, int] = {}
    fits = 0
    for n in extender.cluster.nodes:
        why = fit_reason(request, n)
        if why is None:
            fits += 1
        else:
            counts[why] = counts.get(why, 0) + 1
    if fits and info.kube_refusal:  # kube's last attempt failed where Tessera would place it now: say kube's words
        return "refused by kube-scheduler", (f"fits {fits} nodes by Tessera's count now; kube-scheduler's last "
                                             f"attempt said: {info.kube_refusal[:300]}")
    if fits:
        return "fits, not bound yet", f"fits {fits} nodes now; kube-scheduler has not bound it yet"
    if not counts:
        return "no nodes", "the cluster has no nodes"
    top = max(counts, key=counts.get)
    cause = top.split(" (")[0] if top.startswith("no GPU has") else top
    cause = "no GPU has enough milli free" if cause.startswith("no GPU has") else cause
    return cause, f"fits no node: {top} ({counts[top]} of {len(extender.cluster.nodes)} nodes)"


def _request_words(r) -> str:
    gpu = "no GPU" if not r.gpu_count else (f"{r.gpu_count} GPU(s) x {r.gpu_milli} milli"
                                            + (f" of {'|'.join(sorted(r.gpu_models))}" if r.gpu_models else ""))
    return f"{r.cpu_milli}m CPU, {r.memory_mib} MiB, {gpu}"


def summary(extender: Extender) -> dict:
    """What the page and `tessera inspect` show first: a compact map, free GPUs per model,
    fragmentation, and the pending pods grouped by cause. Holders are left out (ask ?node=)."""
    with extender.reading():
        unhealthy = {(n, g.index) for n, gpus in extender.gpu_info.items() for g in gpus if not g.healthy}
        models: dict[str, dict] = {}
        nodes = []
        free_total = frag = 0
        for node in sorted(extender.cluster.nodes, key=lambda n: n.name):
            free = [max(0, f) if (node.name, i) not in unhealthy else 0 for i, f in enumerate(node.gpu_free)]
            bad = [i for i in range(len(free)) if (node.name, i) in unhealthy]
            nodes.append([node.name, node.spec.gpu_model or "", free, bad])
            if not free:
                continue
            m = models.setdefault(node.spec.gpu_model or "?", {"gpus": 0, "whole_free": 0, "free_milli": 0, "nodes": 0})
            m["nodes"] += 1
            m["gpus"] += len(free)
            m["whole_free"] += sum(1 for f in free if f >= 1000)
            m["free_milli"] += sum(free)
            free_total += sum(free)
            frag += sum(f for f in free if 0 < f < 1000)
        pending = sorted(_pending(extender), key=lambda i: i.key)
        groups: dict[str, list] = {}
        same: dict = {}  # pods that ask the same get the same reason: one pass over the nodes per shape
        for info in pending[:MAX_EXPLAINED]:
            if not info.in_gang:
                shape = tuple(getattr(info.request, f.name) for f in fields(info.request) if f.name != "name")
                if shape not in same:
                    same[shape] = _pod_cause(extender, info)
                cause, words = same[shape]
            else:
                cause, words = _pod_cause(extender, info)
            groups.setdefault(cause, []).append({"pod": info.key, "why": words, "request": _request_words(info.request),
                                                 "gang": gang_name(info) if info.in_gang else ""})
        gangs = {gang_name(i) for i in pending if i.in_gang}
        return {
            "synced": extender.synced, "policy": extender.policy_name, "node_count": len(nodes),
            "models": models, "free_milli": free_total,
            # the share of free GPU capacity that sits on partly used GPUs (no whole-GPU pod can use it)
            "fragmentation": round(frag / free_total, 4) if free_total else 0.0,
            "reservations": len(extender.bind_holds), "pending": len(pending),
            "queue_reservations": extender.queue_reservations.listing(),
            "drain_leases": extender.queue_reservations.lease_listing(),
            "gang_drains": [{"gang": key[1], "nodes": sorted(d.nodes), "since": when(d.made_s), "gpus": d.gpus}
                            for key, d in sorted(extender.gangs.drains.by_gang.items())],
            "pending_explained": min(len(pending), MAX_EXPLAINED),
            "waiting_gangs": len(gangs), "causes": [{"cause": c, "pods": p} for c, p in
                                                    sorted(groups.items(), key=lambda kv: -len(kv[1]))],
            "not_counted": len(extender.rejected), "forged": len(extender.forged),
            "bad_objects": len(extender.watch_health.bad_objects()), "unhealthy_gpus": len(unhealthy),
            "nodes": nodes,
        }


def node_detail(extender: Extender, name: str) -> dict:
    """One node's GPUs with their holders (the page asks on click)."""
    with extender.reading():
        node = extender.cluster.by_name.get(name)
        return _node_entry(extender, node) if node is not None else {"error": f"no node {name[:200]} in tessera's cache"}
