"""Schemathesis over extender/http/openapi.yaml: 10,000 generated requests per verb, crashes and state changes counted.

Half the requests per verb fit the document (positive), half break it on purpose (negative: wrong
types, missing keys, extra nesting). Each goes to `tessera serve`'s Flask app in-process (WSGI),
whose extender holds real state (testing/fuzzkit.py); after each, the extender's snapshot is compared.
A failure stops the run with hypothesis' smallest failing example. The figure to report: requests
per verb, 5xx count (must be 0), state changes on refused requests (must be 0).

    python bench/fuzz.py [--per-verb 10000]
"""

from __future__ import annotations

import argparse
import sys
import time

try:
    from schemathesis import GenerationMode
except ImportError:  # the [test] extra's: `pip install -e .` alone has no fuzzer
    raise SystemExit("bench/fuzz.py needs the test extra (pip install -e '.[test]'): schemathesis is not installed") from None

from extender.cli.args import names_arg, number_arg
from testing.fuzzkit import P, live
from testing.openapi_fuzz import Tally, fuzz


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-verb", type=number_arg(int, 2), default=10_000)
    ap.add_argument("--verbs", type=names_arg("verb", ("filter", "prioritize", "bind", "preempt")),
                    default="filter,prioritize,bind,preempt")
    args = ap.parse_args()
    print(f"{'verb':>10} {'requests':>9} {'positive':>9} {'negative':>9} {'5xx':>4} {'refused':>8} {'binds':>6}"
          f" {'changed on refusal':>19} {'statuses':>30} {'req/s':>6}")
    for verb in args.verbs:
        world = live()
        total, split, started = Tally(), {}, time.perf_counter()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            before = total.requests
            fuzz(world, f"{P}/{verb}", "POST", mode, args.per_verb // 2, total)
            split[mode] = total.requests - before
        took = time.perf_counter() - started
        crashes = sum(n for code, n in total.statuses.items() if code >= 500)
        statuses = ",".join(f"{c}:{n}" for c, n in sorted(total.statuses.items()))
        print(f"{verb:>10} {total.requests:>9} {split[GenerationMode.POSITIVE]:>9} {split[GenerationMode.NEGATIVE]:>9}"
              f" {crashes:>4} {total.refused:>8} {total.binds_done:>6} {total.state_changes_on_refusal:>19} {statuses:>30}"
              f" {total.requests / took:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
