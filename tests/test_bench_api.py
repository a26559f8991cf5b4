"""bench/ drives the packages through their public names only: a bench that reaches into `_private`
state (it read `extender._lock` and the fragmentation measure's `_memo`) breaks silently when the
internals move, and its figures then measure something else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def private_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_uses_no_private_name_of_the_packages(path):
    assert private_uses(path) == []


def test_the_check_sees_a_private_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from extender.cli import _seeds\nwith ext._lock:\n    pass\nself._ok = 1\n")
    assert private_uses(bad) == ["line 1: import _seeds", "line 2: ._lock"]
