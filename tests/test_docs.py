"""The docs name only files and modules that exist. Scanned: README.md, docs/*.md (not
docs/history/, which records the past), CHANGELOG.md's "Unreleased" section and the comments
of .ci/run. Checked in them: repository paths (`clagd/...`, `tests/...`, `benchmarks/...`,
`docs/...`, `examples/...`, `systemd/...`, a test as `tests/x.py::test_name` too), module
files named from inside the package (`store/writer.py`), and dotted modules (`clagd.x.y`,
`python -m clagd.x`; a name after the module must be defined at its top level).

A path inside another one (`~/.local/share/clagd/...`, `.clagd/gate/`) is not the
repository's. A dotted name ending like a file (`clagd.yaml`, `clagd.sock`, the unit
`clagd.service`) is a file name, unless it follows `python -m`. A name right after "former",
"formerly", "old", "was", "removed" or "deleted" (a changelog saying what moved) is exempt."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "clagd"
TOP_DIRS = ("clagd", "tests", "benchmarks", "docs", "examples", "systemd")
# A path starts at a word boundary that is not inside another path, a home or a dot-folder.
PATH_RE = re.compile(
    r"(?<![\w./~$%@-])((?:" + "|".join(TOP_DIRS) + r")/[\w.@/-]*[\w@/])(?:::(\w+))?"
)
MODULE_FILE_RE = re.compile(r"(?<![\w./~$%@-])([a-z_]+/[\w/]*\w\.py)\b")
DOTTED_RE = re.compile(r"(?<![\w./~$%@-])(python3? -m )?(clagd(?:\.\w+)+)")
FILE_SUFFIXES = {
    "yaml", "yml", "json", "toml", "sock", "lock", "log", "conf", "service", "socket",
    "branch", "pickle", "txt", "md", "py",
}  # fmt: skip
EXEMPT_RE = re.compile(r"\b(?:former|formerly|old|was|removed|deleted)\s+`?$", re.I)


@dataclass(frozen=True)
class Line:
    doc: str
    number: int
    text: str


def _lines(rel: str, start: int = 0, stop: int | None = None) -> list[Line]:
    text = (REPO / rel).read_text(encoding="utf-8").splitlines()
    return [Line(rel, i + 1, t) for i, t in enumerate(text[start:stop], start)]


def _changelog_unreleased() -> list[Line]:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
    heads = [i for i, t in enumerate(text) if t.startswith("## ")]
    assert heads and text[heads[0]] == "## Unreleased", "CHANGELOG.md starts with ## Unreleased"
    return _lines("CHANGELOG.md", heads[0], heads[1] if len(heads) > 1 else None)


def _ci_comments() -> list[Line]:
    out = []
    for line in _lines(".ci/run"):
        if line.text.lstrip().startswith("#"):
            out.append(line)
        elif " # " in line.text:
            out.append(Line(line.doc, line.number, line.text.split(" # ", 1)[1]))
    return out


def scanned_lines() -> list[Line]:
    docs = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
    out = _lines("README.md") + _changelog_unreleased() + _ci_comments()
    for rel in docs:
        out += _lines(rel)
    return out


def _exempt(text: str, start: int) -> bool:
    return bool(EXEMPT_RE.search(text[:start]))


@cache
def _top_names(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _module_path(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_module(dotted: str, run: bool) -> str | None:
    """Why `dotted` names nothing, or None. `run`: it follows `python -m`."""
    parts = dotted.split(".")
    if not run and parts[-1] in FILE_SUFFIXES:
        return None
    for cut in range(len(parts), 1, -1):
        path = _module_path(parts[:cut])
        if path is None:
            continue
        if cut == len(parts):
            if run and path.name == "__init__.py" and not (path.parent / "__main__.py").is_file():
                return f"package {'.'.join(parts)} has no __main__.py"
            return None
        if run:
            return f"no module {dotted}"
        if parts[cut] in _top_names(path):
            return None
        return f"{'.'.join(parts[:cut])} defines no {parts[cut]}"
    return f"no module {'.'.join(parts[:2])}"


def _test_defined(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(tree))


def _path_problems(line: Line) -> list[str]:
    out = []
    for m in PATH_RE.finditer(line.text):
        if _exempt(line.text, m.start()):
            continue
        rel, test = m.group(1), m.group(2)
        path = REPO / rel
        if not path.exists():
            out.append(f"{rel}: no such file or folder")
        elif test and path.suffix == ".py" and not _test_defined(path, test):
            out.append(f"{rel}::{test}: no such test in {rel}")
    return out


def _module_file_problems(line: Line) -> list[str]:
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    out = []
    for m in MODULE_FILE_RE.finditer(line.text):
        rel = m.group(1)
        if rel.split("/")[0] not in subpackages or _exempt(line.text, m.start()):
            continue
        if not (PACKAGE / rel).is_file():
            out.append(f"{rel}: no such module in clagd/")
    return out


def _dotted_problems(line: Line) -> list[str]:
    out = []
    for m in DOTTED_RE.finditer(line.text):
        if _exempt(line.text, m.start()):
            continue
        why = missing_module(m.group(2).rstrip("."), run=bool(m.group(1)))
        if why:
            out.append(f"{m.group(0)}: {why}")
    return out


def problems(lines: list[Line]) -> list[str]:
    out = []
    for line in lines:
        for what in _path_problems(line) + _module_file_problems(line) + _dotted_problems(line):
            out.append(f"{line.doc}:{line.number}: {what}")
    return out


def test_docs_name_only_files_and_modules_that_exist() -> None:
    found = problems(scanned_lines())
    assert not found, "docs name what does not exist (doc:line: name):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `tests/test_gone.py`", ["tests/test_gone.py: no such file or folder"]),
        ("`tests/test_docs.py::test_nothing_here`", ["no such test"]),
        ("`tests/test_docs.py::test_docs_name_only_files_and_modules_that_exist`", []),
        ("`store/gone.py` does it", ["store/gone.py: no such module in clagd/"]),
        ("`store/writer.py`, `~/.local/share/clagd/memory`, `.clagd/gate/`", []),
        ("run `python -m clagd.service`", ["no module clagd.service"]),
        ("the unit `clagd.service`, the file `clagd.yaml`", []),
        ("`clagd.text.tokenize` and `clagd.text.no_such_name`", ["defines no no_such_name"]),
        ("`python -m clagd.serve.units --write-static systemd`", []),
        ("the former `clagd/retrieval/gone.py` is cut", []),
    ],
)
def test_the_scanner_itself(text: str, expected: list[str]) -> None:
    found = problems([Line("doc.md", 7, text)])
    assert len(found) == len(expected), found
    for got, want in zip(found, expected):
        assert got.startswith("doc.md:7: ") and want in got
