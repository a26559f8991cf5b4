"""The assignment keys the running pods use, and the start-up check that stops an extender missing one.

The keys themselves and their MACs live in tessera_contract/keyring.py: the node's device plugin verifies
assignments with them too, and the contract package imports only the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tessera_contract import TERMINAL_PHASES
from tessera_contract.keyring import BARE, AssignmentSigner

log = logging.getLogger(__name__)


# --- the keys running pods use, and the start-up check -----------------------------------------


def keys_in_use(pods: Iterable) -> dict[str, int]:
    """kid -> how many live pods (not Succeeded/Failed) carry a MAC naming it, valid or not (bound or not).

    `pods` are the extender's PodInfo records (`extender.pods.values()`). A key may leave the
    keyring once its kid is absent here (on every replica). Bare MACs count under the legacy kid.
    """
    out: dict[str, int] = {}
    for p in pods:
        if p.kid and p.phase not in TERMINAL_PHASES:
            out[p.kid] = out.get(p.kid, 0) + 1
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """The start-up verdict over the synced pods: which kids they name, which of those we lack."""

    held: str  # the keyring, described
    in_use: dict[str, int]
    verified: int  # live pods whose MAC verifies
    unknown: dict[str, list[str]]  # kid we lack -> live pods naming it (namespace/name)

    @property
    def unknown_pods(self) -> int:
        return sum(len(v) for v in self.unknown.values())

    @property
    def refuse(self) -> bool:
        """Refuse when pods name keys we lack and they are not outnumbered by pods we can verify.

        Why not refuse on one such pod: anyone who creates pods can write any MAC annotation, so a
        single made-up kid would stop every restart of the scheduler. An honest key change (a lost
        or replaced Secret, a key removed too early) leaves most running pods on the missing key; a
        tenant must outnumber every pod Tessera signed to stop a start, and the message names the pods.
        """
        return self.unknown_pods > 0 and self.unknown_pods >= self.verified

    def message(self) -> str:
        named = "; ".join(f"key id {kid if kid != BARE else '(bare MAC from before key ids, not the legacy key held)'}: "
                          f"{len(pods)} pod(s), e.g. {', '.join(sorted(pods)[:3])}"
                          for kid, pods in sorted(self.unknown.items()))
        return (f"assignment keys: the running pods' MACs name key ids this extender does not hold ({named}); "
                f"{self.verified} pod(s) verify with the keys held: {self.held}. Counting those pods as forged "
                "would hand their GPUs out twice. Put the missing key(s) back into the keyring (see "
                "docs/assignment-key.md), or start with --accept-unknown-keys to count them as forged.")


def check_keys(pods: Iterable, signer: AssignmentSigner, nodes: Iterable[str] | None = None) -> KeyCheck:
    """Judge the extender's PodInfo records (after the first full sync) against `signer`'s keys.

    Only pods that could hold a GPU are counted: bound (to one of `nodes` when given) and not
    finished. A pod that names a node and never runs (the node does not exist) costs a tenant
    nothing, so it must not weigh in the verdict; every pod Tessera signed is bound to a real node.
    """
    held = set(signer.kids)
    known_nodes = set(nodes) if nodes is not None else None
    unknown: dict[str, list[str]] = {}
    verified = 0
    in_use: dict[str, int] = {}
    for p in pods:
        if not p.kid or p.phase in TERMINAL_PHASES or not p.node or (known_nodes is not None and p.node not in known_nodes):
            continue
        in_use[p.kid] = in_use.get(p.kid, 0) + 1
        if p.kid not in held:
            unknown.setdefault(p.kid, []).append(p.key)
        elif not p.forged:
            verified += 1
    return KeyCheck(signer.describe(), dict(sorted(in_use.items())), verified, unknown)


EXIT_UNKNOWN_KEYS = 78  # EX_CONFIG: the configuration (its keys), not the program, is wrong


def gate_readiness(extender, signer: AssignmentSigner | None, accept_unknown: bool,
                   exit_fn: Callable[[int], None] | None = None) -> None:
    """Run `check_keys` when the first full sync completes, before the extender reports ready.

    It wraps `extender.mark_synced` (the watch calls it once the first lists are applied), so
    `/readyz` never turns true with known assignments counted as forged. On refusal the process
    exits with EXIT_UNKNOWN_KEYS and the message (from the watch thread, hence os._exit).
    """
    if signer is None:
        return
    import os

    done = extender.mark_synced
    exit_fn = exit_fn or os._exit
    checked = []

    def mark_synced() -> None:
        if not checked:
            checked.append(True)
            verdict = check_keys(list(extender.pods.values()), signer, list(extender.cluster.by_name))
            log.info("assignment keys: holding %s; live pods by key id: %s", verdict.held,
                     ", ".join(f"{k}={n}" for k, n in verdict.in_use.items()) or "none")
            if verdict.unknown_pods:
                if verdict.refuse and not accept_unknown:
                    log.critical("%s", verdict.message())
                    logging.shutdown()
                    exit_fn(EXIT_UNKNOWN_KEYS)
                    return
                log.warning("%d pod(s) name key ids this extender does not hold (%s): counted as forged%s",
                            verdict.unknown_pods, ", ".join(sorted(verdict.unknown)),
                            " (--accept-unknown-keys)" if accept_unknown else "")
        done()

    extender.mark_synced = mark_synced
