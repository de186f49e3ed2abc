"""`git replace` and grafts never shape a commit of the daemon's, and a person's staged
changes pause every write (sessions, archive, route passes, reverts) as they pause `add`."""

from __future__ import annotations

import os
import shutil
import stat
from collections import Counter
from pathlib import Path

import pytest
from helpers import DaemonProcess, InProcessDaemon, git, head_contents, idle, wait_for

from clagd.client import ClientError
from clagd.store.files import load_state

TOPICS = ["espresso grinder burr", "marathon training tempo", "tax return deadline"]


def _add_24(c) -> list[str]:
    texts = []
    for i in range(12):
        pair = [f"{TOPICS[i % 3]} note {i} {k}" for k in range(2)]
        c.add_many([{"content": t} for t in pair])
        texts += pair
    return texts


def test_a_replaced_tip_does_not_shape_a_session_commit(daemon: InProcessDaemon) -> None:
    """Finding 2: 24 acknowledged memories, `git replace <tip> <an older commit>`, one
    recluster, the replacement removed. Before: HEAD held 12 of 24 (the session's commit
    was built on the older commit's tree through the replacement), nothing was reported.
    Now every memory is in HEAD exactly once and nothing was removed."""
    root = daemon.root
    with daemon.client() as c:
        texts = _add_24(c)
        tip = git(root, "rev-parse", "HEAD").strip()
        older = git(root, "rev-parse", "HEAD~6").strip()
        git(root, "replace", tip, older)
        # the person's git sees the older tree now; the daemon must not
        assert len(head_contents(root)) < 24
        out = c.recluster()
        assert out["status"] == "accepted", out
        git(root, "replace", "-d", tip)
        in_head = Counter(head_contents(root))
        assert in_head == Counter(texts), (len(in_head), in_head)
        st = c.status()
        assert st["history"]["memories_removed"] == 0
        assert st["counts"]["memories"] == 24
    fresh = load_state(root)
    assert daemon.engine.state.memory_ids() == fresh.memory_ids()


def test_grafts_do_not_shape_what_the_daemon_reads(daemon: InProcessDaemon) -> None:
    """A graft file making the tip a root commit: the daemon still sees the real history
    (a graft is ignored), so an add and a recluster keep every memory."""
    root = daemon.root
    with daemon.client() as c:
        texts = _add_24(c)
        tip = git(root, "rev-parse", "HEAD").strip()
        (root / ".git" / "info").mkdir(exist_ok=True)
        (root / ".git" / "info" / "grafts").write_text(f"{tip}\n")
        c.add("after the graft")
        assert c.recluster()["status"] in ("accepted", "noop")
        (root / ".git" / "info" / "grafts").unlink()
        assert Counter(head_contents(root)) == Counter([*texts, "after the graft"])
        assert c.status()["history"]["memories_removed"] == 0


def test_every_git_command_the_daemon_runs_ignores_replacements(
    store: Path, short_tmp: Path, tmp_path: Path
) -> None:
    """A `git` on PATH that records its environment: every git command of a real daemon
    (adds, a session, archive, a revert, status, log, shutdown) runs with
    GIT_NO_REPLACE_OBJECTS=1 and no graft file."""
    real = shutil.which("git")
    assert real
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "git-calls.log"
    wrapper = bindir / "git"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'printf "%s|%s|%s\\n" "$GIT_NO_REPLACE_OBJECTS" "$GIT_GRAFT_FILE" "$1" >> {record}\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    p = DaemonProcess(store, short_tmp / "s.sock", env=env).start()
    try:
        with p.client() as c:
            _add_24(c)
            assert c.recluster()["status"] in ("accepted", "noop")
            c.archive()
            c.archive(dry_run=True)
            c.add("one more")
            c.revert(git(store, "rev-parse", "HEAD").strip())
            c.status()
            c.log()
        assert p.terminate() == 0
    finally:
        if p.proc is not None and p.proc.poll() is None:
            p.kill()
    # GitPython's own `git version` (its check of the executable) reads no object
    calls = [c for c in record.read_text().splitlines() if c != "||version"]
    assert len(calls) > 30, calls
    bad = [line for line in calls if not line.startswith("1|/dev/null/no-grafts|")]
    assert not bad, bad[:10]


@pytest.mark.parametrize("op", ["recluster", "archive", "revert"])
def test_staged_changes_pause_sessions_archive_and_reverts(
    daemon: InProcessDaemon, op: str
) -> None:
    """A memory file the person staged (not committed): a session, an archive and a revert
    answer `paused` naming it, exactly as `add` does, and commit nothing."""
    root = daemon.root
    with daemon.client() as c:
        _add_24(c)
        # the daemon's own organizing of the 24 (a triggered session, a route pass) is over
        # before the person stages: an edit staged while an operation commits is a race of
        # its own, not what this test is about (on a loaded machine the session came late)
        wait_for(lambda: idle(c.status()), 30, "the session and route pass after the adds")
        head = git(root, "rev-parse", "HEAD").strip()
        shard = sorted([*(root / "unsorted").glob("*.yaml"), *(root / "clusters").glob("*.yaml")])[
            0
        ]
        # staged first, then written: a daemon that saw the file change before a `git add`
        # took it in as an outside edit (a commit of its own, correctly), and nothing stayed
        # staged; this way the index holds the person's change before the file shows it
        edited = root.parent / "edited.yaml"  # outside the store: no event until the rename
        edited.write_text(shard.read_text() + "# edited by hand\n")
        blob = git(root, "hash-object", "-w", str(edited)).strip()
        rel = str(shard.relative_to(root))
        git(root, "update-index", "--cacheinfo", f"100644,{blob},{rel}")
        os.replace(edited, shard)
        with pytest.raises(ClientError) as err:
            if op == "recluster":
                c.recluster()
            elif op == "archive":
                c.archive()
            else:
                c.revert(head)
        assert err.value.code == "paused", err.value
        assert "staged" in str(err.value) and shard.name in str(err.value)
        with pytest.raises(ClientError) as err:
            c.add("an add pauses the same way")
        assert err.value.code == "paused"
        assert git(root, "rev-parse", "HEAD").strip() == head
        git(root, "reset", "-q", "--hard")
        assert c.add("resumed")["added"] == 1
