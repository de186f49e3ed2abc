"""The writer's trash (`store/durable.py` `Trash`): a replaced or removed file's old version
is moved aside by an atomic exchange and unlinked after the commit, off the writer's hold."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from helpers import git, make_store, wait_for

from clagd.engine.core import Engine
from clagd.libc import rename_exchange
from clagd.store.durable import Trash, atomic_write_text


def _exchange_works(folder: Path) -> bool:
    a, b = folder / "probe-a", folder / "probe-b"
    a.write_text("a")
    b.write_text("b")
    try:
        return rename_exchange(a, b)
    finally:
        a.unlink()
        b.unlink()


@pytest.fixture
def exchange(tmp_path: Path) -> None:
    if not _exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available on this filesystem")


def test_a_replaced_file_waits_in_the_trash_until_emptied(tmp_path: Path, exchange: None) -> None:
    trash = Trash(tmp_path / "trash")
    path = tmp_path / "c.yaml"
    path.write_text("old version\n")
    old_inode = path.stat().st_ino
    atomic_write_text(path, "new version\n", sync_dir=False, fsync=False, trash=trash)
    assert path.read_text() == "new version\n"
    assert path.stat().st_nlink == 1  # never a second name (read as a hard-linked file)
    kept = list((tmp_path / "trash").iterdir())
    assert [p.read_text() for p in kept] == ["old version\n"]
    assert kept[0].stat().st_ino == old_inode  # the very file, moved, not copied
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert trash.empty() == 1
    assert list((tmp_path / "trash").iterdir()) == []


def test_a_removed_file_goes_to_the_trash_and_a_missing_folder_is_made(tmp_path: Path) -> None:
    trash = Trash(tmp_path / "gone" / "trash")  # not made yet (a `git clean -fdx`)
    path = tmp_path / "u.yaml"
    path.write_text("shard\n")
    trash.remove(path)
    trash.remove(tmp_path / "never-there.yaml")  # nothing to do, no error
    assert not path.exists()
    assert [p.read_text() for p in (tmp_path / "gone" / "trash").iterdir()] == ["shard\n"]
    assert trash.empty() == 1


def test_readers_always_find_the_old_or_the_new_file(tmp_path: Path, exchange: None) -> None:
    trash = Trash(tmp_path / "trash")
    path = tmp_path / "c.yaml"
    versions = [f"version {i}\n" * 50 for i in range(200)]
    path.write_text(versions[0])
    seen: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(path.read_text())
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for text in versions[1:]:
            atomic_write_text(path, text, sync_dir=False, fsync=False, trash=trash)
    finally:
        done.set()
        reader.join()
    assert errors == []
    assert seen and set(seen) <= set(versions)
    assert len(list((tmp_path / "trash").iterdir())) == len(versions) - 1
    assert path.read_text() == versions[-1]


def test_a_symlink_is_replaced_as_before_and_its_target_untouched(tmp_path: Path) -> None:
    trash = Trash(tmp_path / "trash")
    outside = tmp_path / "outside.yaml"
    outside.write_text("not the store's\n")
    path = tmp_path / "c.yaml"
    path.symlink_to(outside)
    atomic_write_text(path, "the store's\n", sync_dir=False, fsync=False, trash=trash)
    assert not path.is_symlink() and path.read_text() == "the store's\n"
    assert outside.read_text() == "not the store's\n"
    assert not (tmp_path / "trash").exists()  # os.replace: nothing kept aside


def test_the_writer_empties_its_trash_after_commits_and_at_start(
    tmp_path: Path, exchange: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept: list[str] = []
    keep = Trash.keep
    monkeypatch.setattr(Trash, "keep", lambda self, p: (kept.append(p.name), keep(self, p))[1])
    root = make_store(tmp_path / "m")
    trash = root / ".clagd" / "trash"
    trash.mkdir(parents=True, exist_ok=True)
    (trash / "left-by-a-crash").write_text("an old version\n")
    eng = Engine(root)
    try:
        assert not (trash / "left-by-a-crash").exists()
        eng.add([{"content": f"memory number {i} about the garden"} for i in range(30)])
        eng.recluster()  # rewrites and removes files: their old versions pass the trash
        assert kept  # the session's rewrites went through the trash
        wait_for(lambda: trash.is_dir() and not list(trash.iterdir()), what="the reaper")
        data = ("clusters", "unsorted", "archive", ".clagd")
        assert git(root, "status", "--porcelain", "--", *data).strip() == ""
    finally:
        eng.close()


def test_forget_leaves_no_old_version_in_the_trash(
    tmp_path: Path, exchange: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no reaper: only the forget's own emptying can take the old versions out
    monkeypatch.setattr(Trash, "reap_soon", lambda self: None)
    root = make_store(tmp_path / "m")
    trash = root / ".clagd" / "trash"
    eng = Engine(root)
    try:
        eng.add([{"content": "My bank PIN is 4321"}, {"content": "The garden needs water"}])
        eng.add([{"content": "Another memory in the same shard area"}])
        forgotten = eng.forget(match="PIN is 4321")
        assert len(forgotten.forgotten) == 1
        left = [p for p in trash.iterdir()] if trash.exists() else []
        assert left == []
        for dirpath, _, files in os.walk(root):
            if ".git" in Path(dirpath).parts:
                continue
            for f in files:
                assert "4321" not in (Path(dirpath) / f).read_text(errors="replace")
    finally:
        eng.close()


def test_a_file_removed_between_the_check_and_the_swap_is_written_anew(
    tmp_path: Path, exchange: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's `rm` (or `git rm -r`) between the writer's look at the old file and the
    exchange: the new file is written as a plain rename would, not a FileNotFoundError."""
    import clagd.store.durable as durable

    trash = Trash(tmp_path / "trash")
    path = tmp_path / "c.yaml"
    path.write_text("old\n")
    real = durable.rename_exchange

    def removed_first(a: Path, b: Path) -> bool:
        os.unlink(b)
        return real(a, b)

    monkeypatch.setattr(durable, "rename_exchange", removed_first)
    atomic_write_text(path, "new\n", sync_dir=False, fsync=False, trash=trash)
    assert path.read_text() == "new\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
