"""What run time each pod declares, as users declare it: time mode's `--declarations`.

Tessera's queue rules read a pod's declared run: shortest runs first reads `spec.activeDeadlineSeconds`
(short_first.py), reservations read `tessera.dev/expected-runtime` (backfill.py). Time mode used to hand
every pod its exact trace duration, which no user declares. Batch-scheduler logs show what users do
instead (docs/queueing.md, "Declared run times", has the sources and what each parameter stands for):

* estimates are modal: a handful of round values (15 minutes, an hour, a day) cover almost every job
  (Tsafrir, Etsion & Feitelson 2005), so a declaration here is always one of `ROUND_VALUES_S`;
* users overestimate, by a factor that varies widely from job to job: the share of the declared time a
  job uses is spread over (0, 1] (Mu'alem & Feitelson 2001), drawn here uniformly and then rounded up
  to the next round value, so most pods use a small part of what they declare;
* some jobs run into their limit and are stopped there (the kubelet stops a pod `activeDeadlineSeconds`
  after it started: counted by time mode as `deadline_stopped`);
* some users write the largest value they know of whatever the job;
* many declare nothing: a Kubernetes pod has no deadline unless its author writes one.

The shares are Tessera's choices within what those studies describe, not figures taken from them:
`DeclarationModel` holds them, and tests and benchmarks can vary them. `exact` (each pod declares its
trace duration and is never stopped) stays for comparison.

One declared value per pod serves both fields: a user who writes a deadline writes the same run in
the annotation. Draws are seeded by the run's seed alone, so every policy of one seed sees the same
declarations.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

DECLARATIONS = ("users", "exact")
DEFAULT_DECLARATIONS = "users"

_M, _H = 60.0, 3600.0
ROUND_VALUES_S = (5 * _M, 10 * _M, 15 * _M, 20 * _M, 30 * _M, 1 * _H, 2 * _H, 3 * _H, 4 * _H, 6 * _H, 8 * _H, 12 * _H,
                  18 * _H, 24 * _H, 36 * _H, 48 * _H, 72 * _H, 168 * _H)


@dataclass(frozen=True, slots=True)
class Declaration:
    """One pod's declared run (None: declares nothing) and how long it really runs: `stopped` when the kubelet
    stops it at its deadline, the run it would have had being longer."""

    declared_s: float | None
    run_s: float
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class DeclarationModel:
    """How a population of users declares run times (the module's docstring says where each share comes from)."""

    silent: float = 0.4  # declares nothing
    at_limit: float = 0.1  # of those who declare: a round value below the run, so the kubelet stops the pod there
    largest: float = 0.15  # of those who declare: the largest round value, whatever the run
    values_s: tuple[float, ...] = ROUND_VALUES_S  # ascending

    def __post_init__(self) -> None:
        for name in ("silent", "at_limit", "largest"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"declarations: {name} is a share, 0..1; got {getattr(self, name)}")
        if self.at_limit + self.largest > 1:
            raise ValueError("declarations: at_limit + largest is more than every declaring user")
        if not self.values_s or list(self.values_s) != sorted(set(self.values_s)) or self.values_s[0] <= 0:
            raise ValueError("declarations: values_s must be positive and ascending, without repeats")

    def declare(self, run_s: float, rng: random.Random) -> Declaration:
        """What one user declares for a run of `run_s` seconds, and how long the pod then runs."""
        values = self.values_s
        u = rng.random()
        if u < self.silent:
            return Declaration(None, run_s)
        kind = rng.random()
        if kind < self.at_limit:
            below = bisect.bisect_left(values, run_s)  # values[below - 1] < run_s
            if below:
                return Declaration(values[below - 1], values[below - 1], stopped=True)
            return Declaration(values[0], run_s)  # shorter than the smallest value: no round value below it
        if kind < self.at_limit + self.largest:
            return self._at_least(values[-1], run_s)
        used = 1.0 - rng.random()  # the share of its declaration the run uses: (0, 1]
        return self._at_least(run_s / used, run_s)

    def _at_least(self, wanted_s: float, run_s: float) -> Declaration:
        """The smallest round value of at least `wanted_s` (the largest if none is): a run longer than the largest
        value is declared by no one (its user knows no value long enough, so writes none)."""
        values = self.values_s
        if run_s > values[-1]:
            return Declaration(None, run_s)
        i = bisect.bisect_left(values, wanted_s)
        return Declaration(values[min(i, len(values) - 1)], run_s)


def declare_runs(runs_s: list[float], mode: str, seed: int, model: DeclarationModel | None = None) -> list[Declaration]:
    """One `Declaration` per run, in order: `exact` declares each run as it is; `users` draws from `model`."""
    if mode == "exact":
        return [Declaration(r, r) for r in runs_s]
    if mode != "users":
        raise ValueError(f"declarations: {mode!r} is not one of {', '.join(DECLARATIONS)}")
    rng = random.Random(f"declarations:{seed}")
    model = model or DeclarationModel()
    return [model.declare(r, rng) for r in runs_s]
