"""The shape rules issue 13 set for the extender, read from the source with `ast`.

A function over 60 lines does more than one job (the bind handler that had five exits, each to
remember `bind_done`, was 90); the shells reach the service through its public methods, so a
refactor of the service's insides cannot silently break /inspect or the verbs.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60


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
