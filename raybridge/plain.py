"""Tessera's recovery on a plain Ray cluster, no Kubernetes: `python -m raybridge.job train` or `train()`.

For Ray users (and tests) who want the elastic trainers, the failure detection and the recovery
without pods: one trainer per Ray node that advertises `tessera-node:<name>` (placement.py), or,
on a cluster started without those resources, one trainer per alive Ray node pinned by node id.
Lost trainers are not replaced (nothing provisions nodes here): the job shrinks and goes on, and
`add_trainer` lets the caller grow it again once a node is back.

    from raybridge.plain import train
    history = train("ray://head:10001", "mypkg.model:build", {"global_batch": 32, "steps": 500}, world=4)
"""

from __future__ import annotations

import argparse
import json
import sys

from .contract import ContractError, Slice


def ray_nodes(ray, world: int, only: list[str] | None = None) -> dict[str, Slice]:
    """`world` trainer slots on the cluster's alive nodes advertising tessera-node:<name> (`only`: these names)."""
    from .placement import NODE_PREFIX

    slots: dict[str, Slice] = {}
    for node in sorted(ray.nodes(), key=lambda n: n["NodeID"]):
        if not node.get("Alive"):
            continue
        names = [r[len(NODE_PREFIX):] for r in node.get("Resources", {}) if r.startswith(NODE_PREFIX)]
        if names and (only is None or names[0] in only):
            slots[f"plain/{names[0]}"] = Slice(names[0])
    if len(slots) < world:
        raise ValueError(f"the Ray cluster has {len(slots)} nodes advertising {NODE_PREFIX}<name>, the job wants {world}: "
                         f"start each node with --resources='{{\"{NODE_PREFIX}<name>\": 1000}}'")
    return dict(list(slots.items())[:world])


def train(address: str | None, entrypoint: str, config: dict, world: int, job: str = "plain/job", on_step=None,
          nodes: list[str] | None = None):
    """Run `steps` (from config) on `world` trainers with Tessera's recovery; returns the controller's History.
    `on_step(report)` sees each step's StepReport; `nodes` restricts the trainers to those node names."""
    import ray

    from .controller import JobController, Options

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    ctl = JobController(job, entrypoint, config, Options.from_config(config, detached=False))
    try:
        ctl.start(ray_nodes(ray, world, nodes))
        ctl.run(int(config.get("steps", 100)), on_step)
        return ctl.history
    finally:
        ctl.close()


def add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="train on a plain Ray cluster (no Kubernetes) with Tessera's recovery",
                       description="Train on a Ray cluster whose nodes advertise tessera-node:<name>. With no --address: "
                       "the cluster $RAY_ADDRESS names, else the one started on this machine; none is started.")
    t.add_argument("--address", default=None, help="Ray address (default: auto / $RAY_ADDRESS)")
    t.add_argument("--entrypoint", required=True, help="package.module:function returning a raybridge.workload.Workload")
    t.add_argument("--config", default="{}", help="JSON object passed to the entrypoint (steps, global_batch, ...)")
    t.add_argument("--world", type=int, required=True, help="trainers (one per Ray node)")
    t.set_defaults(run=_train)


def _train(args: argparse.Namespace) -> int:
    """`train`: the flags are checked before Ray is imported (seconds) or joined, each refused in one line (exit 2);
    no Ray cluster to join, or too few nodes advertising tessera-node, is one line too (exit 1), not a traceback.

    With no --address it joins what `ray.init(address="auto")` finds ($RAY_ADDRESS, else the cluster started on
    this machine) and never starts a local Ray: that would have no tessera-node:<name> resources, so the job
    could only fail, after Ray's start-up."""
    from tessera_contract import RequestError
    from tessera_contract.annotations import decode_entrypoint
    from tessera_contract.values import load_json

    try:
        decode_entrypoint(args.entrypoint)
    except RequestError:
        raise ContractError(f"--entrypoint must be 'package.module:function', got {args.entrypoint[:80]!r}") from None
    try:
        config = load_json(args.config, "--config")
    except RequestError as e:
        raise ContractError(str(e)) from None
    if not isinstance(config, dict):
        raise ContractError(f"--config must be a JSON object such as '{{\"steps\": 100}}', got {args.config[:40]!r}")
    steps = config.get("steps", 100)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ContractError(f"--config: steps must be a whole number of at least 1, got {str(steps)[:40]!r}")
    if args.world < 1:
        raise ContractError(f"--world must be at least 1 (one trainer per Ray node), got {args.world}")
    try:
        import ray
    except ImportError as e:  # `pip install -e .` alone has no Ray: one line, as bench/recovery.py says it
        print(f"raybridge.job: train needs the ray extra (pip install -e '.[ray]'): {e.name or 'ray'} is not installed",
              file=sys.stderr)
        return 2

    address = args.address or "auto"
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        ray_nodes(ray, args.world)  # too few nodes: said before any trainer starts
    except ConnectionError as e:  # Ray's words, first line: it says which flag or variable to set
        where = args.address or "$RAY_ADDRESS or on this machine"
        print(f"raybridge.job: no Ray cluster to join at {where}: {(str(e).strip().splitlines() or [''])[0]}",
              file=sys.stderr)
        return 1
    except ValueError as e:  # an address Ray cannot read, or too few tessera-node:<name> nodes
        print(f"raybridge.job: {e}", file=sys.stderr)
        return 1

    def report(r):
        if r.recovery:
            print(f"recovered from losing {', '.join(r.recovery.lost)}: {r.recovery.total_s * 1000:.0f} ms from the last "
                  f"proof of life, {r.recovery.redone} step(s) redone, world {r.world}", file=sys.stderr)
    history = train(address, args.entrypoint, config, args.world, on_step=report)
    print(json.dumps({"steps": len(history.losses), "loss": history.losses[max(history.losses)],
                      "recoveries": len(history.recoveries)}))
    return 0
