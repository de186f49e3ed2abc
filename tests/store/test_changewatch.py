"""A write asks git whether anything changed outside the daemon only when the inotify watch of
the memory folders and the identity of git's index say something did (`store/changewatch.py`):
a real engine on a real store, real files edited and real git commands run between writes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clagd.engine.core import Engine
from clagd.errors import Paused
from clagd.store import changewatch
from clagd.store.gitrepo import GitStore
from tests.helpers import git, make_store


class Asked:
    """How often the engine ran the full check (`git status` of the memory folders)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = GitStore.dirty_and_staged

        def counted(git_store: GitStore, dirs: object) -> tuple[list[str], list[str]]:
            self.n += 1
            return real(git_store, dirs)  # type: ignore[arg-type]

        monkeypatch.setattr(GitStore, "dirty_and_staged", counted)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_store(tmp_path / "store")


@pytest.fixture
def eng(root: Path) -> Iterator[Engine]:
    e = Engine(root)
    yield e
    e.close()


def _shard(root: Path) -> Path:
    files = sorted((root / "unsorted").glob("*.yaml"))
    assert files, "the adds left no unsorted shard"
    return files[0]


def _holding(root: Path, text: str) -> Path:
    """The memory file that holds `text` (in the memory folders of `root`, or in it)."""
    files = [f for d in ("unsorted", "clusters") for f in sorted((root / d).glob("*.yaml"))]
    files += sorted(root.glob("*.yaml"))
    found = [f for f in files if text in f.read_text()]
    assert found, f"no memory file holds {text!r}"
    return found[0]


def _contents(eng: Engine) -> set[str]:
    return {m.content for m, _a, _k in eng.state.all_memories()}


def _subjects(root: Path, n: int) -> list[str]:
    return git(root, "log", f"-{n}", "--format=%s").splitlines()


def _first_adds(eng: Engine) -> None:
    eng.add([{"content": "the user keeps the spare key under the blue flower pot"}])
    eng.check_outside()  # housekeeping's full check: clean, the watch is armed from here
    eng.add([{"content": "the user's bicycle is a green Gazelle"}])


def test_adds_ask_git_only_after_a_change_that_is_not_the_daemons(
    eng: Engine, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_adds(eng)
    asked = Asked(monkeypatch)
    for i in range(5):
        eng.add([{"content": f"the user noted errand number {i} for Saturday"}])
    assert asked.n == 0  # the daemon's own writes: no git status
    assert eng.writer.watch.quiet_checks >= 5

    # a hand edit of a memory file: the next add takes it in first, as its own commit
    shard = _shard(root)
    data = yaml.safe_load(shard.read_text())
    data["memories"].append({"content": "the user's passport expires in March 2031"})
    shard.write_text(yaml.safe_dump(data))
    eng.add([{"content": "the user bought oat milk today"}])
    assert asked.n == 1
    assert "the user's passport expires in March 2031" in _contents(eng)
    assert _subjects(root, 2)[1].startswith("edit: 1 file(s) changed outside clagd")
    assert not git(root, "status", "--porcelain", "--", "unsorted")

    # taken in and clean again: the following adds are quiet
    eng.add([{"content": "the user fed the cat at seven"}])
    eng.add([{"content": "the user fed the cat at eight"}])
    assert asked.n == 2  # one full check that found the store clean, then none


def test_an_edit_that_keeps_size_and_mtime_is_seen(
    eng: Engine, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_adds(eng)
    shard = _holding(root, "green Gazelle")
    before = shard.stat()
    text = shard.read_text()
    assert "green Gazelle" in text
    shard.write_text(text.replace("green Gazelle", "green Batavus"))  # same length
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old mtime
    assert shard.stat().st_size == before.st_size and shard.stat().st_mtime_ns == before.st_mtime_ns
    eng.add([{"content": "the user oiled the chain"}])
    assert "the user's bicycle is a green Batavus" in _contents(eng)
    assert "the user's bicycle is a green Gazelle" not in _contents(eng)


def test_a_change_staged_without_touching_a_file_pauses_the_next_write(
    eng: Engine, root: Path
) -> None:
    _first_adds(eng)
    rel = str(_shard(root).relative_to(root))
    git(root, "rm", "-q", "--cached", rel)  # the index changes, no file does
    with pytest.raises(Paused, match="changes are staged in the memory folders"):
        eng.add([{"content": "written while the person's deletion is staged"}])
    git(root, "reset", "-q")
    eng.add([{"content": "written once the person unstaged it"}])
    assert "written once the person unstaged it" in _contents(eng)
    assert rel in git(root, "ls-tree", "-r", "--name-only", "HEAD")


def test_a_folder_replaced_behind_the_watch_is_checked_with_git(eng: Engine, root: Path) -> None:
    _first_adds(eng)
    # a copy of the folder, edited elsewhere, takes the watched folder's place by a rename:
    # the only event is the watched folder's move (the watch follows it away)
    spare = root.parent / "unsorted-edited-elsewhere"
    shutil.copytree(root / "unsorted", spare)
    shard = _holding(spare, "green Gazelle")
    shard.write_text(shard.read_text().replace("green Gazelle", "red Gazelle"))
    eng.check_outside()  # a full check: nothing in the store changed
    os.rename(root / "unsorted", root.parent / "unsorted-moved-away")
    os.rename(spare, root / "unsorted")
    eng.add([{"content": "the user pumped the tyres"}])
    assert "the user's bicycle is a red Gazelle" in _contents(eng)
    # watched again from the full check on: another edit of the new folder is an event
    eng.add([{"content": "the user washed the bicycle"}])
    shard = _holding(root, "red Gazelle")
    shard.write_text(shard.read_text().replace("red Gazelle", "blue Gazelle"))
    eng.add([{"content": "the user locked the bicycle"}])
    assert "the user's bicycle is a blue Gazelle" in _contents(eng)


def test_without_inotify_every_write_asks_git(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changewatch, "inotify_init", lambda: -1)
    eng = Engine(root)
    try:
        assert not eng.writer.watch.active
        _first_adds(eng)
        asked = Asked(monkeypatch)
        for i in range(3):
            eng.add([{"content": f"the user noted errand number {i} for Sunday"}])
        assert asked.n == 3
        shard = _holding(root, "green Gazelle")
        shard.write_text(shard.read_text().replace("green Gazelle", "grey Gazelle"))
        eng.add([{"content": "the user checked the brakes"}])
        assert "the user's bicycle is a grey Gazelle" in _contents(eng)
    finally:
        eng.close()
