"""`tessera inspect`: a running extender's /inspect (its admin port) in words: the summary with pending pods by
cause, one pod, one node, or every node (--full).
"""

from __future__ import annotations

import argparse
import json
import sys

from .args import nonempty_arg, pod_key_arg


def add_inspect_command(sub) -> None:
    insp = sub.add_parser("inspect", help="a summary with pending pods by cause; a pod or a node in words")
    insp.add_argument("--url", default="http://127.0.0.1:8889",
                      help="the extender's admin URL (default http://127.0.0.1:8889: after "
                           "`kubectl -n tessera-system port-forward deploy/tessera-extender 8889`, in either "
                           "install mode)")
    what = insp.add_mutually_exclusive_group()  # one answer per call: `--pod a/b --node x` silently showed the pod
    what.add_argument("--pod", type=pod_key_arg, help="namespace/name of a pod: what Tessera knows of it, in words")
    what.add_argument("--node", type=nonempty_arg, help="one node's GPUs and who holds them")
    what.add_argument("--full", action="store_true", help="every node and GPU with its holders (long on a big cluster)")
    insp.add_argument("--per-node", action="store_true", help="with --pod: the reason on each node, not counted by reason")
    insp.add_argument("--json", action="store_true", help="the answer as JSON, as /inspect serves it")
    insp.set_defaults(run=cmd_inspect)



def cmd_inspect(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.parse
    import urllib.request

    if args.per_node and not args.pod:
        raise ValueError("--per-node shows one pod's reason on each node: give --pod NAMESPACE/NAME")

    query = (f"?pod={urllib.parse.quote(args.pod)}" if args.pod else "?node=" + urllib.parse.quote(args.node) if args.node
             else "" if args.full or args.json else "?summary=1")
    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        raise ValueError(f"--url wants the admin port's http:// or https:// address, got {args.url!r}")
    url = args.url.rstrip("/") + "/inspect" + query
    not_tessera = f"tessera inspect: {url} did not answer as Tessera's /inspect does: is it the admin port of tessera serve?"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            error = json.loads(e.read() or b"{}").get("error")
        except (ValueError, AttributeError):  # not Tessera's JSON error: some other server, or a proxy's page
            error = None
        print(f"tessera inspect: {error or f'{url}: HTTP {e.code} {e.reason}'}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as e:
        print(f"tessera inspect: cannot reach {url}: {e}", file=sys.stderr)
        return 1
    except ValueError:  # answered, but not JSON
        print(not_tessera, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=1))
        return 0
    body = _printable(body)
    try:
        print(render_inspect(body, per_node=args.per_node) if args.pod else render_inspect(body))
    except (KeyError, TypeError, AttributeError, ValueError):  # JSON of another shape
        print(not_tessera, file=sys.stderr)
        return 1
    return 0


def _printable(value):
    """Every string of an /inspect answer with control characters escaped before it reaches a terminal: names and
    reasons come from tenants and nodes, and an ESC sequence or a newline there would act on the admin's screen."""
    if isinstance(value, str):
        return value if value.isprintable() else value.encode("unicode_escape").decode("ascii")
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    return value


def render_summary(body: dict, limit: int = 10) -> str:
    """`tessera inspect`'s default: the page's summary line and pending pods grouped by cause."""
    models = ", ".join(f"{m}: {v['whole_free']} of {v['gpus']} GPUs free ({v['free_milli']} milli)"
                       for m, v in sorted(body["models"].items())) or "no GPUs"
    lines = [f"policy {body['policy']}{'' if body['synced'] else ' (NOT SYNCED)'}, {body['node_count']} nodes; {models}",
             f"fragmentation {100 * body['fragmentation']:.1f}% of free GPU capacity is on partly used GPUs; "
             f"{body['reservations']} binds awaiting confirmation; {body['pending']} pods pending, "
             f"{body['waiting_gangs']} gangs waiting"]
    extra = [f"{body[k]} {words}" for k, words in (("unhealthy_gpus", "unhealthy GPUs"), ("bad_objects", "objects set aside"),
                                                    ("not_counted", "assignments not counted"), ("forged", "forged assignments"))
             if body.get(k)]
    if extra:
        lines.append("; ".join(extra) + " (tessera inspect --full)")
    for r in body.get("queue_reservations", ()):  # reservations with backfill (extender/queue_reservations.py)
        waits = ", ".join(w["pod"] for w in r["waits_for"]) + (f" and {r['waits_for_more']} more" if r["waits_for_more"] else "")
        lines.append(f"node {r['node']} reserved for {r['pod']} ({r['gpus']} GPUs) from {r['expected_start']} until "
                     f"{r['expires']}" + (f", when {waits} should end" if waits else ""))
    for lease in body.get("drain_leases", ()):  # drain leases (extender/queue_reservations.py)
        lines.append(f"{lease['pod']} runs on {lease['node']} on a drain lease: deleted at {lease['ends']} if still there")
    if body["pending"] > body["pending_explained"]:
        lines.append(f"(reasons worked out for the first {body['pending_explained']} pending pods)")
    for group in body["causes"]:
        lines.append(f"{group['cause']}: {len(group['pods'])} pods")
        for p in group["pods"][:limit]:
            lines.append(f"  {p['pod']}: {p['why']} (asks {p['request']})")
        if len(group["pods"]) > limit:
            lines.append(f"  ... and {len(group['pods']) - limit} more")
    return "\n".join(lines)


def render_inspect(body: dict, per_node: bool = False) -> str:
    if "causes" in body:
        return render_summary(body)
    if "status" in body:  # one pod, in words
        lines = [f"pod {body['pod']}: {body['status']}: {body['why']}"]
        if body.get("request"):
            lines.append(f"  asks {body['request']}")
        lines += [f"  note: {n}" for n in body.get("notes", ())]
        reasons = body.get("nodes") or {}
        if reasons and not per_node:
            counts: dict[str, int] = {}
            for reason in reasons.values():
                counts[reason] = counts.get(reason, 0) + 1
            lines += [f"  {n:>5} nodes: {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])]
        else:
            lines += [f"  {node:<28} {reason}" for node, reason in sorted(reasons.items())]
        return "\n".join(lines)
    if "gpus" in body and "name" in body:  # one node
        body = {"policy": "-", "synced": True, "nodes": [body], "reservations": 0}
    lines = [f"policy {body['policy']}, synced {body['synced']}, {len(body['nodes'])} nodes, "
             f"{body['reservations']} binds awaiting confirmation"]
    for n in body["nodes"]:
        lines.append(f"{n['name']} ({n['model'] or 'no GPU'}), cpu free {n['cpu_free_milli']}m")
        for g in n["gpus"]:
            holders = ", ".join(f"{h['pod']}={h['milli']}" for h in g["holders"]) or "-"
            extra = "" if g.get("healthy", True) else "  UNHEALTHY"
            extra += f"  out-of-band {g['oob_memory_mib']} MiB" if g.get("oob_memory_mib") else ""
            lines.append(f"  GPU {g['index']}: free {g['free_milli']:>4}  {holders}{extra}")
    for bad in body.get("unhealthy_gpus") or []:
        lines.append(f"unhealthy: {bad['node']} GPU {bad['gpu']} {bad['uuid']}: pods to move: {', '.join(bad['pods']) or 'none'}")
    for uid, why in (body.get("not_counted") or {}).items():
        lines.append(f"not counted: {uid}: {why}")
    for pod, why in (body.get("forged") or {}).items():
        lines.append(f"forged: {pod}: {why}")
    for bad in body.get("bad_objects") or []:
        lines.append(f"set aside: {bad['kind']} {bad['key']}: {bad['reason']}")
    return "\n".join(lines)
