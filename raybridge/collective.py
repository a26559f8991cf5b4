"""One process group per membership generation, over a rendezvous store the controller hosts.

Why not `torch.distributed.init_process_group`: it keeps one global default group per process,
and a group whose peer died must be torn down before the survivors can form a smaller one. Here
every generation is its own `ProcessGroupGloo` (or NCCL) object over a key prefix named after
the generation, so a broken group is simply dropped and the next one formed beside it. The store
lives with the controller, not with rank 0, so losing rank 0 needs no new rendezvous address.
Every group has a short timeout: a frozen peer (no TCP reset) blocks an allreduce for that long.
The store is secure.py's: only a client holding the job's secret gets an answer (torch's TCPStore
would let anyone who reaches its port list, read and overwrite the job's keys).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass


class CollectiveBroken(RuntimeError):
    """An allreduce failed: a peer died or froze. The trainer is alive; its group is not."""


@dataclass(frozen=True, slots=True)
class Rendezvous:
    host: str
    port: int
    prefix: str  # job and generation: "ns/job/g7/"
    rank: int
    world: int
    timeout_s: float
    backend: str = "gloo"  # "nccl" when the trainers hold CUDA devices
    secret: bytes = b""  # the job's secret: the store answers no one without it (secure.py)


def host_store(secret: bytes, host: str = "127.0.0.1"):
    """The controller's rendezvous server on a free port; it answers only clients holding `secret`."""
    from .secure import AuthStoreServer

    return AuthStoreServer(secret, host)


def own_address() -> str:
    """The address this trainer's gloo listens on: TESSERA_GLOO_HOST, else the Ray node's IP."""
    import os

    if os.environ.get("TESSERA_GLOO_HOST"):
        return os.environ["TESSERA_GLOO_HOST"]
    import ray

    return ray.util.get_node_ip_address()


def form_group(rv: Rendezvous):
    """Connect this trainer to its generation's group; blocks until all `world` members arrived."""
    import torch.distributed as dist

    from .secure import connect_store

    timeout = datetime.timedelta(seconds=rv.timeout_s)
    store = connect_store(rv.host, rv.port, rv.secret, rv.timeout_s, prefix=rv.prefix)
    if rv.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rv.rank, rv.world, opts)
    if rv.backend != "gloo":
        raise ValueError(f"unknown collective backend {rv.backend!r}; gloo (CPU) or nccl (GPU)")
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=own_address())]
    return dist.ProcessGroupGloo(store, rv.rank, rv.world, opts)


def abort(group) -> None:
    """Close a group's connections (safe on a broken group). It does not wake an operation already
    waiting in it: allreduce_sum's `stop` does that."""
    try:
        group.abort()
    except RuntimeError:  # already aborted or never connected
        pass


def allreduce_sum(group, flat, timeout_s: float, stop: Callable[[], bool] = lambda: False,
                  poll_s: float = 0.05) -> None:
    """In-place sum across the group; CollectiveBroken when a peer is gone, or when `stop()` turns
    true while waiting (the controller learnt that a peer is gone: no need to wait out the timeout).

    The wait is cut in `poll_s` slices: gloo's `wait(timeout)` returns at completion, so a healthy
    step pays nothing for it."""
    work = group.allreduce([flat])
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            work.wait(datetime.timedelta(seconds=poll_s))
            return
        except RuntimeError as e:  # gloo: connection reset / closed / timed out, or our slice ran out
            if work.is_completed():  # it failed, or it completed just after the slice ran out
                try:
                    work.wait()
                    return
                except RuntimeError as failed:
                    raise CollectiveBroken(f"allreduce failed: {str(failed).splitlines()[0][:200]}") from None
            if time.monotonic() >= deadline:
                raise CollectiveBroken(f"allreduce failed: {str(e).splitlines()[0][:200]}") from None
            if stop():
                raise CollectiveBroken("allreduce abandoned: the controller reported a peer gone") from None
