"""Issue 24, `forget --purge`: the text leaves history too. A real daemon process on a real
socket, a real git repository (and a bare remote it replicates to); every place git keeps
text is searched: `git log -p --all --reflog`, `git grep` over `git rev-list --all`, every
object loose or packed (`cat-file --batch-all-objects`), and every file of the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import DaemonProcess, git, head_contents, make_store, remote_head, wait_for

from clagd.cli import main
from clagd.client import ClientError

SECRET = "9731-SECRET"
PIN = f"The user's PIN is {SECRET}"


def _cli(d: DaemonProcess, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["--store", str(d.root), "--socket", str(d.socket), *args])
    return res.exit_code, res.output


def assert_no_trace(gitdir_or_root: Path, needle: str, files: bool = True) -> None:
    root = gitdir_or_root
    objects = subprocess.run(
        ["git", "-C", str(root), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    assert needle.encode() not in objects, "an object (loose or packed) holds the text"
    revs = git(root, "rev-list", "--all").split()
    grep = subprocess.run(["git", "-C", str(root), "grep", "-q", "-i", needle, *revs])
    assert grep.returncode == 1, "git grep over rev-list --all finds the text"
    log = git(root, "log", "-p", "--all", "--reflog")
    assert needle not in log, "git log -p --all --reflog shows the text"
    if not files:
        return
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                assert needle.encode() not in path.read_bytes(), f"{path} holds the text"


def _bare(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    return path


def _pushed(bare: Path, head: str) -> bool:
    return remote_head(bare) == head


def test_purge_leaves_no_trace_in_history(tmp_path: Path, short_tmp: Path) -> None:
    bare = _bare(tmp_path / "remote.git")
    cfg = {"replication": {"remote": str(bare), "retry_seconds": 1}}
    d = DaemonProcess(make_store(tmp_path / "memory", cfg), short_tmp / "s.sock").start()
    try:
        with d.client() as c:
            c.add_many([{"content": PIN}, {"content": "The user's bank is Nordbank"}])
            c.recluster()  # the PIN now also in a cluster file, in a second commit
            c.add("The user likes green tea")
            assert SECRET in c.query("PIN").context
            pin_id = next(m.id for m in c.query("PIN").memories if SECRET in m.content)
            before = {line.split()[0] for line in git(d.root, "log", "--format=%H").splitlines()}
            wait_for(lambda: _pushed(bare, git(d.root, "rev-parse", "HEAD").strip()), 30, "push")
        # no terminal and no --yes: the warning, and nothing happens
        code, out = _cli(d, "forget", "--match", "pin is 9731", "--purge")
        assert code == 2 and "rewrites the store's git history" in out and "--yes" in out
        assert SECRET in git(d.root, "log", "-p", "--all")
        code, out = _cli(d, "forget", "--match", "pin is 9731", "--purge", "--yes")
        assert code == 0, out
        assert "commit(s) rewritten (old -> new)" in out
        assert "still holds the old history" in out  # no --force-remote: the remote untouched
        after = {line.split()[0] for line in git(d.root, "log", "--format=%H").splitlines()}
        assert before - after, "no commit was rewritten"
        assert_no_trace(d.root, SECRET, files=False)
        assert pin_id not in git(d.root, "log", "--all", "--format=%B")  # nor its id
        # nor a cluster name made of its words, in any commit (the session named the
        # cluster after its members: "PIN" was the forgotten memory's word only)
        assert "pin" not in git(d.root, "log", "-p", "--all", "--", "clusters").lower()
        assert SECRET in git(bare, "log", "-p", "--all")  # the remote keeps it, as said
        with d.client() as c:
            assert SECRET not in c.query("PIN").context
            assert c.status()["head"] == git(d.root, "rev-parse", "HEAD").strip()
            # the daemon writes on the rewritten branch as ever
            c.add("The user's dog is called Rex")
            assert "Rex" in c.query("dog").context
        # with --force-remote the remote gets the rewrite (with a lease)
        _cli(d, "add", "The user's second secret is 5555-SECRET")
        code, out = _cli(
            d, "forget", "--match", "5555-SECRET", "--purge", "--yes", "--force-remote"
        )
        assert code == 0 and f"force-pushed to {bare}" in out, out
        assert "9731" not in git(bare, "log", "-p", "--all")
        assert _pushed(bare, git(d.root, "rev-parse", "HEAD").strip())
        assert d.terminate() == 0  # a clean stop: warm start and statistics saved
        assert_no_trace(d.root, SECRET)  # every file too: warm start, stats, working tree
        assert "The user likes green tea" in head_contents(d.root)
        d.start()  # starts from the warm start saved at the rewritten head
        with d.client() as c:
            assert c.status()["load_source"] == "warmstart"
            assert "green tea" in c.query("tea").context
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()


def test_a_purge_in_one_scope_leaves_another_scopes_memory(tmp_path: Path, short_tmp: Path) -> None:
    d = DaemonProcess(make_store(tmp_path / "memory"), short_tmp / "s.sock").start()
    try:
        with d.client() as c:
            alice = c.add(PIN, scope="alice")["ids"][0]
            c.add(PIN, scope="bob")
            c.recluster()
            res = c.forget(match="pin is 9731", scope="alice", purge=True)
            assert res["forgotten"] == [alice] and res["purge"]["rewritten"]
            assert SECRET in c.query("PIN", scope="bob").context
            assert SECRET not in c.query("PIN", scope="alice").context
        assert head_contents(d.root) == [PIN]  # bob's, in HEAD as it was
        assert git(d.root, "status", "--porcelain") == ""
        log = git(d.root, "log", "-p", "--all", "--reflog")
        assert alice not in log  # alice's id left every blob and message
        assert d.terminate() == 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()


class _Follower(DaemonProcess):
    """`clagd follow REMOTE DIR` as a real subprocess."""

    def __init__(self, remote: str, root: Path, socket_path: Path) -> None:
        super().__init__(root, socket_path)
        self.remote = remote

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "clagd", "--socket", str(self.socket)]
        return [*argv, "follow", self.remote, str(self.root)]


def test_a_follower_follows_a_purge_pushed_with_force_remote(
    tmp_path: Path, short_tmp: Path
) -> None:
    bare = _bare(tmp_path / "remote.git")
    url = f"file://{bare}"
    cfg = {"replication": {"remote": url, "retry_seconds": 1}}
    p = DaemonProcess(make_store(tmp_path / "primary", cfg), short_tmp / "p.sock").start()
    f = _Follower(url, tmp_path / "follower", short_tmp / "f.sock")
    try:
        with p.client() as c:
            c.add(PIN)
            c.add("The user likes green tea")
        wait_for(lambda: _pushed(bare, git(p.root, "rev-parse", "HEAD").strip()), 30, "push")
        f.start()
        with f.client() as c:
            wait_for(lambda: SECRET in c.query("PIN").context, 30, "the follower to serve")
            with pytest.raises(ClientError) as exc:
                c.forget(match="PIN")  # a follower's writes go to the primary
            assert exc.value.code == "read_only"
        with p.client() as c:
            res = c.forget(match="pin is 9731", purge=True, force_remote=True)
            assert res["purge"]["pushed"] == url
        assert SECRET not in git(bare, "log", "-p", "--all")
        with f.client() as c:
            s = c.sync()
            assert s["rewrites"] == 1 and s["head"] == git(p.root, "rev-parse", "HEAD").strip()
            assert SECRET not in c.query("PIN").context
            assert "green tea" in c.query("tea").context
        assert f.terminate() == 0
        assert_no_trace(f.root, SECRET)  # objects, reflogs, warm start, every file
        assert p.terminate() == 0
        assert_no_trace(p.root, SECRET)
    finally:
        for d in (p, f):
            if d.proc is not None and d.proc.poll() is None:
                d.kill()


def test_a_memory_forgotten_before_is_purged_later(tmp_path: Path, short_tmp: Path) -> None:
    d = DaemonProcess(make_store(tmp_path / "memory"), short_tmp / "s.sock").start()
    try:
        with d.client() as c:
            pin = c.add(PIN)["ids"][0]
            c.add("The user likes green tea")
            c.forget(ids=[pin])  # out of HEAD; history still holds it
            assert SECRET in git(d.root, "log", "-p", "--all")
            res = c.forget(ids=[pin], purge=True)
            assert res["forgotten"] == [pin] and res["commit"] is None
            assert res["purge"]["rewritten"]
            with pytest.raises(ClientError) as exc:
                c.forget(ids=["m-0000000000000000"], purge=True)
            assert exc.value.code == "not_found" and "forgotten before" in exc.value.message
            assert "green tea" in c.query("tea").context
        assert_no_trace(d.root, SECRET, files=False)
        assert d.terminate() == 0
        assert_no_trace(d.root, SECRET)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()


def test_a_purge_asks_on_a_terminal_and_writes_wait_for_it(
    tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal `forget --purge` asks first (no: nothing happens; yes: purged), and an
    add sent while history is rewritten waits for it, then commits on the rewritten branch."""
    import threading
    import time
    from types import SimpleNamespace

    from helpers import InProcessDaemon

    import clagd.cli.forgetting as forgetting
    import clagd.engine.purge as engine_purge

    d = InProcessDaemon(make_store(tmp_path / "memory"), short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add(PIN)
            c.add("The user likes green tea")
        tty = SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: True))
        monkeypatch.setattr(forgetting, "sys", tty)
        base = ["--store", str(d.root), "--socket", str(d.socket), "forget"]
        no = CliRunner().invoke(main, [*base, "--match", "pin is 9731", "--purge"], input="n\n")
        assert no.exit_code == 1 and "Rewrite history?" in no.output, no.output
        assert SECRET in git(d.root, "log", "-p", "--all")
        with d.client() as c:
            assert SECRET in c.query("PIN").context  # not even forgotten

        started, times = threading.Event(), {}
        real = engine_purge.rewrite_history

        def slow_rewrite(*args: object) -> object:
            started.set()
            time.sleep(1.0)
            out = real(*args)  # type: ignore[arg-type]
            times["purged"] = time.monotonic()
            return out

        monkeypatch.setattr(engine_purge, "rewrite_history", slow_rewrite)
        answer: dict[str, object] = {}

        def purge() -> None:
            res = CliRunner().invoke(
                main, [*base, "--match", "pin is 9731", "--purge"], input="y\n"
            )
            answer["res"] = res

        t = threading.Thread(target=purge)
        t.start()
        assert started.wait(30)
        with d.client() as c:
            added = c.add("The user's dog is called Rex")
        times["added"] = time.monotonic()
        t.join(60)
        res = answer["res"]
        assert res.exit_code == 0 and "commit(s) rewritten" in res.output, res.output  # type: ignore[attr-defined]
        assert times["purged"] < times["added"]  # the add waited for the rewrite
        assert git(d.root, "rev-parse", "HEAD").strip() == added["commit"]
        assert_no_trace(d.root, SECRET, files=False)
        assert sorted(head_contents(d.root)) == [
            "The user likes green tea",
            "The user's dog is called Rex",
        ]
    finally:
        d.stop()


def test_a_purge_leaves_no_link_naming_the_forgotten_id(tmp_path: Path, short_tmp: Path) -> None:
    """A memory id is a hash of its text: a short one (a PIN) can be found again from it.
    The newer memory that superseded the forgotten one named its id in its metadata, in
    every commit since; after a purge no blob of history holds that id."""
    d = DaemonProcess(make_store(tmp_path / "memory"), short_tmp / "s.sock").start()
    try:
        with d.client() as c:
            old = c.add(PIN)["ids"][0]
            new = c.add("The user's PIN is 5555")
            assert new["supersedes"] == {new["ids"][0]: old}
            c.recluster()
            res = c.forget(ids=[old], purge=True)
            assert res["forgotten"] == [old] and res["purge"]["rewritten"]
            assert "5555" in c.query("PIN").context
        objects = subprocess.run(
            ["git", "-C", str(d.root), "cat-file", "--batch-all-objects", "--batch"],
            capture_output=True,
            check=True,
        ).stdout
        assert old.encode() not in objects, "a blob or message still names the forgotten id"
        assert_no_trace(d.root, SECRET, files=False)
        assert d.terminate() == 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()


def test_force_remote_never_overwrites_a_commit_the_store_never_had(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The lease: when replication.remote holds a commit someone else pushed (not one this
    store had before the purge), --force-remote refuses to push over it, saying so; the
    history here is rewritten all the same, and the remote keeps exactly what it had."""
    bare = _bare(tmp_path / "remote.git")
    cfg = {"replication": {"remote": str(bare), "retry_seconds": 1}}
    d = DaemonProcess(make_store(tmp_path / "memory", cfg), short_tmp / "s.sock").start()
    try:
        with d.client() as c:
            c.add(PIN)
            c.add("The user likes green tea")
        wait_for(lambda: _pushed(bare, git(d.root, "rev-parse", "HEAD").strip()), 30, "push")
        other = tmp_path / "other"
        subprocess.run(["git", "clone", "-q", str(bare), str(other)], check=True)
        (other / "NOTES.md").write_text("someone else's commit\n")
        git(other, "add", "NOTES.md")
        git(other, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "notes")
        git(other, "push", "-q", "origin", "HEAD:main")
        theirs = git(other, "rev-parse", "HEAD").strip()
        with d.client() as c:
            with pytest.raises(ClientError) as refused:
                c.forget(match="pin is 9731", purge=True, force_remote=True)
        assert refused.value.code == "conflict"
        assert theirs[:10] in refused.value.message and "not pushing" in refused.value.message
        assert "forgotten, and history rewritten here" in refused.value.message
        assert _pushed(bare, theirs)  # the remote kept its head
        assert_no_trace(d.root, SECRET, files=False)  # the rewrite here is done
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.kill()
