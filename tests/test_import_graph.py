"""The layering of Tessera's packages, read from the source with `ast` (nothing is imported).

Every `import` and `from ... import` in every module counts, at any depth (an import inside a function is
still a dependency: it runs the first time the function does). Modules are grouped into layers, and an
edge is a layer importing another:

    tessera_contract            the annotation contract: the standard library only
    extender.core               placement: the contract and itself
    extender.state              the extender's plain state types
    extender.translate          Kubernetes objects read into that state (the pod translator)
    extender.service, ...       the extender's logic (every module directly under extender/ not named below)
    extender.kube/http/sim      the shells: Kubernetes, HTTP, the simulator
    extender.serve, .cli        the programs that wire the shells together (extender.cli: the package, all of it)
    gpu_sharing, raybridge      the node agent and the Ray bridge: of the extender, the contract only

Beside the packages, bench/ and testing/ (the helpers the tests and the benches share): testing/ imports nothing of
tests/, no package imports testing/ (the image does not ship it), and neither bench/ nor testing/ touches sys.path
(they find the packages through the editable install).

Each assertion names the offending edge and the file and line that make it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tessera_contract", "extender", "gpu_sharing", "raybridge")
EXTENDER_SHELLS = ("extender.kube", "extender.http", "extender.sim")
EXTENDER_PROGRAMS = ("extender.serve", "extender.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str | None:
    """The layer a module belongs to; None for anything outside Tessera (the standard library, kubernetes...)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] != "extender":
        return parts[0]
    if len(parts) == 1:
        return "extender"
    head = ".".join(parts[:2])
    if head in ("extender.core", "extender.state", "extender.translate", *EXTENDER_SHELLS, *EXTENDER_PROGRAMS):
        return head
    return "extender.logic"  # the service and the modules that take over its jobs


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(absolute name of what is imported, line) for every import in the module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import wire` imports the module extender.http.wire: name it, so the edge is to its layer
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return out


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> where it happens ("path:line imports name"), between distinct layers."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module_name(path)
            source = layer(module)
            tree = ast.parse(path.read_text(), filename=str(path))
            for name, line in _imported(tree, module, path.name == "__init__.py"):
                target = layer(name)
                if target and target != source and source:
                    edges[(source, target)].append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return edges


def _describe(edges, pairs) -> str:
    return "; ".join(f"{a} -> {b} ({edges[(a, b)][0]})" for a, b in pairs)


EDGES = import_edges()


def test_the_graph_was_read():
    """A parser that found nothing would pass every rule below: the service's imports must show up."""
    assert ("extender.logic", "extender.core") in EDGES and ("raybridge", "tessera_contract") in EDGES


def test_no_cycle_between_layers():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in EDGES:
        graph[a].add(b)
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    described = [" -> ".join(c) + " (" + _describe(EDGES, zip(c, c[1:], strict=False)) + ")" for c in cycles]
    assert not cycles, "import cycle between layers: " + " | ".join(described)


ALLOWED = {  # what each layer may import, besides itself and everything outside Tessera
    "tessera_contract": set(),
    "extender.core": {"tessera_contract"},
    "extender.state": {"tessera_contract", "extender.core"},
    "extender.translate": {"tessera_contract", "extender.core", "extender.state"},
    "extender.logic": {"tessera_contract", "extender.core", "extender.state", "extender.translate"},
    "gpu_sharing": {"tessera_contract"},
    "raybridge": {"tessera_contract"},
}


@pytest.mark.parametrize("source", sorted(ALLOWED))
def test_lower_layers_import_nothing_above_them(source):
    bad = sorted(e for e in EDGES if e[0] == source and e[1] not in ALLOWED[source])
    assert not bad, f"{source} may import only {sorted(ALLOWED[source]) or 'the standard library'}: " + _describe(EDGES, bad)


def test_shells_import_no_program():
    """kube/, http/ and sim/ are parts serve and the CLI assemble; a shell that imported them would wire itself."""
    bad = sorted(e for e in EDGES if e[0] in EXTENDER_SHELLS and e[1] in EXTENDER_PROGRAMS)
    assert not bad, "a shell imports a program: " + _describe(EDGES, bad)


def test_no_shell_imports_another():
    """The API watch, the verbs and the simulator share the layers below them, never each other: the verbs used to take
    the pod translator and the bind Event's reason from the watch's package (extender.http -> extender.kube), so a
    change to the watch could break the verbs."""
    bad = sorted(e for e in EDGES if e[0] in EXTENDER_SHELLS and e[1] in EXTENDER_SHELLS)
    assert not bad, "a shell imports another shell: " + _describe(EDGES, bad)


def test_the_extender_ships_none_of_the_agents_package():
    """The agent's report is the contract's (tessera_contract/report.py) and the Node writer is the extender's own: the
    extender's server imports nothing of gpu_sharing (it used to decode the report with the agent's types, so its image
    carried the agent's package). Only the CLI, which wires every program's command, names it."""
    bad = sorted(e for e in EDGES if e[0].startswith("extender") and e[0] != "extender.cli" and e[1] == "gpu_sharing")
    assert not bad, "the extender imports the agent's package: " + _describe(EDGES, bad)


def test_every_module_of_the_cli_package_is_the_program_layer():
    """extender/cli/ is a package, one module per program and args.py: each module is the CLI's layer (the first two
    parts of a name decide it), so the rules above hold for all of it; the bridge's and the agent's commands are their
    own packages' (raybridge/cli.py, gpu_sharing/cli.py), held to the contract only."""
    names = ("extender.cli", "extender.cli.args", "extender.cli.simulate", "extender.cli.serve", "extender.cli.inspect")
    assert {layer(name) for name in names} == {"extender.cli"}
    assert layer("raybridge.cli") == "raybridge" and layer("gpu_sharing.cli") == "gpu_sharing"
    assert any(e[0] == "extender.cli" and e[1] == "raybridge" for e in EDGES)  # the dispatcher wires the bridge's command


def test_a_known_upward_import_is_caught(tmp_path):
    """The rules bite: a service that imported the Kubernetes adapter (as it did before issue 13) is reported."""
    tree = ast.parse("from .kube.cache import ApiCache\n")
    names = [layer(name) for name, _ in _imported(tree, "extender.service", False)]
    assert names == ["extender.kube"] and "extender.kube" not in ALLOWED[layer("extender.service")]


def test_the_contract_imports_only_the_standard_library():
    """The agent's launcher and the bridge's job code import the contract: a third-party import here (the kubernetes
    client's parse_quantity, say) would ride into every GPU pod and Ray pod, at any depth of a function."""
    outside = []
    for path in sorted((ROOT / "tessera_contract").rglob("*.py")):
        module = _module_name(path)
        for name, line in _imported(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top != "tessera_contract":
                outside.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not outside, "the contract imports beyond the standard library: " + "; ".join(outside)


# --- bench/ and testing/: the helpers the tests and the benches share ----------------------------------------------

SCRIPTS_AND_HELPERS = sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "testing").rglob("*.py"))


def sys_path_uses(path: Path) -> list[str]:
    """Where a module reads or changes sys.path (`sys.path...`, `from sys import path`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            found.append((node.lineno, "sys.path"))
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            found.append((node.lineno, "from sys import path"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", SCRIPTS_AND_HELPERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bench_or_helper_touches_sys_path(path):
    """Every bench inserted the repository root into sys.path (and load.py bench/ itself) to reach extender and the
    tests' helpers: a second way of finding the packages beside the editable install, which now finds testing/ too."""
    assert sys_path_uses(path) == []


def imports_of(paths: list[Path], top: str) -> list[str]:
    """'path:line imports name' for every import, at any depth, of the top-level package `top`."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for name, line in _imported(tree, _module_name(path), path.name == "__init__.py"):
            if name.split(".")[0] == top:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_the_helpers_and_the_benches_import_nothing_of_the_tests():
    """testing/ is what the tests and the benches share, so it stands below both: a helper that imported a test module
    (the synthetic cluster took its Node and Pod builders from tests/test_service.py) pulled the suite, and pytest,
    into every bench that used it."""
    assert any(p.parent.name == "testing" for p in SCRIPTS_AND_HELPERS), "testing/ was not read"
    assert imports_of(SCRIPTS_AND_HELPERS, "tests") == []


def test_no_package_imports_the_helpers():
    """The image ships extender, gpu_sharing, raybridge and tessera_contract and not testing/: an import of it there
    would work in a checkout and fail in every pod."""
    shipped = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert imports_of(shipped, "testing") == []


def test_the_checks_see_a_sys_path_use_and_an_import_of_the_tests(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.path.insert(0, '.')\nfrom sys import path\n\ndef f():\n    import os.path\n")
    assert sys_path_uses(bad) == ["line 2: sys.path", "line 3: from sys import path"]
    tree = ast.parse("from tests.test_service import k8s_pod\nfrom ..ports import both\nimport testing.fuzzkit\n")
    names = [name for name, _ in _imported(tree, "tests.e2e.harness", False)]
    assert names == ["tests.test_service.k8s_pod", "tests.ports.both", "testing.fuzzkit"]
