"""No duck-typing probes anywhere in `src/needlepoint`: code never asks a model, a session, a
part, a checkpoint, a tokenizer or a chat format what it is with `getattr` / `hasattr`
(optional abilities are declared: `ModelCapabilities` / `SessionCapabilities`, the
`LayerRange` part's `stacks` / `kv_windows`, `formats.checkpoints.TensorCheckpoint`'s
`stored_weight`, `formats.chat_format.ChatTokenizer`; a chat format's call syntax is an object,
`generation/syntaxes.py`). An object reading its own fields by name (`getattr(self, name)`)
is not a probe. The calls that remain are named below, each with why it is not such a probe;
a new one fails this test until it is removed or named here."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "needlepoint"

# (file, the probed object as written): why it is allowed
ALLOWED = {
    ("__init__.py", "api"): "the package's lazy names (module __getattr__)",
    ("__init__.py", "gguf_write"): "the package's lazy names (module __getattr__)",
    ("__init__.py", "confidence"): "the package's lazy names (module __getattr__)",
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
    ("cli/chat.py", "sys.stdin"): "a replaced stdin (a StringIO) has no binary buffer",
    ("cli/run.py", "sys.stdin"): "a replaced stdin (a StringIO) has no binary buffer",
    ("cli/common.py", "args"): "argument parsing: argparse namespaces of several commands",
    ("cli/run.py", "args"): "argument parsing: argparse namespaces of several commands",
    ("stages/options.py", "args"): "argument parsing: argparse namespaces of several commands",
    ("formats/cact.py", "mmap"): "MADV_DONTNEED exists on some platforms only",
    ("formats/gguf_reader.py", "mmap"): "MADV_DONTNEED exists on some platforms only",
    ("models/weight_cache.py", "mmap"): "MAP_POPULATE exists on Linux only",
    ("stages/placement.py", "os"): "sched_getaffinity exists on some platforms only",
    ("models/hub.py", "obj"): "argument parsing: a loaded model, or a path to load",
    ("models/transformer/int8_fused.py", "spec"): "a dataclass's fields, by dataclasses.fields",
    ("stages/local.py", "self.stages[stage]"): "a transport call: the stage method it names",
    ("stages/ray_transport.py", "self.stage"): "a transport call: the stage method it names",
    ("stages/ray_transport.py", "error"): "a Ray error's optional cause / preempted fields",
    ("stages/replicas.py", "self.replicas[0]"): "a replica set answers as its first replica",
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
    """(file, object) of every getattr / hasattr call under PACKAGE, but an object's reads
    of its own fields (`getattr(self, ...)`)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr") and node.args:
                probed = ast.unparse(node.args[0])
                if probed != "self":
                    found.add((path.relative_to(PACKAGE).as_posix(), probed))
    return found


def test_no_probes_of_models_sessions_or_chat_formats() -> None:
    unnamed = sorted(probes() - set(ALLOWED))
    assert not unnamed, f"getattr/hasattr probes not named in ALLOWED: {unnamed}"


def test_the_allowed_list_does_not_outlive_its_probes() -> None:
    assert not set(ALLOWED) - probes(), set(ALLOWED) - probes()


def test_the_checker_sees_a_probe_in_any_folder(tmp_path: Path, monkeypatch) -> None:
    for folder in ("api", "models/transformer", "formats"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "m.py").write_text(
            "def f(model):\n    return getattr(model, 'chat_format', None)\n")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "own.py").write_text(
        "class C:\n    def f(self, name):\n        return getattr(self, name)\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert probes() == {("api/m.py", "model"), ("models/transformer/m.py", "model"),
                        ("formats/m.py", "model")}
    assert probes() - set(ALLOWED)  # and the unnamed ones fail the first test
