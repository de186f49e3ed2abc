"""The "Get, list, filter and conversations" sections of README.md and docs/quickstart.md
run as written, block by block, in one shell with `clagd` on PATH, against a real daemon
on its real socket; then what they did is checked: the filtered query kept to its
memories, the conversation's user turns are memories with `role` and `speaker`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, DaemonProcess, wait_for

from clagd.client import Client

SECTION = "## Get, list, filter and conversations"


def section_blocks(doc: Path) -> list[tuple[str, str]]:
    """(language, code) of the bash and python blocks of SECTION in `doc`."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    part = text[start : end if end >= 0 else len(text)]
    found = re.finditer(r"```(\w*)\n(.*?)\n```", part, re.S)
    return [(m.group(1), m.group(2)) for m in found if m.group(1) in ("bash", "python")]


@pytest.fixture
def shell_env(daemon_proc: DaemonProcess, tmp_path: Path) -> Iterator[dict[str, str]]:
    daemon_proc.start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "clagd"  # what `pip install` puts on PATH, for this checkout
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m clagd "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    env.update(
        PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(REPO),
        CLAGD_STORE=str(daemon_proc.root),
        CLAGD_SOCKET=str(daemon_proc.socket),
    )
    yield env


def run_blocks(doc: Path, env: dict[str, str], cwd: Path) -> list[str]:
    outs = []
    for lang, code in section_blocks(doc):
        argv = ["bash", "-e", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{doc.name}: {lang} block failed:\n{code}\n{proc.stderr}"
        outs.append(proc.stdout)
    return outs


def test_the_readme_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    first, turns = run_blocks(REPO / "README.md", shell_env, daemon_proc.root.parent)
    shown = [line.split("] ", 1)[1] for line in first.splitlines() if line.startswith("[Memory")]
    assert shown == ["The user wants a window seat"]  # not the web note on window cleaning
    assert first.rstrip().endswith("The user wants a window seat")  # what `clagd get` printed
    assert "source=chat" in first and "task_type=travel" in first
    with Client(daemon_proc.socket) as c:
        wait_for(
            lambda: c.list_memories(where={"role": "user"}).total == 2, 30, "the chat.jsonl file"
        )
        said = {m.content: m.metadata for m in c.list_memories(where={"role": "user"}).memories}
        assert said == {
            "I am flying to Lisbon in May": {"role": "user", "speaker": "user"},
            "Window, always": {"role": "user", "speaker": "alice"},
        }
        assert c.list_memories(where={"role": "assistant"}).total == 0  # off by default


def test_the_quickstart_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    store = daemon_proc.root
    # the Python block opens "./memory": run it from the store's parent folder
    (store.parent / "memory").exists() or (store.parent / "memory").symlink_to(store)
    (out,) = run_blocks(REPO / "docs" / "quickstart.md", shell_env, store.parent)
    lines = out.splitlines()
    # two user turns of one second (no created_at): newest first, ties by id
    assert sorted(lines[:2]) == [
        "carol said: I love the tiles and the river",
        "carol said: I moved to Porto last year",
    ]
    assert lines[2:] == ["I moved to Porto last year"]  # the filtered query, then `get`
