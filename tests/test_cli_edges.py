"""The CLI's edges: exit statuses that tell "no daemon" from a usage error, a --store that is
not a store, --log-level as a choice, `import` naming every file it leaves out, and `init`
refusing a folder that holds something else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import REPO, InProcessDaemon, git

from clagd.cli import EXIT_NOT_RUNNING, EXIT_USAGE, main


def clagd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "clagd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


def test_no_daemon_and_usage_errors_have_distinct_exit_codes(tmp_path: Path) -> None:
    store = tmp_path / "memory"
    assert clagd("init", str(store)).returncode == 0
    down = clagd("--store", str(store), "status")
    assert down.returncode == EXIT_NOT_RUNNING == 69
    assert "not running" in down.stderr and len(down.stderr.strip().splitlines()) == 1
    usage = clagd("--store", str(store), "query")  # TEXT missing: click's usage error
    assert usage.returncode == EXIT_USAGE == 2
    bad_level = clagd("run", str(store), "--log-level", "LOUD")
    assert bad_level.returncode == EXIT_USAGE
    assert "'LOUD' is not one of" in bad_level.stderr
    assert not (store / ".clagd" / "clagd.sock").exists()  # it never started


def test_help_documents_the_exit_statuses() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0
    assert "Exit status:" in out.output
    for code, words in (("2", "usage"), ("69", "no daemon"), ("78", "clagd.yaml")):
        line = next(ln for ln in out.output.splitlines() if ln.strip().startswith(code + " "))
        assert words in line, line


def test_a_store_that_is_not_a_store_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "memroy"  # a typo
    res = clagd("--store", str(missing), "query", "anything")
    assert res.returncode == EXIT_USAGE
    assert res.stderr.strip() == (
        f"clagd: {missing} is not a clagd store (no clagd.yaml): clagd init {missing} "
        f"(or clagd run {missing}, which creates it and serves it)"
    )
    other = tmp_path / "docs"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    res = clagd("--store", str(other), "status")
    assert res.returncode == EXIT_USAGE
    assert f"{other} is not a clagd store (no clagd.yaml)" in res.stderr
    assert "clagd init --force" in res.stderr
    assert not (other / "clagd.yaml").exists()  # nothing was created
    # export reads the store's files itself: the same check, nothing written
    res = clagd("--store", str(missing), "export", str(tmp_path / "out"))
    assert res.returncode == EXIT_USAGE and "is not a clagd store" in res.stderr
    assert not (tmp_path / "out").exists()


def test_init_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    res = clagd("init", str(folder))
    assert res.returncode == 1
    assert "is not empty and not a clagd store" in res.stderr and "--force" in res.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # untouched
    # `clagd run` creates a missing store the same way: it refuses too
    run = clagd("run", str(folder))
    assert run.returncode == 1 and "is not empty" in run.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_init_force_commits_only_its_own_files(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    (folder / "clusters").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "clusters" / "draft.yaml").write_text("not mine to commit\n")
    res = clagd("init", "--force", str(folder))
    assert res.returncode == 0, res.stderr
    tracked = set(git(folder, "ls-tree", "-r", "--name-only", "HEAD").split())
    assert "clagd.yaml" in tracked and "prompts/organize.md" in tracked
    assert "notes.txt" not in tracked and "clusters/draft.yaml" not in tracked
    assert (folder / "notes.txt").read_text() == "my notes\n"  # kept, as it was
    assert git(folder, "log", "--format=%s").splitlines() == ["init: new clagd store"]
    # a fresh folder still gets its .gitkeep files committed
    fresh = tmp_path / "fresh"
    assert clagd("init", str(fresh)).returncode == 0
    assert "clusters/.gitkeep" in git(fresh, "ls-tree", "-r", "--name-only", "HEAD").split()


def test_import_reports_every_file_it_skips(daemon: InProcessDaemon, tmp_path: Path) -> None:
    src = tmp_path / "import"
    (src / "sub").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text("[core]\n")
    (src / "a.json").write_text(json.dumps({"content": "The garage code is 4512"}))
    (src / "sub" / "b.txt").write_text("Ana is allergic to walnuts")
    (src / "blob.bin").write_bytes(b"\x00\x01")
    (src / "draft.md.tmp").write_text("half written")
    (src / "gone.yaml").symlink_to(src / "nowhere.yaml")  # a dangling link
    locked = src / "locked.yaml"
    locked.write_text("content: secret\n")
    locked.chmod(0)
    try:
        res = CliRunner().invoke(
            main, ["--socket", str(daemon.socket), "import", str(src), "--json"]
        )
    finally:
        locked.chmod(0o600)
    out = json.loads(res.output)
    root = os.geteuid() == 0  # root reads a mode-000 file
    assert out["added"] == (3 if root else 2)
    assert out["skipped"] == {
        f"{src}/.git/": "hidden folder",
        str(src / "blob.bin"): "unknown suffix .bin (not .json .md .txt .yaml .yml)",
        str(src / "draft.md.tmp"): "hidden or temporary name (as in the inbox)",
        str(src / "gone.yaml"): "not a regular file",
    }
    if root:
        assert res.exit_code == 0 and out["rejected"] == {}
    else:
        assert res.exit_code == 1
        assert out["rejected"] == {str(locked): "unreadable: Permission denied"}
    text = CliRunner().invoke(main, ["--socket", str(daemon.socket), "import", str(src)])
    assert f"skipped {src / 'blob.bin'}: unknown suffix .bin" in text.output
    assert "imported 0 new memories" in text.output  # all already stored


@pytest.mark.parametrize("name", ["notes.bin", "data.csv"])
def test_import_of_a_named_unknown_file_is_rejected(
    daemon: InProcessDaemon, tmp_path: Path, name: str
) -> None:
    f = tmp_path / name
    f.write_text("something")
    res = CliRunner().invoke(main, ["--socket", str(daemon.socket), "import", str(f)])
    assert res.exit_code == 1
    assert f"rejected {f}: unsupported file type" in res.output
