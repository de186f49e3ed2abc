"""One test command for everyone: the README's "Tests" block is, command for command, what
`.ci/run` runs after it made its fresh venv. This test parses both and fails when they
disagree, so "the command CI runs" cannot quietly become something else."""

from __future__ import annotations

import re
import shlex
import sys

from helpers import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CI_MARK = "# --- tests ---"
README_MARK = '<!-- ci: the commands of .ci/run after "# --- tests ---" -->'


def commands(text: str) -> list[str]:
    """Shell commands, one per line, without comments and blank lines."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def ci_commands() -> list[str]:
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert CI_MARK in text, f".ci/run lost its {CI_MARK!r} line"
    return commands(text.split(CI_MARK, 1)[1])


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert README_MARK in text, "the README lost its test-command marker"
    block = re.match(r"\s*```bash\n(.*?)\n```", text.split(README_MARK, 1)[1], re.S)
    assert block, "the README's test-command marker is not followed by a bash block"
    return commands(block.group(1))


def test_readme_states_exactly_what_ci_runs() -> None:
    assert readme_commands() == ci_commands()


def test_ci_runs_the_checks_and_every_extra() -> None:
    cmds = ci_commands()
    argvs = [shlex.split(c) for c in cmds]
    assert ["ruff", "check", "clagd", "tests", "benchmarks"] in argvs
    assert ["ruff", "format", "--check", "clagd", "tests", "benchmarks"] in argvs
    assert ["mypy", "clagd"] in argvs
    pytest_cmd = next(a for a in argvs if a[:3] == ["python", "-m", "pytest"])
    assert "-rs" in pytest_cmd  # skipped tests say why
    assert cmds.index(" ".join(pytest_cmd)) == len(cmds) - 1  # the checks run first
    # the portable llama-cpp-python build comes before the extras that need it
    llama = next(i for i, c in enumerate(cmds) if "llama-cpp-python" in c)
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in cmds[llama]
    extras_cmd = next(c for c in cmds if re.search(r"\.\[[a-z,]+\]", c))
    assert llama < cmds.index(extras_cmd)
    installed = set(re.search(r"\.\[([a-z,]+)\]", extras_cmd).group(1).split(","))  # type: ignore[union-attr]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert installed <= set(extras)
    # every extra a test needs is installed (bench is for benchmarks/ only)
    assert set(extras) - {"bench"} <= installed
    assert any(d.startswith("radon") for d in extras["test"])


def test_comparison_catches_a_difference() -> None:
    assert commands("# c\n\npython -m pytest -q -rs\n") == ["python -m pytest -q -rs"]
    assert commands("python -m pytest -q\n") != commands("python -m pytest -q -rs\n")
