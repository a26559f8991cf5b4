"""Page load to rendered, at 5,000 nodes, in Debian's headless chromium (issue 16: under 1 s).

Each run is a fresh headless chromium that loads the URL and dumps the DOM once the page's work is
done (`--virtual-time-budget`: idle time is skipped, real work is not). The baseline, in the same run,
is the same chromium on an empty page from the same server (`/healthz`): its start-up and teardown.
Page load to rendered = the map page's run minus the baseline's (request, parse, /inspect?summary=1,
layout, canvas draw); the page's own figure (navigation start to drawn, virtual clock) is printed too.

    python bench/page_load.py [--nodes 5000] [--runs 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import urllib.request

from extender.cli.args import number_arg
from testing.browser import chromium, run_chromium, serving
from testing.synthetic_cluster import synthetic_extender


def timed(url: str, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    dom = run_chromium(url, *args)
    return time.perf_counter() - started, dom


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=number_arg(int, 1), default=5000)
    ap.add_argument("--runs", type=number_arg(int, 1), default=5)
    args = ap.parse_args()
    if chromium() is None:
        print("chromium is not installed (scripts/chromium.sh)", file=sys.stderr)
        return 2
    with serving(synthetic_extender(nodes=args.nodes, pending=300)) as url:
        started = time.perf_counter()
        with urllib.request.urlopen(url + "/inspect?summary=1") as resp:
            size = len(resp.read())
        summary_s = time.perf_counter() - started
        base, page, inpage = [], [], []
        for _ in range(args.runs):
            s, _dom = timed(url + "/healthz", "--dump-dom")
            base.append(s)
            s, dom = timed(url + "/", "--dump-dom")
            if f'data-rendered="{args.nodes}"' not in dom:
                print("the page did not render every node", file=sys.stderr)
                return 1
            page.append(s)
            inpage.append(int(re.search(r"rendered \d+ nodes in (\d+) ms", dom).group(1)))
    b, p = statistics.median(base), statistics.median(page)
    print(f"nodes {args.nodes}: /inspect?summary=1 {size / 1e3:.0f} kB in {summary_s * 1e3:.0f} ms (first request)")
    print(f"chromium on an empty page (baseline): median {b * 1e3:.0f} ms of {args.runs}")
    print(f"chromium on the map page:             median {p * 1e3:.0f} ms of {args.runs}")
    print(f"page load to rendered (page - baseline): {(p - b) * 1e3:.0f} ms; the page's own figure: "
          f"median {statistics.median(inpage)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
