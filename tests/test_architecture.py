"""The package layout rules of `docs/architecture.md`, checked on the source tree.

Imports run one way, downward through the layers; no import cycle between files (function-level
imports included, `if TYPE_CHECKING:` blocks excluded); no file over 400 lines; at most 8
modules directly in the package root; `tests/` mirrors the source folders.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "needlepoint"
MAX_LINES = 400
MAX_ROOT_MODULES = 8

# Layer of each top-level part of the package: a module may import its own layer (inside the
# same folder) and any lower one, never a higher one. `errors` and `version` sit under all.
LAYERS = {
    "errors": 0,
    "version": 0,
    "kernels": 1,
    "formats": 2,
    "models": 3,
    "generation": 4,
    "api": 5,
    "stages": 4,
    "cli": 6,
    "server": 6,
    "": 7,  # the package root: the public facade, imported by nothing inside the package
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _walk_runtime(node: ast.AST):
    """Every node except those inside `if TYPE_CHECKING:` blocks."""
    for child in ast.iter_child_nodes(node):
        if _type_checking_block(child):
            yield from (n for body in child.orelse for n in _walk_runtime_self(body))
            continue
        yield child
        yield from _walk_runtime(child)


def _walk_runtime_self(node: ast.AST):
    yield node
    yield from _walk_runtime(node)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules that `name` imports at run time (module level or inside functions)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    package = name.split(".") if name else []
    if not is_package:
        package = package[:-1]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target in modules or target == "":
            found.add(target)

    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "needlepoint" or alias.name.startswith("needlepoint."):
                    add(alias.name.partition(".")[2])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "needlepoint":
                target = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                add(sub if sub in modules else target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(name: str) -> tuple[str, int]:
    top = name.split(".")[0] if name else ""
    assert top in LAYERS, f"{name}: top-level part {top!r} has no layer in LAYERS"
    return top, LAYERS[top]


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_imports_run_downward() -> None:
    upward = []
    for name, targets in import_graph().items():
        top, rank = layer_of(name)
        for target in targets:
            other, other_rank = layer_of(target)
            if other == top:
                continue
            if other_rank >= rank:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_file_sizes_and_root_modules() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
    root = [p.name for p in PACKAGE.glob("*.py")]
    assert len(root) <= MAX_ROOT_MODULES, root


def test_tests_mirror_source_folders() -> None:
    tests = REPO_ROOT / "tests"
    source_dirs = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_dir() and any(p.glob("*.py"))
    }
    test_dirs = {
        p.relative_to(tests).as_posix()
        for p in tests.rglob("*")
        if p.is_dir() and any(p.glob("test_*.py"))
    }
    assert test_dirs <= source_dirs, test_dirs - source_dirs
    # every folder of the package with code of its own has tests in its mirror (the native
    # kernels are tested beside their numpy references, in tests/kernels/)
    assert source_dirs - test_dirs <= {"models", "data", "kernels/native"}, source_dirs - test_dirs


def test_checker_sees_cycles_and_deferred_imports(tmp_path: Path) -> None:
    """The checker itself: a function-level import still makes a cycle; TYPE_CHECKING does not."""
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(graph) == [["a", "b"]]
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import y\n"
        "def f():\n    from .z import w\n"
    )
    modules = {"pkg.m": source, "pkg.x": source, "pkg.z": source}
    assert imports_of("pkg.m", source, modules) == {"pkg.z"}
