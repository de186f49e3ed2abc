"""One writer, always: the store lock lives in .git/ (no cleaning of the working tree
removes it), a deleted socket or inbox is re-created, and the CLI's "not running" is true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import DaemonProcess, git, head_contents, make_store, wait_for


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clagd", "--store", str(store), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_git_clean_cannot_make_two_writers(short_tmp: Path) -> None:
    store = make_store(short_tmp / "m")
    git(store, "commit", "-qm", "settings", "--", "clagd.yaml")
    sock = store / ".clagd" / "clagd.sock"
    p = DaemonProcess(store, sock).start()
    try:
        with p.client() as c:
            c.add("before the clean")
        git(store, "clean", "-fdxq")
        assert not (store / ".clagd").exists()
        second = subprocess.run(
            [sys.executable, "-m", "clagd", "--store", str(store), "run"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert "another clagd daemon" in second.stderr
        assert f"pid {p.proc.pid}" in second.stderr  # type: ignore[union-attr]
        wait_for(p.ready, 15, "the socket to be re-created")
        with p.client() as c:
            assert c.add("after the clean")["added"] == 1
        # the inbox is back and watched
        wait_for(lambda: (store / "inbox" / ".tmp").is_dir(), 15, "the inbox to be re-created")
        tmp = store / "inbox" / ".tmp" / "a.txt"
        tmp.write_text("dropped after the clean")
        os.rename(tmp, store / "inbox" / "a.txt")
        wait_for(lambda: not (store / "inbox" / "a.txt").exists(), 15, "the new inbox to work")
    finally:
        assert p.terminate() == 0
    contents = head_contents(store)
    for text in ("before the clean", "after the clean", "dropped after the clean"):
        assert contents.count(text) == 1


def test_a_deleted_socket_is_recreated_and_the_cli_tells_the_truth(short_tmp: Path) -> None:
    store = make_store(short_tmp / "m")
    sock = store / ".clagd" / "clagd.sock"
    p = DaemonProcess(store, sock).start()
    try:
        sock.unlink()
        r = _cli(store, "status")
        if r.returncode != 0:  # before the daemon re-created it: not "not running"
            assert f"pid {p.proc.pid}" in r.stderr and "is running" in r.stderr  # type: ignore[union-attr]
        wait_for(p.ready, 15, "the socket to be re-created")
        assert _cli(store, "add", "after the socket came back").returncode == 0
    finally:
        assert p.terminate() == 0
    r = _cli(store, "status")
    assert r.returncode == 69 and "not running" in r.stderr and "pid" not in r.stderr


def test_lock_is_under_git(short_tmp: Path) -> None:
    store = make_store(short_tmp / "m")
    p = DaemonProcess(store, short_tmp / "s.sock").start()
    try:
        assert (store / ".git" / "clagd.lock").read_text().strip() == str(p.proc.pid)  # type: ignore[union-attr]
    finally:
        p.terminate()
