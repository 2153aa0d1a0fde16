"""No duck-typing probes above `models/`: `api/`, `server/` and `generation/` never ask a model,
a session or a chat format what it is with `getattr` / `hasattr` (optional abilities are
declared: `ModelCapabilities` / `SessionCapabilities`; a chat format's call syntax is an object,
`generation/syntaxes.py`). The calls that remain are named below, each with why it is not such
a probe; a new one fails this test until it is removed or named here."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "needlepoint"
FOLDERS = ("api", "server", "generation")

# (file, the probed object as written): why it is allowed
ALLOWED = {
    ("api/needle.py", "schema"): "argument parsing: a pydantic class or a JSON schema",
    ("api/grammars.py", "fmt"): "argument parsing: response_format, a pydantic class or a dict",
    ("api/results.py", "value"): "argument parsing: a tool's result, pydantic or plain",
    ("api/tools.py", "obj"): "argument parsing: a function marked by @tool",
    ("api/tools.py", "tp"): "argument parsing: a type annotation (pydantic model?)",
    ("api/tools.py", "meta"): "argument parsing: typing.Annotated metadata",
    ("api/tools.py", "func"): "argument parsing: a user function's __name__",
    ("api/tools.py", "model"): "argument parsing: a pydantic model's __tool_name__",
    ("api/mcp_tools.py", "block"): "an MCP result's content blocks (text or not)",
    ("api/handoff.py", "error"): "a urllib error's optional reason",
    ("api/batched.py", "value"): "sizing a session's arrays by walking its attributes",
    ("server/cli.py", "args"): "argument parsing: argparse namespaces of several commands",
    ("server/fields.py", "req"): "a pydantic request's fields, by name",
    ("server/fields.py", "message"): "a pydantic message's fields, by name",
    ("server/responses_input.py", "req"): "a pydantic request's fields, by name",
    ("server/concurrency.py", "iterator"): "closing any iterator (a generator has close)",
    ("server/memory.py", "libc"): "glibc functions that other C libraries lack",
    ("server/observe.py", "scope.get('route')"): "the ASGI scope's matched route, if any",
    ("generation/drafts.py", "obj"): "a grammar matcher's optional draft checking",
}


def probes() -> set[tuple[str, str]]:
    """(file, object) of every getattr / hasattr call in the folders above."""
    found = set()
    for folder in FOLDERS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("getattr", "hasattr") and node.args:
                    found.add((path.relative_to(PACKAGE).as_posix(),
                               ast.unparse(node.args[0])))
    return found


def test_no_probes_of_models_sessions_or_chat_formats() -> None:
    unnamed = sorted(probes() - set(ALLOWED))
    assert not unnamed, f"getattr/hasattr probes not named in ALLOWED: {unnamed}"


def test_the_allowed_list_does_not_outlive_its_probes() -> None:
    assert not set(ALLOWED) - probes(), set(ALLOWED) - probes()


def test_the_checker_sees_a_probe(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "m.py").write_text(
        "def f(model):\n    return getattr(model, 'chat_format', None)\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert probes() == {("api/m.py", "model")}
