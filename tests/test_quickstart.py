"""docs/quickstart.md runs as written: every `bash` and `python` block, in order, in one
empty folder, against the real daemon the first block starts (backend `none`), with `clagd`
on PATH. The MCP block drives `clagd mcp` through the official SDK client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, wait_for

from clagd.client import Client

DOC = REPO / "docs" / "quickstart.md"


# the sections that run on a store of their own: tests/test_docs_scopes.py (two users'
# scopes) and tests/test_docs_getlist.py (get, list, filter and conversations)
SCOPES_SECTION = "## Scopes, updates and forgetting"
GETLIST_SECTION = "## Get, list, filter and conversations"


def blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order, but those of the sections that
    run on their own (SCOPES_SECTION, GETLIST_SECTION)."""
    text = DOC.read_text(encoding="utf-8")
    for section in (SCOPES_SECTION, GETLIST_SECTION):
        text = without_section(text, section)
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)\n```", text, re.S)]


def without_section(text: str, heading: str) -> str:
    """`text` without the section that starts at `heading` (up to the next `## `)."""
    start = text.find(f"\n{heading}\n")
    if start < 0:
        return text
    end = text.find("\n## ", start + 1)
    return text[:start] + (text[end:] if end >= 0 else "")


def runnable() -> list[tuple[str, str]]:
    return [(lang, code) for lang, code in blocks() if lang in ("bash", "python")]


class Shell:
    """The reader's shell: one folder, `clagd` on PATH, CLAGD_STORE exported."""

    def __init__(self, work: Path) -> None:
        self.work = work
        bin_dir = work.parent / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "clagd"  # what `pip install` puts on PATH, for this checkout
        shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m clagd "$@"\n')
        shim.chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
        self.env.update(
            PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=str(REPO),
            CLAGD_STORE=str(work / "memory"),  # the first block exports it
            CLAGD_BACKEND="none",  # no model: deterministic and fast
        )
        self.daemon_group: int | None = None

    def start(self, code: str) -> str:
        """The first block: it leaves the daemon running in the background (same process
        group as the shell, which the test owns and stops at the end)."""
        proc = subprocess.Popen(
            ["bash", "-e", "-c", code],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.daemon_group = proc.pid
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{out}\n{self.daemon_log()}"
        return out

    def run(self, lang: str, code: str) -> str:
        argv = ["bash", "-e", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(
            argv, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, (
            f"{lang} block failed:\n{code}\n{proc.stdout}\n{proc.stderr}\n{self.daemon_log()}"
        )
        return proc.stdout

    def daemon_log(self) -> str:
        log = self.work / "clagd.log"
        return log.read_text() if log.exists() else "(no clagd.log)"

    def stop(self) -> None:
        if self.daemon_group is None:
            return
        try:
            os.killpg(self.daemon_group, signal.SIGTERM)
        except ProcessLookupError:
            return

        def gone() -> bool:
            try:
                os.killpg(self.daemon_group, 0)  # type: ignore[arg-type]
            except ProcessLookupError:
                return True
            return False

        try:
            wait_for(gone, 60, "the daemon to stop")
        except AssertionError:
            os.killpg(self.daemon_group, signal.SIGKILL)
            raise


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    pytest.importorskip("mcp", reason="the quickstart's MCP block needs pip install '.[mcp]'")
    work = tmp_path / "agent"
    work.mkdir()
    sh = Shell(work)
    yield sh
    sh.stop()


def memory_count(store: Path) -> int:
    with Client.for_store(store, timeout=10) as c:
        return int(c.status()["counts"]["memories"])


def test_quickstart_blocks_run_as_written(shell: Shell) -> None:
    code = runnable()
    langs = [lang for lang, _ in code]
    # start; inbox; add; client add; CLI query; client query; MCP; history
    assert langs == ["bash", "bash", "bash", "python", "bash", "python", "python", "bash"]
    store = shell.work / "memory"

    out = shell.start(code[0][1])
    assert f"store      {store}" in out  # `clagd status` answered

    shell.run(*code[1])  # the inbox file: two memories, read by the daemon's own watcher
    wait_for(lambda: memory_count(store) == 2, 30, "the inbox file to be ingested")
    assert not (store / "inbox" / "session-42.yaml").exists()

    out = shell.run(*code[2])  # clagd add, twice
    assert len(re.findall(r"^added m-[0-9a-f]{16} \([0-9a-f]{10}\)$", out, re.M)) == 2
    out = shell.run(*code[3])  # the Python client's add and add_many
    assert re.fullmatch(r"\['m-[0-9a-f]{16}'\]\n", out)
    assert memory_count(store) == 7

    out = shell.run(*code[4])  # clagd query, text then --json
    text, _, js = out.partition("{")
    assert "The user is allergic to penicillin" in text
    assert '"The user runs every Sunday morning"' in js and '"tokens"' in js

    out = shell.run(*code[5])  # the client's query
    assert "The user prefers answers in French" in out
    assert re.search(r"^\d+ tokens of memory in the prompt$", out, re.M)

    out = shell.run(*code[6])  # MCP: remember, then recall through `clagd mcp`
    assert "The user's cat is called Miso" in out
    assert memory_count(store) == 8

    out = shell.run(*code[7])  # history: clagd log and git
    lines = out.splitlines()
    assert len(lines) == 10 and all(" ingest: " in ln for ln in lines), out
    assert "ingest: 2 memories from inbox" not in out  # the five newest came after it

    warnings = [ln for ln in shell.daemon_log().splitlines() if " WARNING " in ln]
    assert warnings == [], shell.daemon_log()  # normal work logs no warnings
