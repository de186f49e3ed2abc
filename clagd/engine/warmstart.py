"""The warm start: the loaded store state and index pickled at a clean HEAD, so the next
start re-reads only the files changed since (git diff + uncommitted edits) instead of every
YAML file (100k memories take far longer to parse than to unpickle).

It is a cache and never the truth: a missing, foreign, older-format or unreadable file, or
one saved under other retrieval/ingest settings, just means a full load. ("Snapshot" in
clagd means only the immutable index snapshot that queries read.)
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clagd.config import Config
from clagd.engine.loader import gc_paused
from clagd.retrieval.index import Index
from clagd.store.files import StoreState
from clagd.store.gitrepo import GitStore
from clagd.store.writer import DATA_DIRS, WriteContext, read_changes

log = logging.getLogger("clagd")

# Bumped whenever the pickled classes move or change shape (2: the layer subpackages;
# 3: the file renamed from snapshot.pickle; 4: text made one-line when read, so a state
# pickled before is read again; 5: the index cut by job, `retrieval.snapshot`). The header
# line is read before anything is unpickled, so an older file is refused without importing
# classes that no longer exist.
WARMSTART_FORMAT = 5
WARMSTART_MAGIC = b"clagd-warm-start %d\n" % WARMSTART_FORMAT
WARMSTART_NAME = "warmstart.pickle"
# what versions before format 3 wrote (removed at start: it can never be used again)
LEGACY_NAME = "snapshot.pickle"


def reread_at(
    root: Path, git: GitStore, commit: str, rel_paths: list[str], state: StoreState, index: Index
) -> tuple[StoreState, Index]:
    """`state` and `index` with these store files as `commit` holds them, read from git's
    objects (not the working tree, whose own changes are taken in as outside edits)."""
    texts = git.texts_at(commit, rel_paths)
    state, change = read_changes(root, state, rel_paths, texts)
    return state, index.apply(change.index, routes=True)


@dataclass
class Loaded:
    """A usable warm start: the state and index brought up to the current files."""

    state: StoreState
    index: Index
    head: str  # the commit it was saved at
    note: str  # what was re-read, for `status`'s recovery notes ("" when nothing was)


class WarmStart:
    """The warm-start file of one store: loaded once at start, saved by the writer."""

    def __init__(self, runtime: Path, config: Config) -> None:
        self.path = runtime / WARMSTART_NAME
        self.legacy = runtime / LEGACY_NAME
        self.config = config
        self.saved_head: str | None = None  # the commit the file on disk describes
        self.saved_at = time.monotonic()

    def key(self) -> dict[str, object]:
        """What the pickled index depends on besides the files: a change means a full load."""
        return {
            "format": WARMSTART_FORMAT,
            "retrieval": asdict(self.config.retrieval),
            "ingest": asdict(self.config.ingest),
        }

    def load(self, root: Path, git: GitStore, head: str | None) -> Loaded | None:
        """The saved state and index, brought up to date, or None (then load every file)."""
        self.legacy.unlink(missing_ok=True)
        if head is None or not self.path.exists():
            return None
        try:
            data = self._read()
            if data is None or data.get("key") != self.key():
                return None
            return self._catch_up(root, git, head, data)
        except Exception as exc:  # noqa: BLE001 - a bad file only costs a full load
            log.warning("not using the warm-start file (%s): loading every file", exc)
            return None

    def _read(self) -> dict[str, Any] | None:
        # unpickling 100k objects would trigger many useless collections; the engine's
        # own pause, around the whole load, must outlast this one
        with gc_paused():
            with open(self.path, "rb") as fh:
                if fh.readline() != WARMSTART_MAGIC:
                    log.info("warm-start file has another format: loading every file")
                    return None
                data = pickle.load(fh)
        return data if isinstance(data, dict) else None

    def _catch_up(self, root: Path, git: GitStore, head: str, data: dict[str, Any]) -> Loaded:
        saved, state, index = data["head"], data["state"], data["index"]
        # what HEAD holds (from git's objects); the working tree's own changes are the
        # engine's to take in, like any outside edit (see `Engine._load`)
        changed = set(git.changed_between(saved, head, DATA_DIRS)) if saved != head else set()
        note = ""
        if changed:
            state, index = reread_at(root, git, head, sorted(changed), state, index)
            note = f"warm start from {saved[:10]} brought up to date ({len(changed)} files re-read)"
        self.saved_head = saved
        return Loaded(state, index, saved, note)

    def due(self, head: str | None, min_interval: float) -> bool:
        """The store moved on since the last save and that save is old enough."""
        return head != self.saved_head and time.monotonic() - self.saved_at >= min_interval

    def save(self, ctx: WriteContext, index: Index) -> bool:
        """Write the file (on the writer thread: it must see a consistent state). Skipped
        while the working tree differs from HEAD: the file must describe one commit.
        Returns whether it was written."""
        head = ctx.git.head()
        if head is None:
            return False
        dirty = ctx.git.dirty_paths(DATA_DIRS)
        if dirty:
            log.info("warm start not saved: the working tree differs from HEAD (%s)", dirty[0])
            return False
        self.saved_at = time.monotonic()
        data = {"key": self.key(), "head": head, "state": ctx.state, "index": index}
        tmp = self.path.with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            fh.write(WARMSTART_MAGIC)
            pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self.saved_head = head
        return True

    def save_or_drop(self, ctx: WriteContext, index: Index) -> None:
        """Saved now, or the file removed: after a forget or a purge no older file may keep
        what was forgotten, whatever head it was saved at."""
        if not self.save(ctx, index):
            self.path.unlink(missing_ok=True)
