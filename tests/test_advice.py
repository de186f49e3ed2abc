"""Every message that advises a command names one that works in that situation: each test
drives the situation (a real store, a real daemon on its real socket, the real CLI as a
subprocess), reads the advice, and runs the command it advises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, InProcessDaemon, make_store

from clagd.cli import EXIT_NOT_RUNNING, EXIT_USAGE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def clagd(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "clagd", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """A store under tmp_path/memory, its daemon serving the store's own (default) socket."""
    store = make_store(tmp_path / "memory")
    d = InProcessDaemon(store)
    try:
        yield store
    finally:
        d.stop()


def test_a_socket_with_nothing_there_names_the_daemons_own(served: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-a-") as short:
        nowhere = Path(short) / "x" / "nosock"
        res = clagd("--store", served, "--socket", nowhere, "status")
    assert res.returncode == EXIT_NOT_RUNNING, res.stderr
    msg = res.stderr
    assert "does not answer" not in msg and "kill" not in msg  # the daemon is healthy
    assert f"no clagd daemon answers at {nowhere}" in msg and "leave out --socket" in msg
    own = re.search(r"or use --socket (\S+)$", msg.strip())
    assert own, msg
    # both commands it advises work
    assert clagd("--store", served, "status").returncode == 0
    assert clagd("--store", served, "--socket", own.group(1), "status").returncode == 0


def test_a_parent_of_a_store_asks_did_you_mean(served: Path) -> None:
    parent = served.parent
    res = clagd("--store", parent, "status")
    assert res.returncode == EXIT_USAGE
    assert f"did you mean {served}? (--store {served})" in res.stderr
    assert "init" not in res.stderr
    assert clagd("--store", served, "status").returncode == 0


def test_a_folder_inside_a_store_is_never_advised_init(served: Path) -> None:
    inside = served / "clusters"
    res = clagd("--store", inside, "status")
    assert res.returncode == EXIT_USAGE
    assert f"it is a folder inside the store {served}: use --store {served}" in res.stderr
    assert "init" not in res.stderr
    assert clagd("--store", served, "status").returncode == 0
    # and a store is never made inside one, with or without --force
    for args in (["init", inside], ["init", "--force", inside], ["run", inside]):
        made = clagd(*args)
        assert made.returncode == 1, made.stderr
        assert f"inside the clagd store {served}" in made.stderr
        assert not (inside / ".git").exists() and not (inside / "clagd.yaml").exists()


def test_run_on_a_folder_that_is_not_a_store_advises_a_command_that_exists(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "mine.txt").write_text("my notes\n")
    res = clagd("run", folder)
    assert res.returncode == 1
    assert "use --force" not in res.stderr
    advised = re.search(r"`(clagd init --force [^`]+)`", res.stderr)
    assert advised, res.stderr
    argv = advised.group(1).split()[1:]
    assert argv == ["init", "--force", str(folder)]
    assert clagd(*argv).returncode == 0
    assert clagd("--store", folder, "log").returncode == 0  # a store now (read without daemon)
    assert (folder / "mine.txt").read_text() == "my notes\n"


def test_install_hints_name_extras_of_this_checkout() -> None:
    """clagd is not on the package index: a hint says `pip install '.[extra]'` (from a
    checkout), never `pip install 'clagd[extra]'`, and names an extra that exists."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = set(project["optional-dependencies"])
    files = [*REPO.glob("clagd/**/*.py"), *REPO.glob("docs/*.md"), REPO / "README.md"]
    files += [*REPO.glob("tests/**/*.py")]
    named = set()
    for f in files:
        if f.name == "test_advice.py":
            continue
        text = f.read_text(encoding="utf-8")
        assert "clagd[" not in text, f
        named |= set(re.findall(r"pip install[^'\n]*'\.\[([a-z,]+)\]'", text))
    assert {"mcp", "openai", "embedded"} <= {x for n in named for x in n.split(",")}
    for n in named:
        assert set(n.split(",")) <= extras, n
    from clagd.cli import MCP_HINT

    assert "'.[mcp]'" in MCP_HINT
