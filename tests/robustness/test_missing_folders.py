"""The folders the daemon needs (`clusters/`, `unsorted/`, `archive/`, `inbox/`,
`inbox/rejected/`) are made again before a write needs them: removed by hand (`rm -rf`) or
by a committed `git rm -r`, under a stream of adds, no write answers `internal` with a raw
exception, and every add acknowledged after the removal is in HEAD exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git, head_contents, wait_for

from clagd.client import ClientError
from clagd.store.files import load_state


def _adds_under_load(daemon: InProcessDaemon, remove: threading.Event, done: threading.Event):
    """Adds one memory after another until `done`; each answer with whether it began after
    `remove` was set (the removal had finished)."""
    answers: list[tuple[str, str, bool]] = []

    def run() -> None:
        with daemon.client() as c:
            i = 0
            while not done.is_set():
                after = remove.is_set()
                text = f"memory {i} written while a folder goes away"
                try:
                    c.add(text)
                    answers.append((text, "ok", after))
                except ClientError as exc:
                    answers.append((text, f"{exc.code}: {exc}", after))
                i += 1

    t = threading.Thread(target=run)
    t.start()
    return t, answers


def _persons_git_rm(root: Path, folder: str) -> None:
    """`git rm -r -f <folder>` and a commit, as a person does it while the daemon writes:
    again when the daemon's own git held the index lock at that instant."""
    for _ in range(50):
        try:
            git(root, "rm", "-r", "-q", "-f", "--ignore-unmatch", folder)
            git(root, "commit", "-q", "--allow-empty", "-m", f"remove {folder}")
            break
        except subprocess.CalledProcessError as exc:
            assert "index.lock" in exc.stderr or "cannot lock ref" in exc.stderr, exc.stderr
            time.sleep(0.05)
    shutil.rmtree(root / folder, ignore_errors=True)


@pytest.mark.parametrize("how", ["rm", "git-rm"])
@pytest.mark.parametrize("folder", ["clusters", "unsorted", "archive"])
def test_a_removed_memory_folder_is_made_again_under_load(
    daemon: InProcessDaemon, folder: str, how: str
) -> None:
    root = daemon.root
    with daemon.client() as c:
        for i in range(6):
            c.add_many([{"content": f"espresso grinder burr {i} {k}"} for k in range(3)])
        c.recluster()
        assert any((root / "clusters").glob("*.yaml"))
    removed, done = threading.Event(), threading.Event()
    t, answers = _adds_under_load(daemon, removed, done)
    try:
        wait_for(lambda: len(answers) >= 5, 20, "adds to run")
        if how == "rm":
            shutil.rmtree(root / folder, ignore_errors=True)
        else:
            _persons_git_rm(root, folder)
        removed.set()
        n = len(answers)
        wait_for(lambda: len(answers) >= n + 10, 30, "adds after the removal")
    finally:
        done.set()
        t.join(30)
    internal = [a for a in answers if "internal" in a[1] or "FileNotFoundError" in a[1]]
    assert not internal, internal[:3]
    later = [text for text, code, after in answers if after and code == "ok"]
    assert len(later) >= 5, answers[-12:]
    in_head = Counter(head_contents(root))
    assert all(in_head[text] == 1 for text in later), [x for x in later if in_head[x] != 1]
    assert (root / folder).is_dir()
    with daemon.client() as c:
        assert c.add("and one more")["added"] == 1
    eng = daemon.engine
    wait_for(lambda: eng.state.memory_ids() == load_state(root).memory_ids(), 10, "served=HEAD")


@pytest.mark.parametrize("folder", ["inbox", "inbox/rejected"])
def test_a_removed_inbox_folder_is_made_again(daemon: InProcessDaemon, folder: str) -> None:
    root = daemon.root
    with daemon.client() as c:
        shutil.rmtree(root / folder)
        wait_for(lambda: (root / "inbox").is_dir(), 20, "housekeeping to make the inbox again")
        good, bad = root / "inbox" / "good.txt", root / "inbox" / "bad.json"
        good.write_text("a memory dropped after the folder went away\n")
        bad.write_text("{not json")
        wait_for(lambda: not good.exists() and not bad.exists(), 20, "both files taken")
        assert "a memory dropped after the folder went away" in head_contents(root)
        assert (root / "inbox" / "rejected" / "bad.json").is_file()
        assert (root / "inbox" / "rejected" / "bad.json.error").is_file()
        assert c.status()["inbox"]["loop_errors"] == 0
    assert not any(name.endswith(".tmp") for name in os.listdir(root / "unsorted"))
