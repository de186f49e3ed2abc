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
from helpers import REPO, InProcessDaemon, git, make_store

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
        str(src / "blob.bin"): "unknown suffix .bin (not .json .jsonl .md .txt .yaml .yml)",
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


@pytest.mark.parametrize(
    "args,option",
    [
        (["query", "x", "--budget", "-5"], "'--budget'"),
        (["query", "x", "-k", "0"], "'-k'"),
        (["query", "x", "-k", "101"], "'-k'"),
        (["log", "-n", "0"], "'-n'"),
        (["import", ".", "--batch", "0"], "'--batch'"),
        (["add", "x", "-m", "importance=high"], "'--meta'"),
        (["add", "x", "-m", "importance=5"], "'--meta'"),
    ],
)
def test_usage_errors_exit_2_naming_the_option_typed(
    tmp_path: Path, args: list[str], option: str
) -> None:
    store = tmp_path / "memory"
    assert clagd("init", str(store)).returncode == 0
    res = clagd("--store", str(store), *args, cwd=tmp_path)
    assert res.returncode == EXIT_USAGE, res.stderr
    assert option in res.stderr, res.stderr
    assert "token_budget" not in res.stderr and "max_memories'" not in res.stderr
    if "importance" in args[-1]:
        assert "from 0 (unimportant) to 1 (vital)" in res.stderr


def test_add_with_no_text_says_how_to_give_it(tmp_path: Path) -> None:
    import pty

    store = tmp_path / "memory"
    assert clagd("init", str(store)).returncode == 0
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    env["PYTHONPATH"] = str(REPO)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "clagd", "--store", str(store), "add"],
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=60,  # it answers at once: it does not wait on the terminal
            env=env,
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert res.returncode == EXIT_USAGE
    assert 'no memory given: clagd add "TEXT", clagd add --file FILE' in res.stderr
    for empty in ("", "   "):
        res = clagd("--store", str(store), "add", empty)
        assert res.returncode == EXIT_USAGE
        assert "the memory is empty: give the text to store" in res.stderr


def test_add_reads_a_large_memory_from_a_file_or_stdin(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    text = "The user's notes. " + "Paragraph about the garden and the car. " * 1500  # 60k
    src = tmp_path / "notes.txt"
    src.write_text(text)
    base = ["--socket", str(daemon.socket)]
    res = clagd(*base, "add", "--file", str(src), "--json")
    assert res.returncode == 0, res.stderr
    [mid] = json.loads(res.stdout)["ids"]
    # the same text from stdin is the same memory
    with open(src) as f:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
        piped = subprocess.run(
            [sys.executable, "-m", "clagd", *base, "add", "-"],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "PYTHONPATH": str(REPO)},
        )
    assert piped.returncode == 0 and piped.stdout.strip() == f"already stored: {mid}"
    # over the limit per memory: refused before it is sent, with the size and what to do
    src.write_text("x" * 70_000)
    res = clagd(*base, "add", "--file", str(src))
    assert res.returncode == 1
    assert res.stderr.strip() == (
        "clagd: memory: 'content' is 70000 characters, over the limit of 65536 per memory "
        "(fixed, no setting raises it): split it into several memories"
    )


def test_import_splits_requests_and_commits_say_from_import(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    src = tmp_path / "big"
    src.mkdir()
    for i in range(24):  # 24 memories of ~60k characters: ~1.4 MB, over one request's limit
        (src / f"{i:02}.txt").write_text(f"memory {i} " + "word " * 12_000)
    limit = daemon.daemon.config.server.max_request_bytes
    assert 24 * 60_000 > limit
    res = CliRunner().invoke(main, ["--socket", str(daemon.socket), "import", str(src), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["added"] == 24
    subjects = git(daemon.root, "log", "--format=%s").splitlines()
    ingests = [s for s in subjects if s.startswith("ingest:")]
    assert len(ingests) >= 2 and all(s.endswith("from import") for s in ingests), subjects


def test_import_rejects_a_memory_over_the_limit_saying_what_to_do(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    f = tmp_path / "huge.txt"
    f.write_text("y" * 100_000)
    res = CliRunner().invoke(main, ["--socket", str(daemon.socket), "import", str(f)])
    assert res.exit_code == 1
    assert (
        f"rejected {f}: file: 'content' is 100000 characters, over the limit of 65536 per "
        "memory (fixed, no setting raises it): split it into several memories"
    ) in res.output


def test_a_request_over_the_socket_limit_names_the_setting_and_its_size(
    tmp_path: Path, short_tmp: Path
) -> None:
    from clagd.client import ClientError

    store = make_store(tmp_path / "memory", {"server": {"max_request_bytes": 4096}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c, pytest.raises(ClientError) as err:
            c.add("z" * 10_000)
    finally:
        d.stop()
    assert err.value.code == "too_large"
    msg, _, seen = str(err.value).rpartition(" (this one: ")
    assert msg == (
        "request over 4096 bytes, the limit (server.max_request_bytes in clagd.yaml): send "
        "fewer or smaller memories per request (clagd import --batch N), or raise "
        "server.max_request_bytes"
    )
    assert seen.endswith(" bytes)") and 10_000 < int(seen.split()[0]) < 10_100  # the request


def test_log_reads_git_when_no_daemon_runs(tmp_path: Path) -> None:
    store = tmp_path / "memory"
    assert clagd("init", str(store)).returncode == 0
    res = clagd("--store", str(store), "log")
    assert res.returncode == 0, res.stderr
    assert "init     init: new clagd store" in res.stdout
    as_json = json.loads(clagd("--store", str(store), "log", "--json").stdout)
    assert [e["kind"] for e in as_json["entries"]] == ["init"] and as_json["history"] == []
    # a --socket that names nothing is still an error: the person asked for that daemon
    res = clagd("--store", str(store), "--socket", str(tmp_path / "x.sock"), "log")
    assert res.returncode == EXIT_NOT_RUNNING


def test_every_json_option_has_help_text() -> None:
    import click

    def commands(group: click.Group, path: str = "") -> list[tuple[str, click.Command]]:
        out = []
        for name, cmd in group.commands.items():
            out.append((f"{path}{name}", cmd))
            if isinstance(cmd, click.Group):
                out += commands(cmd, f"{path}{name} ")
        return out

    found = 0
    for name, cmd in commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and "--json" in p.opts:
                found += 1
                assert p.help, f"clagd {name} --json has no help"
    assert found >= 10


def test_export_counts_one_memory_in_the_singular() -> None:
    from clagd.model import Cluster, Memory
    from clagd.store.export import cluster_markdown

    one = Memory.new("The garage code is 4512", "2026-01-01T00:00:00Z")
    two = Memory.new("The cat is called Miso", "2026-01-02T00:00:00Z")
    assert " · 1 memory · " in cluster_markdown(Cluster("c-000000000001", "Codes", memories=[one]))
    assert " · 2 memories · " in cluster_markdown(
        Cluster("c-000000000002", "Home", memories=[one, two])
    )
