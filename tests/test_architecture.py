"""The layers of clagd stay honest: which package may import which, and how big a function
may grow. Read from the source with `ast`, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from radon.complexity import cc_visit

PACKAGE = Path(__file__).resolve().parents[1] / "clagd"

CORE = {
    "errors",
    "config",
    "config_checks",
    "model",
    "scopes",
    "change",
    "text",
    "yamlio",
    "protocol",
    "replies",
    "libc",
}
# What each layer may import besides itself and the core modules.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "store": set(),
    "slm": set(),
    "retrieval": {"slm"},
    "ingest": {"store", "retrieval"},
    "organize": {"store", "slm", "retrieval"},
    "engine": {"store", "slm", "retrieval", "ingest", "organize"},
    "serve": {"store", "slm", "retrieval", "ingest", "organize", "engine"},
    "eval": {"store", "slm", "retrieval", "ingest", "organize", "engine", "serve", "client"},
    "client": set(),
}
TOP_EDGES = {"cli", "mcp_server", "__main__", "__init__"}  # the outer edge may import anything
EDGE_PACKAGES = {"cli"}  # and so may every module of these packages (clagd/cli/)
MAX_LINES = 80
MAX_MODULE_LINES = 700  # a module past this does more than one job: cut it by job
MAX_COMPLEXITY = 25


def _layer(module: str) -> str:
    """`clagd.store.writer` -> "store"; a core module -> "core"; the edges by their name."""
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    head = parts[1]
    if head in CORE:
        return "core"
    return head


def _source_files() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("clagd"):
            found.add(node.module)
            for alias in node.names:  # `from clagd import cli` imports a module too
                if node.module == "clagd":
                    found.add(f"clagd.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("clagd"))
    return found


def test_every_subpackage_explains_itself():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 20, f"{init} needs a one-paragraph docstring"


def test_no_relative_imports():
    for module, path in _source_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{module}: use absolute imports (`from clagd.x import`)"


@pytest.mark.parametrize("module,path", _source_files(), ids=lambda v: str(v))
def test_layer_boundaries(module: str, path: Path):
    if module.split(".")[-1] in TOP_EDGES and module.count(".") <= 1:
        return
    if _layer(module) in EDGE_PACKAGES:
        return
    mine = _layer(module)
    if module == "clagd.client":
        mine = "client"
    allowed = ALLOWED[mine] | {mine, "core"}
    for target in sorted(_imports(path)):
        if target == "clagd":
            continue
        theirs = "client" if target == "clagd.client" else _layer(target)
        assert theirs in allowed, f"{module} ({mine}) must not import {target} ({theirs})"


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_long_functions():
    long = []
    for module, path in _source_files():
        for fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            lines = fn.end_lineno - fn.lineno + 1  # type: ignore[operator]
            if lines > MAX_LINES:
                long.append(f"{module}.{fn.name}: {lines} lines")
    assert not long, "cut these into named steps:\n" + "\n".join(long)


def test_no_tangled_functions():
    tangled = []
    for module, path in _source_files():
        for block in cc_visit(path.read_text(encoding="utf-8")):
            items = [block, *getattr(block, "methods", [])]
            for item in items:
                if item.complexity > MAX_COMPLEXITY:
                    tangled.append(f"{module}.{item.fullname}: cyclomatic {item.complexity}")
    assert not tangled, "split these:\n" + "\n".join(tangled)


def test_no_long_modules():
    long = []
    for module, path in _source_files():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{module}: {lines} lines")
    assert not long, f"over {MAX_MODULE_LINES} lines, cut these by job:\n" + "\n".join(long)
