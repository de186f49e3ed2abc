"""Only regular files hold memories: a symlink, a hard-linked file, a FIFO, a socket in the
memory folders is never read (HEAD's version is served, the entry is listed in
`status.special_files`, a symlink edit is refused, never committed as a link), so warm and
cold starts serve the same thing, HEAD; in the inbox such an entry is moved to
`inbox/rejected/` with what it is, and a FIFO never blocks the watcher."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml
from helpers import InProcessDaemon, git, head_contents, wait_for


def _one_cluster(d: InProcessDaemon) -> Path:
    with d.client() as c:
        for i in range(4):
            c.add_many([{"content": f"espresso grinder burr setting {i} {k}"} for k in range(3)])
        assert c.recluster()["status"] in ("accepted", "fallback")
    return sorted((d.root / "clusters").glob("*.yaml"))[0]


def _served(d: InProcessDaemon) -> int:
    with d.client() as c:
        return int(c.status()["counts"]["memories"])


def _in_head(root: Path) -> int:
    return len(head_contents(root))


def _starts_serve_head(root: Path, sock: Path) -> None:
    """A warm start and a start from the files both serve exactly HEAD."""
    for warm in (True, False):
        if not warm:
            for f in (root / ".clagd").glob("warmstart*"):
                f.unlink()
        d = InProcessDaemon(root, sock)
        try:
            assert _served(d) == _in_head(root), warm
        finally:
            d.stop()


def test_a_symlinked_cluster_file_is_never_read_nor_committed(
    store: Path, tmp_path: Path, short_tmp: Path
) -> None:
    """Finding 4: the cluster file replaced by a symlink to a file outside the store that
    holds two more memories. Before: the edit commit stored the link (mode 120000), the
    daemon served memories HEAD did not hold, and warm and cold starts differed."""
    root = store
    daemon = InProcessDaemon(store, short_tmp / "s.sock")
    path = _one_cluster(daemon)
    rel = str(path.relative_to(root))
    data = yaml.safe_load(path.read_text())
    for k in range(2):
        data["memories"].append(
            {"id": f"m-{k:016x}", "content": f"outside memory {k}", "created_at": "2026-01-01"}
        )
    outside = tmp_path / "outside.yaml"
    outside.write_text(yaml.safe_dump(data, sort_keys=False))
    path.unlink()
    path.symlink_to(outside)
    head = git(root, "rev-parse", "HEAD").strip()
    with daemon.client() as c:
        daemon.engine.check_outside()
        st = c.status()
        assert "is a symlink, not a regular file" in st["outside_edit_error"], st
        daemon.engine.special.refresh()
        assert f"{rel}: a symlink" in c.status()["special_files"]
        assert c.add("an add while the link is there")["added"] == 1
    assert git(root, "ls-tree", "HEAD", rel).split()[0] == "100644"  # never the link
    assert git(root, "rev-parse", "HEAD~1").strip() == head  # only the add's commit
    assert _served(daemon) == _in_head(root)
    outside.unlink()  # a dangling link: still not read, still not a removal
    daemon.engine.check_outside()
    assert _served(daemon) == _in_head(root)
    daemon.stop()
    _starts_serve_head(root, short_tmp / "s2.sock")


@pytest.mark.parametrize("kind", ["fifo", "socket", "hardlink", "device"])
def test_special_files_in_the_memory_folders_are_listed_never_read(
    store: Path, tmp_path: Path, short_tmp: Path, kind: str
) -> None:
    root = store
    daemon = InProcessDaemon(store, short_tmp / "s.sock")
    path = _one_cluster(daemon)
    name = {"hardlink": path.name, "device": "c-00000000dead.yaml"}.get(
        kind, "u-20260101T000000-aaaaaaaaaaaa.yaml"
    )
    folder = {"hardlink": "clusters", "device": "archive"}.get(kind, "unsorted")
    where = root / folder / name
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        os.mknod(where, 0o600 | stat.S_IFSOCK)  # a socket's inode (a bound path is too long)
    elif kind == "device":
        where.parent.mkdir(exist_ok=True)
        try:  # /dev/null's numbers: a read would give nothing, a write would vanish
            os.mknod(where, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            daemon.stop()
            pytest.skip("making a device node needs CAP_MKNOD")
    else:
        os.link(where, tmp_path / "other-name.yaml")
    try:
        daemon.engine.special.refresh()
        with daemon.client() as c:
            listed = c.status()["special_files"]
            assert any(e.startswith(f"{where.parent.name}/{name}: ") for e in listed), listed
            assert c.add("writes go on")["added"] == 1
        assert _served(daemon) == _in_head(root)
    finally:
        daemon.stop()
    _starts_serve_head(root, short_tmp / "s2.sock")  # a cold start: no read blocks


def test_special_entries_in_the_inbox_are_rejected_with_what_they_are(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    root = daemon.root
    inbox = root / "inbox"
    target = tmp_path / "elsewhere.txt"
    target.write_text("a memory behind a link\n")
    os.mkfifo(inbox / "pipe.txt")  # opened for reading, it would block the watcher
    (inbox / "link.txt").symlink_to(target)
    hard = tmp_path / "hard.txt"
    hard.write_text("a memory with two names\n")
    os.link(hard, inbox / "hard.txt")
    os.mknod(inbox / "sock", 0o600 | stat.S_IFSOCK)
    try:  # /dev/null's numbers
        os.mknod(inbox / "null.txt", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        devices = {"null.txt": "a device"}
    except PermissionError:  # no CAP_MKNOD
        devices = {}
    (inbox / "plain.txt").write_text("a plain memory still comes through\n")
    (inbox / "bob").mkdir()  # a scope's folder (a folder is never rejected)
    os.mkfifo(inbox / "bob" / "pipe.md")
    names = {"pipe.txt": "a FIFO", "link.txt": "a symlink", "bob_pipe.md": "a FIFO"}
    names |= {"hard.txt": "a hard-linked file", "sock": "a socket"} | devices
    rejected = inbox / "rejected"
    wait_for(lambda: all((rejected / f"{n}.error").exists() for n in names), 20, "the rejections")
    for n, what in names.items():
        assert what in (rejected / f"{n}.error").read_text(), n
        assert not os.path.lexists(inbox / n.replace("_", "/"))
    wait_for(lambda: not (inbox / "plain.txt").exists(), 20, "the plain file")
    assert "a plain memory still comes through" in head_contents(root)
    assert "a memory behind a link" not in head_contents(root)
    assert target.read_text() == "a memory behind a link\n"  # the link's target is kept
    with daemon.client() as c:
        assert c.status()["inbox"]["files_rejected"] == len(names)


def test_a_250_byte_invalid_name_reaches_rejected_with_a_short_error_name(
    daemon: InProcessDaemon,
) -> None:
    """Before: its `.error` name was over 255 bytes, the move failed on every rescan, was
    logged every time, and status.inbox.last_error stayed empty."""
    inbox = daemon.root / "inbox"
    name = "x" * 245 + ".json"
    (inbox / name).write_text("{not json")
    rejected = inbox / "rejected"
    wait_for(lambda: (rejected / name).exists(), 20, "the file in rejected/")
    errors = [p.name for p in rejected.iterdir() if p.name.endswith(".error")]
    assert len(errors) == 1 and len(errors[0].encode()) <= 255, errors
    assert errors[0].startswith("x" * 200) and "~" in errors[0]
    text = (rejected / errors[0]).read_text()
    assert name in text and all(line.startswith("# ") for line in text.splitlines())
    assert not (inbox / name).exists()
