"""The shape rules issue 13 set for the extender, read from the source with `ast`.

A function over 60 lines does more than one job (the bind handler that had five exits, each to
remember `bind_done`, was 90); the shells reach the service through its public methods, so a
refactor of the service's insides cannot silently break /inspect or the verbs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60
# Functions were capped and classes were not, so growth went into one class: the Extender reached 715 lines with gang,
# preemption and filter rules inside it. Past 400 lines a class is doing more than one job (issue 36).
MAX_CLASS_LINES = 400


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def long_functions(folder: Path, root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{p.relative_to(root)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in sorted(folder.rglob("*.py")) for f in _functions(p) if f.end_lineno - f.lineno + 1 > limit]


def test_no_function_in_the_extender_is_over_60_lines():
    assert long_functions(ROOT / "extender") == []


def test_the_check_finds_a_long_function(tmp_path):
    (tmp_path / "x.py").write_text("def f():\n" + "    pass\n" * 61 + "\n\ndef g():\n" + "    pass\n" * 59)
    assert long_functions(tmp_path, tmp_path) == ["x.py:1 f (62 lines)"]


def long_classes(folder: Path, root: Path = ROOT, limit: int = MAX_CLASS_LINES) -> list[str]:
    return [f"{p.relative_to(root)}:{c.lineno} {c.name} ({c.end_lineno - c.lineno + 1} lines)"
            for p in sorted(folder.rglob("*.py")) for c in ast.walk(ast.parse(p.read_text(), str(p)))
            if isinstance(c, ast.ClassDef) and c.end_lineno - c.lineno + 1 > limit]


@pytest.mark.parametrize("package", ["extender", "gpu_sharing", "raybridge", "tessera_contract"])
def test_no_class_is_over_400_lines(package):
    """Every package, not only the extender: the Ray job controller had grown to 454 lines beside it."""
    assert long_classes(ROOT / package) == []


def test_the_check_finds_a_long_class(tmp_path):
    (tmp_path / "x.py").write_text("class A:\n" + "    x = 1\n" * 400 + "\n\nclass B:\n" + "    x = 1\n" * 399)
    assert long_classes(tmp_path, tmp_path) == ["x.py:1 A (401 lines)"]


def test_the_shells_call_no_private_method_of_the_service():
    """`extender._something(...)` from http/, kube/, serve or cli: a dependency on the service's insides."""
    found = []
    for folder in ("extender/http", "extender/kube"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "extender"
                        and node.func.attr.startswith("_")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} extender.{node.func.attr}()")
    assert found == []


# Private names of the standard library the extender must use: argparse has no public way to list a parser's
# subcommands, and a forked child leaves with os._exit (no atexit handlers, no flushed parent buffers).
STDLIB_PRIVATE = {"os._exit", "argparse._SubParsersAction", "parser._actions"}


def private_reads(folder: Path, root: Path = ROOT) -> list[str]:
    """`something._name` where `something` is not `self` or `cls`: one object reading another's insides."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and ast.unparse(node) not in STDLIB_PRIVATE):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_of_the_extender_reads_another_objects_private_parts():
    """The shells took `extender._lock` in 6 places and read the service's parts inside; they go through
    `Extender.reading()` now, so the service's insides can change without breaking /inspect or /metrics."""
    assert private_reads(ROOT / "extender") == []


def test_the_check_finds_a_private_read(tmp_path):
    (tmp_path / "x.py").write_text("with extender._lock:\n    self._ok = other._bad\n")
    assert private_reads(tmp_path, tmp_path) == ["x.py:1 extender._lock", "x.py:2 other._bad"]
