"""Node kill to the next completed training step: the bridge's elastic recovery vs the DDP way.

On a real multi-node Ray cluster on this machine (ray.cluster_utils, nodes named like Kubernetes
nodes), one job of WORLD trainers (the example ResNet on synthetic data) trains; a thread SIGKILLs
the node of one trainer at a random moment mid-training. Measured from just before the kill to
the return of the first step the job completes after it:

  * elastic (the bridge): survivors form a smaller group and go on; a replacement node is added
    afterwards and its trainer joins at a step boundary (not timed: training continued meanwhile);
  * baseline, the DDP way, same job, same run: every trainer is torn down and started again (the
    replacement node is already there, so node provisioning is not counted), and the job resumes
    from its last durable checkpoint.

Prints median / min / max over the kills, steps redone, and the ratio baseline / elastic.

With `--at admit|form|checkpoint` the elastic kills land exactly at that moment outside a step
(issue 12 item 5): while a warm replacement copies the state of the member that dies (`admit`),
while the grown generation forms and another member dies (`form`), or at a checkpoint.

    .venv/bin/python bench/recovery.py [--kills 10] [--baseline-kills 10] [--world 3] [--checkpoint-every 10]
                                       [--kill node|raylet] [--at step|admit|form|checkpoint]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

from extender.cli.args import number_arg
from raybridge.contract import Slice
from raybridge.controller import JobController, JobFailed, Options
from raybridge.raycluster import LocalRayCluster, ray_missing

ENTRY = "raybridge.examples.resnet:build"
CONFIG = {"global_batch": 24, "channels": 8, "blocks": 1, "image_size": 8}


class Killer:
    """Kills a node from a thread after a random delay and notes the instant just before the kill."""

    whole_node = True

    def __init__(self, cluster: LocalRayCluster, node: str, rng: random.Random) -> None:
        self.at = 0.0
        self.thread = threading.Thread(target=self._run, args=(cluster, node, rng.uniform(0.05, 0.3)))
        self.thread.start()

    def _run(self, cluster, node, delay):
        time.sleep(delay)
        self.at = time.monotonic()
        cluster.kill(node, whole_node=self.whole_node)


RECORDED: dict[str, list] = {"elastic": [], "ddp": []}  # what the controller itself recorded (total, detection)


def train_until_recovered(ctl: JobController, killer: Killer, mode: str = "elastic") -> tuple[float, int]:
    while True:
        report = ctl.step()
        if report.recovery is not None:
            done = time.monotonic()
            killer.thread.join()
            RECORDED[mode].append((report.recovery.total_s, report.recovery.detection_s))
            return done - killer.at, report.recovery.redone


class KillAt:
    """Kills `node` the first time the controller reaches `moment` (JobController.on_moment)."""

    def __init__(self, cluster: LocalRayCluster, moment: str, node: str) -> None:
        self.cluster, self.moment, self.node, self.at = cluster, moment, node, 0.0
        self.thread = threading.Thread(target=lambda: None)
        self.thread.start()

    def __call__(self, what: str) -> None:
        if what == self.moment and not self.at:
            self.at = time.monotonic()
            self.cluster.kill(self.node, whole_node=Killer.whole_node)


def started_job(name: str, cluster, args, names) -> tuple[JobController, list[str]]:
    """A job of `args.world` trainers, one per new Ray node, five steps in: what every kill mode starts from."""
    ctl = JobController(name, ENTRY, CONFIG, Options(checkpoint_every=args.checkpoint_every,
                        checkpoint_dir=tempfile.mkdtemp(prefix="rb-ckpt-"), group_timeout_s=10))
    nodes = [next(names) for _ in range(args.world)]
    for n in nodes:
        cluster.add(n)
    ctl.start({f"w-{n}": Slice(n, (0,), 500, ()) for n in nodes})
    ctl.run(5)
    return ctl, nodes


def at_moments(cluster, rng, args, names) -> list[tuple[float, int]]:
    """Kills at one moment outside a step, each timed from the kill to the next completed step."""
    ctl, nodes = started_job("bench/moments", cluster, args, names)
    out = []

    def grow():
        new = next(names)
        cluster.add(new)
        nodes.append(new)
        ctl.add(f"w-{new}", Slice(new, (0,), 500, ()))
        ctl.wait_joiners(120)

    for i in range(args.kills):
        if args.at in ("admit", "form"):
            grow()  # the replacement is warm; the kill lands while it is admitted
            rank = 0 if args.at == "admit" else len(ctl.group.members) - 1  # the state source, or another member
        else:
            rank = rng.randrange(len(ctl.group.members))
        victim = ctl.group.members[rank].removeprefix("w-")
        hook = ctl.on_moment = KillAt(cluster, args.at, victim)
        while True:
            report = ctl.step()
            if report.recovery is not None and hook.at:
                done = time.monotonic()
                RECORDED["elastic"].append((report.recovery.total_s, report.recovery.detection_s))
                out.append((done - hook.at, report.recovery.redone))
                break
        ctl.on_moment = None
        print(f"  kill at {args.at} {i + 1}: {out[-1][0] * 1000:.0f} ms, redone {out[-1][1]}, step {ctl.step_done}, "
              f"world {ctl.world}", file=sys.stderr)
        for name in ctl.take_lost():
            nodes.remove(name.removeprefix("w-"))
        while len(nodes) < args.world:
            grow()
        ctl.run(ctl.step_done + 3)
    ctl.run(max(ctl.step_done, 60))
    assert sorted(ctl.history.losses) == list(range(1, ctl.step_done + 1)), "every step exactly once"
    ctl.close()
    return out


def elastic(cluster, rng, args, names) -> list[tuple[float, int]]:
    ctl, nodes = started_job("bench/elastic", cluster, args, names)
    out = []
    for i in range(args.kills):
        victim = rng.choice(nodes)
        killer = Killer(cluster, victim, rng)
        out.append(train_until_recovered(ctl, killer))
        print(f"  elastic kill {i + 1}: {out[-1][0] * 1000:.0f} ms, redone {out[-1][1]}, "
              f"step {ctl.step_done}, world {ctl.world}", file=sys.stderr)
        lost = ctl.take_lost()  # the killed one, plus any live trainer fenced as frozen (reported below)
        for name in lost:
            node = name.removeprefix("w-")
            nodes.remove(node)
            if node != victim:
                cluster.kill(node)  # its pod would be replaced too
            new = next(names)
            cluster.add(new)  # the replacement pod's node (main thread)
            nodes.append(new)
            ctl.add(f"w-{new}", Slice(new, (0,), 500, ()))
        ctl.wait_joiners(120)
        ctl.run(ctl.step_done + 3)
        assert ctl.world == args.world, f"did not grow back: world {ctl.world}"
    ctl.run(max(ctl.step_done, 120))
    assert sorted(ctl.history.losses) == list(range(1, ctl.step_done + 1)), "every step exactly once"
    losses = ctl.history.losses
    print(f"  elastic: {ctl.step_done} steps, each exactly once; loss {losses[1]:.3f} at step 1, "
          f"{losses[ctl.step_done]:.3f} at the end; live trainers fenced as frozen: {len(ctl.history.fenced)}",
          file=sys.stderr)
    ctl.close()
    return out


def baseline(cluster, rng, args, names) -> list[tuple[float, int]]:
    ctl = JobController("bench/ddp", ENTRY, CONFIG, Options(checkpoint_every=args.checkpoint_every, elastic=False,
                        checkpoint_dir=tempfile.mkdtemp(prefix="rb-ckpt-"), group_timeout_s=10))
    nodes = [next(names) for _ in range(args.world)]
    for n in nodes:
        cluster.add(n)
    ctl.start({f"w-{n}": Slice(n, (0,), 500, ()) for n in nodes})
    ctl.run(args.checkpoint_every + 2)
    out = []
    for i in range(args.baseline_kills):
        spare = next(names)
        cluster.add(spare)  # the replacement is ready before the kill: provisioning is not counted
        victim = rng.choice(nodes)
        killer = Killer(cluster, victim, rng)
        try:
            while True:
                ctl.step()
        except JobFailed:
            pass
        nodes.remove(victim)
        nodes.append(spare)
        ctl.take_lost()
        ctl.restart_from_durable({f"w-{n}-{i}": Slice(n, (0,), 500, ()) for n in nodes})
        out.append(train_until_recovered(ctl, killer, "ddp"))
        print(f"  ddp kill {i + 1}: {out[-1][0] * 1000:.0f} ms, redone {out[-1][1]}, step {ctl.step_done}", file=sys.stderr)
        ctl.run(ctl.step_done + rng.randint(1, args.checkpoint_every))
    ctl.close()
    return out


def summary(runs: list[tuple[float, int]]) -> dict:
    ms = [t * 1000 for t, _ in runs]
    redone = [r for _, r in runs]
    return {"n": len(runs), "median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1),
            "max_ms": round(max(ms), 1), "redone_max": max(redone), "redone_mean": round(statistics.mean(redone), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=number_arg(int, 1), default=10)
    parser.add_argument("--baseline-kills", type=number_arg(int, 1), default=10)
    parser.add_argument("--world", type=number_arg(int, 1), default=3)
    parser.add_argument("--checkpoint-every", type=number_arg(int, 1), default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill", choices=("node", "raylet"), default="node",
                        help="node: the raylet and its workers die at once (a lost machine or pod); raylet: only the "
                             "raylet is killed, as ray.cluster_utils does, and its workers exit 0.3-0.9 s later")
    parser.add_argument("--at", choices=("step", "admit", "form", "checkpoint"), default="step",
                        help="where the elastic kills land: mid-step at a random moment (default), or exactly at one "
                             "moment outside a step")
    args = parser.parse_args()
    Killer.whole_node = args.kill == "node"
    if ray_missing():
        print(f"bench/recovery.py: {ray_missing()}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    rng = random.Random(args.seed)
    cluster = LocalRayCluster()
    names = (f"k8s-node-{i}" for i in range(1, 10_000))
    try:
        cluster.connect()
        e = summary(elastic(cluster, rng, args, names) if args.at == "step" else at_moments(cluster, rng, args, names))
        b = summary(baseline(cluster, rng, args, names))
    finally:
        cluster.shutdown()
    ratio = b["median_ms"] / e["median_ms"]
    print(f"{'':<10}{'n':>4}{'median ms':>11}{'min':>8}{'max':>9}{'redone max':>12}{'redone mean':>13}")
    for label, s in (("elastic", e), ("ddp", b)):
        print(f"{label:<10}{s['n']:>4}{s['median_ms']:>11}{s['min_ms']:>8}{s['max_ms']:>9}{s['redone_max']:>12}"
              f"{s['redone_mean']:>13}")
    print(f"baseline / elastic (median): {ratio:.1f}x   target: median <= 380 ms, >= 10x, <= 1 step redone")
    rec = RECORDED["elastic"]
    if rec:
        print(f"elastic as the controller records it (tessera_ray_job_recovery_seconds, from the last proof of life): "
              f"median {statistics.median(t for t, _ in rec) * 1000:.0f} ms, of which detection "
              f"{statistics.median(d for _, d in rec) * 1000:.0f} ms")
    print(json.dumps({"elastic": e, "ddp": b, "ratio": round(ratio, 1), "world": args.world,
                      "checkpoint_every": args.checkpoint_every, "kill": args.kill,
                      "at": args.at}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
