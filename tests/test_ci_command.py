"""One test command for everyone: `./test` installs what the tests need and runs lint,
types and pytest; `.ci/run` makes a fresh venv and calls exactly that, and the README's
"Tests" block is that one command. This test reads the three and fails when they disagree,
so "the command CI runs" cannot quietly become something else."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from helpers import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CI_MARK = "# --- tests ---"
README_MARK = "<!-- ci: the test command, what .ci/run runs -->"
TEST = REPO / "test"


def commands(text: str) -> list[str]:
    """Shell commands, one per line, without comments and blank lines."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def ci_parts() -> tuple[list[str], list[str]]:
    """.ci/run's commands before and after its marker line."""
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert CI_MARK in text, f".ci/run lost its {CI_MARK!r} line"
    before, after = text.split(CI_MARK, 1)
    return commands(before), commands(after)


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert README_MARK in text, "the README lost its test-command marker"
    block = re.match(r"\s*```bash\n(.*?)\n```", text.split(README_MARK, 1)[1], re.S)
    assert block, "the README's test-command marker is not followed by a bash block"
    return commands(block.group(1))


def test_ci_and_readme_run_exactly_the_test_command() -> None:
    before, after = ci_parts()
    assert after == ["./test"]
    assert readme_commands() == ["./test"]
    # CI makes its own venv on a fresh clone first, and the command is executable
    assert "python3 -m venv .venv" in before and ". .venv/bin/activate" in before
    assert os.access(TEST, os.X_OK)
    subprocess.run(["bash", "-n", str(TEST)], check=True)  # it parses


def test_the_test_command_runs_the_checks_and_every_extra() -> None:
    cmds = commands(TEST.read_text(encoding="utf-8"))
    argvs = [shlex.split(c) for c in cmds]
    assert ["ruff", "check", "clagd", "tests", "benchmarks"] in argvs
    assert ["ruff", "format", "--check", "clagd", "tests", "benchmarks"] in argvs
    assert ["mypy", "clagd"] in argvs
    pytest_cmd = next(a for a in argvs if a[:3] == ["python", "-m", "pytest"])
    assert "-rs" in pytest_cmd  # skipped tests say why
    assert argvs.index(pytest_cmd) == len(argvs) - 1  # the checks run first
    # the portable llama-cpp-python build comes before the extras that need it
    llama = next(i for i, c in enumerate(cmds) if "llama-cpp-python" in c)
    assert cmds[llama].startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF" python -m pip install')
    install = next(i for i, c in enumerate(cmds) if c.startswith('python -m pip install -q ".['))
    assert llama < install
    full, *lighter = re.findall(r'^\s*extras="([a-z,]+)"', TEST.read_text(), re.M)
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert set(full.split(",")) <= set(extras)
    assert set(extras) - {"bench"} == set(full.split(","))  # bench is for benchmarks/ only
    # --no-embedded: the same without the embedded model (its tests skip, saying so)
    assert [set(x.split(",")) for x in lighter] == [set(full.split(",")) - {"embedded"}]
    assert any(d.startswith("radon") for d in extras["test"])


def test_comparison_catches_a_difference() -> None:
    assert commands("# c\n\n./test\n") == ["./test"]
    assert commands("./test --no-embedded\n") != ["./test"]
