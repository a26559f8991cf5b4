"""The argument readers every program's flags share: `tessera simulate`, `serve`, `inspect`, `certs` and bench/.

Each turns one flag's text into its value, or refuses it in words (argparse.ArgumentTypeError, which argparse
prefixes with the flag's name); `host_port` and `file_problem` answer in ValueError or words for the checks a
command makes after parsing. The standard library only: bench/ imports these without the simulator.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

MAX_SEEDS = 1000  # each seed is a whole replay (seconds to minutes): more is a typo, not a plan


def seeds_arg(text: str) -> list[int]:
    """`42`, `42-51`, `1,5,9`: each seed once, in order; a reversed or open range, a repeat, or more than
    MAX_SEEDS seeds is refused (`42,5-1` ran seed 42 alone, `42,42` reported two seeds of one run)."""
    seeds: list[int] = []
    usage = f"seeds look like 42, 42-51 or 1,5,9; got {text[:60]!r}"
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(usage) from None
        if last < first:
            raise argparse.ArgumentTypeError(f"seed range {part.strip()} runs backwards; write {last}-{first}")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"more than {MAX_SEEDS} seeds in {text[:60]!r}")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"seed {repeated[0]} given twice in {text[:60]!r}")
    return seeds


def names_arg(kind: str, known):
    def parse(text: str) -> list[str]:
        names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            what = ", ".join(unknown) or repr(text)
            raise argparse.ArgumentTypeError(f"unknown {kind} {what}; known: {', '.join(known)}")
        repeated = [n for i, n in enumerate(names) if n in names[:i]]
        if repeated:  # `fgd,fgd` ran fgd twice and reported its runs as extra seeds
            raise argparse.ArgumentTypeError(f"{kind} {repeated[0]} given twice in {text[:60]!r}")
        return names

    return parse


def loads_arg(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"loads look like 0.9 or 0.7,0.9,1.1; got {text!r}") from None
    if not all(0 < x < math.inf for x in loads):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"loads must be positive numbers; got {text}")
    repeated = [x for i, x in enumerate(loads) if x in loads[:i]]
    if repeated:  # `0.9,0.9` ran each replay twice and reported it as two seeds
        raise argparse.ArgumentTypeError(f"load {repeated[0]:g} given twice in {text[:60]!r}")
    return loads


def share_arg(text: str) -> float:
    """A share of pods, 0..1 (argparse's words when it is not one)."""
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a share is a number from 0 to 1, such as 0.3; got {text!r}") from None
    if not 0 <= share <= 1:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"a share is from 0 to 1 (0.3 is 30% of pods); got {text}")
    return share


def number_arg(kind: type, least: float, most: float = math.inf):
    """An int or float flag of at least `least` (and at most `most`), finite (argparse prefixes the flag's name to
    the error): a worker count of 0 or a lease of 0 s would otherwise be taken silently, or spin, or fail later in a
    traceback."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
        if not least <= value < math.inf:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"must be at least {least:g}; got {text}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}; got {text}")
        return value

    return parse


def pod_key_arg(text: str) -> str:
    """namespace/name, both parts given (`--pod ''` printed the summary, `--pod name` asked for a pod in no namespace)."""
    namespace, slash, name = text.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise argparse.ArgumentTypeError(f"a pod is namespace/name, e.g. ml/train-0; got {text[:80]!r}")
    return text


def nonempty_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def file_problem(text: str) -> str | None:
    """Why `text` is not a file to read, in words, or None."""
    if Path(text).is_dir():  # "no such file" sent people looking for a path that was there
        return f"{text} is a directory, not a file"
    if not Path(text).is_file():
        return f"no such file: {text}"
    return None


def existing_file(text: str) -> str:
    if (problem := file_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def csv_file(text: str) -> str:
    """An existing file with something in it: an empty CSV was refused for its "missing columns"."""
    existing_file(text)
    try:
        empty_csv(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def empty_csv(path: str) -> None:
    """ValueError when a CSV file holds nothing but white space (bench/openb.py asks too, through check_packable)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip() and len(head) < 1 << 16:
        raise ValueError(f"{path} is empty (a CSV starts with its header row)")


def namespace_name(text: str) -> str:
    """A Kubernetes namespace name (an RFC 1123 label): a bad one was retried against the API for ever."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"{text[:70]!r} is not a Kubernetes namespace name (lower-case letters, digits "
                                         "and '-', at most 63, starting and ending with a letter or digit)")
    return text


def existing_path(text: str) -> str:
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"no such file or directory: {text}")
    return text



def host_port(text: str, flag: str = "--listen") -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} wants HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
