"""Issue 26's smaller findings, each with its clear behaviour: a pause that names a branch
that exists (or says how to set git.branch), loose booleans refused, `round`'s n bounded,
skip-worktree and assume-unchanged named, `replication.remote` validated."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import InProcessDaemon, git, head_contents, make_store

from clagd.client import ClientError
from clagd.config import load_config
from clagd.errors import ConfigError


def test_a_renamed_branch_pause_says_how_to_set_git_branch(store: Path, short_tmp: Path) -> None:
    """After `git branch -m main trunk` the pause said "run git checkout main to resume",
    which fails: main is gone."""
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add("before the rename")
            git(store, "branch", "-m", "main", "trunk")
            with pytest.raises(ClientError) as err:
                c.add("after the rename")
            assert err.value.code == "paused"
            msg = str(err.value)
            assert "git.branch: trunk" in msg and "does not exist" in msg, msg
            assert "git checkout main" not in msg
            assert "git.branch: trunk" in c.status()["paused"]
    finally:
        d.stop()
    data = yaml.safe_load((store / "clagd.yaml").read_text())
    data.setdefault("git", {})["branch"] = "trunk"  # what the message says
    (store / "clagd.yaml").write_text(yaml.safe_dump(data))
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            assert c.add("on trunk now")["added"] == 1
        assert "on trunk now" in head_contents(store)
        assert git(store, "rev-parse", "--abbrev-ref", "HEAD").strip() == "trunk"
    finally:
        d.stop()


@pytest.mark.parametrize(
    "op,params",
    [
        ("query", {"text": "tea", "include_archive": "false"}),
        ("list", {"include_archive": "false"}),
        ("clusters", {"include_archive": 0}),
        ("archive", {"dry_run": "false"}),
        ("forget", {"match": "tea", "purge": "no"}),
        ("recluster", {"wait": "false"}),
    ],
)
def test_loose_booleans_are_refused_naming_what_was_sent(
    daemon: InProcessDaemon, op: str, params: dict
) -> None:
    """`include_archive: "false"` was taken as true (and thawed), `dry_run: "false"` ran as a
    dry run: a boolean must be a real JSON boolean."""
    root = daemon.root
    with daemon.client() as c:
        c.add("tea with milk")
        head = git(root, "rev-parse", "HEAD").strip()
        with pytest.raises(ClientError) as err:
            c.request(op, params)
        assert err.value.code == "bad_request", err.value
        key = next(k for k in params if k not in ("text", "match"))
        assert repr(key) in str(err.value) and repr(params[key]) in str(err.value)
        assert git(root, "rev-parse", "HEAD").strip() == head
        assert c.request("archive", {"dry_run": True})["dry_run"] is True


@pytest.mark.parametrize("n", [10**30, 0, -1, True, "3", 10_001])
def test_round_n_is_bounded(daemon: InProcessDaemon, n: object) -> None:
    with daemon.client() as c:
        with pytest.raises(ClientError) as err:
            c.request("round", {"n": n})
        assert err.value.code == "bad_request" and "1 to 10000" in str(err.value)
        assert c.round(10_000)["rounds_since_session"] == 10_000


@pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged"])
def test_a_flagged_memory_file_gives_a_clear_message(daemon: InProcessDaemon, flag: str) -> None:
    """skip-worktree or assume-unchanged on a memory file: git does not take clagd's change
    (git add refuses, or the commit lacks it); the error names the file, the flag and the
    command that clears it, instead of git's truncated sparse-checkout message or a retried
    "changed by a git command of the person's"."""
    root = daemon.root
    with daemon.client() as c:
        c.add_many([{"content": f"espresso grinder burr setting {i}"} for i in range(6)])
        assert c.recluster()["status"] in ("accepted", "fallback")
        c.add_many([{"content": f"espresso grinder burr setting {i} again"} for i in range(3)])
        files = git(root, "ls-files", "--", "clusters", "unsorted").split()
        git(root, "update-index", flag, "--", *files)
        head = git(root, "rev-parse", "HEAD").strip()
        with pytest.raises(ClientError) as err:
            c.recluster()  # rewrites the flagged files: the cluster and the shard
        msg = str(err.value)
        what = flag.removeprefix("--")
        assert err.value.code == "store" and f"is marked {what}" in msg, msg
        assert "git update-index --no-skip-worktree --no-assume-unchanged" in msg
        assert git(root, "rev-parse", "HEAD").strip() == head
        git(root, "update-index", f"--no-{what}", "--", *files)
        assert c.recluster()["status"] in ("accepted", "fallback", "noop")


def test_a_gitignore_of_the_persons_does_not_stop_memory_files(daemon: InProcessDaemon) -> None:
    """A person's `.gitignore` that matches the memory files (`*.yaml`): `git add` of a new
    one refused ("paths are ignored"), so no new cluster or shard could be committed.
    The daemon stages exactly its files with `update-index`, whatever the ignore rules."""
    root = daemon.root
    (root / ".gitignore").write_text("*.yaml\n")
    git(root, "add", ".gitignore")
    git(root, "commit", "-qm", "the person's ignore rules")
    with daemon.client() as c:
        c.add_many([{"content": f"espresso grinder burr setting {i}"} for i in range(6)])
        assert c.recluster()["status"] in ("accepted", "fallback")
        c.add("a memory after the clusters were made")
    contents = head_contents(root)
    assert len(contents) == 7 and "a memory after the clusters were made" in contents
    tracked = git(root, "ls-files", "--", "clusters", "unsorted").split()
    assert any(p.startswith("clusters/") for p in tracked)
    assert git(root, "status", "--porcelain", "--ignored", "--", "clusters", "unsorted") == ""


@pytest.mark.parametrize("remote", ["-oProxyCommand=x", "--upload-pack=touch /tmp/x", "a b"])
def test_a_remote_that_git_would_read_as_an_option_is_refused(tmp_path: Path, remote: str) -> None:
    store = make_store(tmp_path / "memory", {"replication": {"remote": remote}})
    with pytest.raises(ConfigError) as err:
        load_config(store)
    assert "'replication.remote'" in str(err.value) and repr(remote) in str(err.value)


@pytest.mark.parametrize(
    "remote", ["origin", "backup-1", "/srv/memory.git", "./mirror", "host:memory.git", "ssh://h/x"]
)
def test_remote_names_urls_and_paths_are_accepted(tmp_path: Path, remote: str) -> None:
    store = make_store(tmp_path / "memory", {"replication": {"remote": remote}})
    assert load_config(store).replication.remote == remote


def test_the_remote_reaches_git_push_after_the_double_dash(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a remote that passed the check (or a config read without it) is never read by
    git as an option: `git push` gets it after `--`."""
    from clagd.store.gitrepo import GitStore

    argv: list[tuple[str, ...]] = []
    monkeypatch.setattr(GitStore, "run", lambda self, *args, **kw: argv.append(args) or "")
    GitStore(store).push("-oProxyCommand=x", "main")
    (args,) = argv
    assert args[0] == "push" and "--" in args
    assert args[args.index("--") + 1 :] == ("-oProxyCommand=x", "HEAD:refs/heads/main")
