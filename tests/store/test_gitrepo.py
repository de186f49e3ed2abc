"""A failed git command leaves the store as clagd's own error (`errors.GitFailed`, a
StoreError): git's reason in one line, never its argv, up to the socket and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git

from clagd.client import ClientError
from clagd.errors import GitFailed, StoreError
from clagd.store.gitrepo import GitStore


def test_a_failed_git_command_raises_a_store_error_with_git_s_reason(store: Path) -> None:
    gs = GitStore(store)
    with pytest.raises(GitFailed) as err:
        gs.run("log", "-n1", "no-such-revision")
    assert isinstance(err.value, StoreError) and err.value.code == "store"
    message = str(err.value)
    assert message.startswith("git log: ") and "no-such-revision" in message
    assert "\n" not in message and "user.email" not in message  # git's reason, not its argv
    assert "unknown revision" in err.value.stderr and err.value.status == 128


def test_a_broken_repository_reaches_the_socket_and_the_cli_as_one_clear_line(
    daemon: InProcessDaemon,
) -> None:
    """The commit HEAD names is unreadable (a disk error took its object): `log` answers
    the domain error `store` with git's reason, over the socket and from the CLI, and the
    daemon goes on once the object is back."""
    root = daemon.root
    head = git(root, "rev-parse", "HEAD").strip()
    obj = root / ".git" / "objects" / head[:2] / head[2:]
    assert obj.is_file(), "the daemon's commits are loose objects (gc.auto = 0)"
    data = obj.read_bytes()
    obj.unlink()
    try:
        with daemon.client() as c:
            with pytest.raises(ClientError) as err:
                c.log(5)
        assert err.value.code == "store"
        assert str(err.value) == "git log: fatal: bad object HEAD"
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        r = subprocess.run(
            [sys.executable, "-m", "clagd", "--socket", str(daemon.socket), "log"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert lines == ["clagd: git log: fatal: bad object HEAD"], r.stderr
    finally:
        obj.write_bytes(data)
    with daemon.client() as c:
        assert c.log(5)["entries"][0]["commit"] == head


def test_the_scratch_index_is_kept_only_while_it_holds_the_base_s_tree(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit on the daemon's own last commit builds its tree in the scratch index as that
    commit left it (no `read-tree` of the whole store); a base with another tree (a person's
    commit) or a scratch index changed by anyone else is read from the base again. Every
    commit's tree is the base's tree with exactly the committed paths changed."""
    gs = GitStore(store)
    calls: list[str] = []
    real_run = GitStore.run

    def run(self: GitStore, *args: str, **kw: object) -> str:
        calls.append(next(a for a in args if not a.startswith("-") and "=" not in a))
        return real_run(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(GitStore, "run", run)

    def commit(name: str, text: str) -> str | None:
        (store / "unsorted" / name).write_text(text)
        calls.clear()
        sha = gs.commit([f"unsorted/{name}"], f"write {name}")
        if sha is not None:
            gs.base = sha
        return sha

    def files_at(sha: str) -> dict[str, str]:
        out = git(store, "ls-tree", "-r", sha, "--", "unsorted")
        return {line.split("\t")[1]: line.split()[2] for line in out.splitlines()}

    commit("u-a.yaml", "memories: []\n")
    first = commit("u-b.yaml", "memories: []\n# b\n")
    assert first and "read-tree" not in calls, calls  # on its own last commit: kept
    assert "rev-parse" not in calls and "ls-tree" not in calls, calls
    # a person's commit: another tree, read again
    (store / "person.txt").write_text("a person's file\n")
    git(store, "add", "person.txt")
    git(store, "commit", "-qm", "the person's commit", "--", "person.txt")
    gs.base = git(store, "rev-parse", "HEAD").strip()
    second = commit("u-c.yaml", "memories: []\n# c\n")
    assert second and "read-tree" in calls, calls
    assert "person.txt" in git(store, "ls-tree", "--name-only", second)
    # the scratch index changed by someone else: read again
    scratch = store / ".git" / "clagd-build-index"
    scratch.write_bytes(scratch.read_bytes())
    os.utime(scratch, ns=(1, 1))
    third = commit("u-b.yaml", "memories: []\n# b again\n")
    assert third and "read-tree" in calls, calls
    before, after = files_at(second), files_at(third)
    assert {p for p in after if after[p] != before.get(p)} == {"unsorted/u-b.yaml"}
    assert set(after) == set(before)
    # nothing changed: no commit
    assert commit("u-b.yaml", "memories: []\n# b again\n") is None
    assert git(store, "status", "--porcelain", "--", "unsorted").strip() == ""


def test_only_the_daemons_own_scratch_index_is_split(store: Path) -> None:
    """The scratch index the daemon builds its commits in is a split index (a write
    rewrites what changed, not ~1 MB at 11k clusters); the person's `.git/index` stays a
    plain one, which every tool reads (libgit2 reads no split index)."""
    from clagd.engine.core import Engine

    eng = Engine(store)
    try:
        for i in range(3):
            eng.add([{"content": f"note {i} about the orchard"}])
    finally:
        eng.close()
    build = store / ".git" / "clagd-build-index"
    scratch = subprocess.run(
        ["git", "rev-parse", "--shared-index-path"],
        cwd=store,
        env={**os.environ, "GIT_INDEX_FILE": str(build)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert scratch and (store / scratch).exists(), scratch
    assert git(store, "rev-parse", "--shared-index-path").strip() == ""
    assert git(store, "status", "--porcelain", "--", "unsorted", "clusters") == ""


def _rev(root: Path, ref: str) -> str | None:
    out = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or None


def test_refs_read_from_the_files_say_what_git_says(tmp_path: Path) -> None:
    from clagd.store import gitstate

    root = tmp_path / "r"
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    gitdir = root / ".git"
    assert gitstate.read_head(gitdir, gitdir) is None  # unborn
    assert gitstate.read_branch(gitdir, "main") is None
    for i in range(2):
        (root / f"f{i}").write_text(str(i))
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"c{i}")
    git(root, "branch", "side", "HEAD~1")
    g = GitStore(root)
    for step in ("loose", "packed", "packed and loose", "detached", "deleted"):
        if step == "packed":
            git(root, "pack-refs", "--all")
            assert not (gitdir / "refs" / "heads" / "main").exists()
        elif step == "packed and loose":
            git(root, "commit", "-q", "--allow-empty", "-m", "after the pack")
        elif step == "detached":
            git(root, "checkout", "-q", "--detach", "HEAD~1")
        elif step == "deleted":
            git(root, "branch", "-D", "side")
        for branch in ("main", "side", "nope"):
            assert gitstate.read_branch(gitdir, branch) == _rev(root, f"refs/heads/{branch}"), (
                step,
                branch,
            )
        assert gitstate.read_head(gitdir, gitdir) == _rev(root, "HEAD"), step
        assert g.head() == _rev(root, "HEAD")
    # a symbolic ref under refs/heads: only git can tell, and the store asks it
    git(root, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
    with pytest.raises(gitstate.RefNotRead):
        gitstate.read_branch(gitdir, "alias")
    g.branch = "alias"
    assert g.branch_head() == _rev(root, "refs/heads/main")


def test_a_linked_worktree_reads_its_own_head_and_the_shared_branches(tmp_path: Path) -> None:
    from clagd.store import gitstate

    root = tmp_path / "r"
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    (root / "f").write_text("x")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    git(root, "worktree", "add", "-q", "-b", "wt", str(tmp_path / "wt"))
    git(tmp_path / "wt", "commit", "-q", "--allow-empty", "-m", "in the worktree")
    g = GitStore(tmp_path / "wt")
    assert g.commondir != g.gitdir
    assert gitstate.read_head(g.gitdir, g.commondir) == _rev(tmp_path / "wt", "HEAD")
    assert g.head() == _rev(tmp_path / "wt", "HEAD") != _rev(root, "HEAD")
    assert gitstate.read_branch(g.commondir, "main") == _rev(root, "HEAD")
