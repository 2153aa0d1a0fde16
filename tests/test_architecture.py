"""The package layout rules of `docs/architecture.md`, checked on the source tree.

Imports run one way, downward through the layers; no import cycle between files, of any kind:
function-level imports and `if TYPE_CHECKING:` imports count like any other (a type-only
circle is still two modules that must be understood together; shared types go in a module of
their own); no module loaded by name (`importlib`), which this check could not see; no
function takes a `quantized` flag (the numerics are a strategy chosen at load); no Python
file over 400 lines, no C file or header over 600; at most 8 modules directly in the package
root; `tests/` mirrors the source folders; the benchmarks (bench/, a client) import only
needlepoint's public names; no source comment cites an issue number (comments say why).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "needlepoint"
BENCH = REPO_ROOT / "bench" / "needlepoint_bench"
MAX_LINES = 400
MAX_C_LINES = 600
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
    "command": 7,  # the `needlepoint` command: cli/'s subcommands plus server/'s `serve`
    "": 7,  # the package root: the public facade, imported by nothing inside the package
    "__main__": 8,  # `python -m needlepoint`: runs `command`
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules that `name` imports anywhere: module level, inside functions, and in
    `if TYPE_CHECKING:` blocks alike."""
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

    for node in ast.walk(tree):
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


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed import path through a strongly connected component: a -> b -> ... -> a."""
    members, start = set(component), component[0]
    path, seen = [start], {start}

    def extend(node: str) -> bool:
        for nxt in sorted(graph[node] & members):
            if nxt == start and len(path) > 1:
                path.append(start)
                return True
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                if extend(nxt):
                    return True
                path.pop()
        return False

    extend(start)
    return path


def describe_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import circle as one line: its modules, and one closed path through them."""
    return [f"{len(component)} modules {component}: {' -> '.join(cycle_path(graph, component))}"
            for component in cycles(graph)]


def test_no_import_cycles() -> None:
    found = describe_cycles(import_graph())
    assert not found, "import circles (type-only imports count):\n" + "\n".join(found)


def test_no_module_is_loaded_by_name() -> None:
    """`importlib.import_module` / `__import__` hide an import from the two checks above."""
    hidden = [
        f"{p.relative_to(PACKAGE)}:{node.lineno}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.Attribute | ast.Name)
        and (getattr(node, "attr", None) or getattr(node, "id", None))
        in ("import_module", "__import__")
    ]
    assert hidden == []


def flag_parameters(name: str) -> list[str]:
    """Every function in src/ with a parameter called `name`, as `file:line function`."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                args = node.args
                params = args.posonlyargs + args.args + args.kwonlyargs
                if any(arg.arg == name for arg in params):
                    label = getattr(node, "name", "<lambda>")
                    found.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {label}")
    return found


def test_no_function_takes_a_quantized_flag() -> None:
    """Numerics are a strategy object picked once at load (issue 27 item 1), not a flag that
    every operation switches on."""
    found = flag_parameters("quantized")
    assert not found, "functions with a `quantized` parameter:\n" + "\n".join(found)


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


def test_c_file_sizes() -> None:
    """C sources and headers stay under about 600 lines: one header per kernel family (issue
    27 item 7)."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in (".c", ".h") and (n := len(p.read_text().splitlines())) > MAX_C_LINES
    }
    assert long == {}


def public_names() -> dict[str, set[str]]:
    """needlepoint's public, documented surface: the facade's `__all__` (docs/api.md "Public
    names for clients"), the `kernels` package's (README "Inspecting an archive") and the
    `stages` package's (docs/distributed.md)."""
    import needlepoint
    import needlepoint.kernels
    import needlepoint.stages

    return {"needlepoint": set(needlepoint.__all__),
            "needlepoint.kernels": set(needlepoint.kernels.__all__),
            "needlepoint.stages": set(needlepoint.stages.__all__)}


def private_uses(path: Path, public: dict[str, set[str]]) -> list[str]:
    """Each import of, or attribute reached through, a needlepoint name outside `public`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "needlepoint"]
            found += [n for n in names if n not in public]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] == "needlepoint":
            allowed = public.get(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names
                      if allowed is None or a.name not in allowed]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id == "needlepoint" and node.attr not in public["needlepoint"]:
            found.append(f"needlepoint.{node.attr}")
    return [f"{path.name}:{name}" for name in found]


def test_benchmarks_use_only_public_names() -> None:
    """bench/ is a client (issue 27 item 6): what it needs is public and documented, so a
    change inside the package never breaks it silently."""
    public = public_names()
    found = [use for p in sorted(BENCH.glob("*.py")) for use in private_uses(p, public)]
    assert not found, "benchmark imports of non-public needlepoint names:\n" + "\n".join(found)


def test_checker_sees_private_uses(tmp_path: Path) -> None:
    source = tmp_path / "b.py"
    source.write_text("import needlepoint\nimport needlepoint.stages\n"
                      "from needlepoint import load, Needle\nfrom needlepoint.api import x\n"
                      "from needlepoint.kernels import fwht, i8\nneedlepoint.load(1)\n"
                      "needlepoint.models.y\n")
    public = {"needlepoint": {"load", "Needle", "kernels"}, "needlepoint.kernels": {"fwht"}}
    assert private_uses(source, public) == [
        "b.py:needlepoint.stages", "b.py:needlepoint.api.x", "b.py:needlepoint.kernels.i8",
        "b.py:needlepoint.models"]


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
    assert test_dirs <= source_dirs | {"bench"}, test_dirs - source_dirs  # bench: its package
    # every folder of the package with code of its own has tests in its mirror (the native
    # kernels are tested beside their numpy references, in tests/kernels/)
    assert source_dirs - test_dirs <= {"models", "data", "kernels/native"}, source_dirs - test_dirs


def test_checker_sees_cycles_deferred_and_type_only_imports(tmp_path: Path) -> None:
    """The checker itself: a function-level import and a TYPE_CHECKING import both count, and
    a circle is reported with a closed path through it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert describe_cycles(graph) == ["3 modules ['a', 'b', 'c']: a -> b -> c -> a"]
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import y\n"
        "def f():\n    from .z import w\n"
    )
    modules = {"pkg.m": source, "pkg.x": source, "pkg.z": source}
    assert imports_of("pkg.m", source, modules) == {"pkg.x", "pkg.z"}


def test_checker_sees_a_quantized_parameter(tmp_path: Path, monkeypatch) -> None:
    """The flag rule itself: positional, keyword-only and nested functions are all found."""
    (tmp_path / "m.py").write_text(
        "def a(x, quantized):\n    pass\n"
        "def b(x, *, quantized=False):\n    def c(quantized): pass\n"
        "def d(x, quantized_rows):\n    pass\n"
    )
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert flag_parameters("quantized") == ["m.py:1 a", "m.py:3 b", "m.py:4 c"]


# Words that narrate a change (which issue asked, what the code did before) rather than say
# why the code is as it is: the history lives in git.
HISTORY = re.compile(r"\b(issue\s+#?\d+|previously|formerly|used to be)\b", re.IGNORECASE)
SOURCE_SUFFIXES = (".py", ".c", ".h", ".js")


def history_narration(root: Path) -> list[str]:
    """`file:line` of every line under `root` that narrates history (`HISTORY`): comments
    say why (the reason, or the README / docs section they follow)."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_source_comments_do_not_narrate_history() -> None:
    assert history_narration(PACKAGE) == []


def test_checker_sees_history_narration(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('"""Fine."""\nX = 1  # the cache (Issue 31 item 2)\n'
                                   "Y = 2  # previously a list\n")
    (tmp_path / "b.h").write_text("/* a why, not a which */\nint z; // used to be 3\n")
    (tmp_path / "c.py").write_text('"""The keys used to sort the rows: fine."""\n')
    assert history_narration(tmp_path) == ["a.py:2", "a.py:3", "b.h:2"]
