"""The single writer: one thread that owns the working tree, the git index and StoreState.

Every mutation (ingest batch, session apply, archive, revert, reload after an outside edit)
is an operation submitted here and run in order. An operation marks the files it changes
(`touch_*`), mutates `ctx.state`, then calls `ctx.commit(...)`, which writes those files
atomically, commits exactly them, and publishes the change to the index through the
writer's one publisher (`clagd.change.Publisher`: `prepare` while the files are written and
committed, `publish` once the commit exists). If an operation fails half-way, the working
tree is put back to HEAD and the state reloaded: no half-applied change is left behind.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from clagd.change import IndexChange, Publisher
from clagd.errors import Conflict, HeadMoved, Paused, ReadOnly, StoreError
from clagd.libc import syncfs
from clagd.model import Cluster, Memory
from clagd.store.changes import DATA_DIRS, StoreChange, read_changes, unsorted_change
from clagd.store.changewatch import ChangeWatch, Key, file_key
from clagd.store.drop import drop_memories
from clagd.store.durable import Trash, atomic_write_text, fsync_dir, fsync_file
from clagd.store.files import (
    Fragments,
    Paths,
    StoreState,
    cluster_yaml,
    is_data_path,
    load_state,
    read_files,
    shard_yaml,
)
from clagd.store.following import BranchFollower
from clagd.store.frozen import ClusterNames, FrozenClusters
from clagd.store.gitrepo import GitStore, blob_id
from clagd.store.history import HistoryStatus
from clagd.store.holds import Holds, WriterIdle, WriterStatus
from clagd.store.writequeue import NO_ARG, Queued, WriteQueue

__all__ = ["DATA_DIRS", "StoreChange", "WriteContext", "Writer", "read_changes"]

log = logging.getLogger("clagd.writer")
TXN_FILE = "clagd-txn"
# an operation whose commit found the branch moved is retried this often (after a reload)
MOVED_RETRIES = 5


R = TypeVar("R")
A = TypeVar("A")
P = TypeVar("P")  # what the writer's publisher prepares beside a commit


class WriteContext:
    def __init__(self, writer: Writer[Any]) -> None:
        self.w = writer
        self._clusters: set[str] = set()
        self._archive: set[str] = set()
        # shard -> its memories before this change (by id)
        self._shards: dict[str, dict[str, Memory]] = {}
        self._blobs: dict[str, str | None] = {}  # path -> the blob written (None: removed)
        self._keys: dict[str, Key | None] = {}  # path -> the file written (`ChangeWatch`)
        self._staged_checked = False  # `check_no_staged` found nothing since the last commit

    @property
    def state(self) -> StoreState:
        return self.w.state

    @property
    def git(self) -> GitStore:
        return self.w.git

    @property
    def paths(self) -> Paths:
        return self.w.paths

    def clear(self) -> None:
        """Forget the touched files (after they were committed or put back)."""
        self._clusters, self._archive, self._shards = set(), set(), {}
        self._blobs, self._keys = {}, {}
        self._staged_checked = False

    def check_no_staged(self) -> None:
        """Raise Paused while changes are staged in the memory folders: the person's (`git
        add`ed), or a git command's that failed half-way (a reset that lost the race for
        HEAD leaves index and files of another commit). Every write waits for them, an
        `add` as a session, an archive, a route pass or a revert: none is made on top."""
        if self._staged_checked:
            return
        self.settle_staged(self.git.staged_paths(DATA_DIRS))
        self._staged_checked = True

    def settle_staged(self, paths: list[str]) -> set[str]:
        """`refuse_staged` after `Writer.settle_own_staged`; returns the files put back."""
        settled = self.w.settle_own_staged(paths)
        self.refuse_staged([p for p in paths if p not in settled])
        return settled

    def staged_checked(self) -> None:
        """`refuse_staged` passed on this operation's `git status`: the commit need not ask."""
        self._staged_checked = True

    @staticmethod
    def refuse_staged(paths: list[str]) -> None:
        """Raise Paused naming the first of `paths` that is a memory file, if any."""
        staged = [p for p in paths if is_data_path(p)]
        if staged:
            raise Paused(
                f"changes are staged in the memory folders ({staged[0]}"
                f"{f' and {len(staged) - 1} more' if len(staged) > 1 else ''}): commit them, "
                "or git reset --hard to drop them (writes resume by themselves)"
            )

    @property
    def touched(self) -> bool:
        return bool(self._clusters or self._archive or self._shards)

    def touched_paths(self) -> list[str]:
        root = self.paths.root
        out = [self.paths.cluster_file(c) for c in self._clusters]
        out += [self.paths.cluster_file(c, archived=True) for c in self._archive]
        out += [self.paths.shard_file(n) for n in self._shards]
        return sorted(str(p.relative_to(root)) for p in out)

    def hot_clusters(self) -> dict[str, Cluster]:
        """Copies of the hot clusters as committed (`store.frozen`): no later change
        reaches them, and taking them costs the writer one dict copy."""
        return self.w.frozen.view(self.state)

    def cluster_names(self) -> ClusterNames:
        """The hot clusters' names as committed (`store.frozen`), by scope."""
        return self.w.frozen.names(self.state)

    def touch_cluster(self, cid: str) -> None:
        self.paths.cluster_file(cid)  # validates the id before anything is written
        self._clusters.add(cid)

    def touch_archive(self, cid: str) -> None:
        self.paths.cluster_file(cid, archived=True)
        self._archive.add(cid)

    def touch_shard(self, name: str) -> None:
        self.paths.shard_file(name)
        if name not in self._shards:
            self._shards[name] = {m.id: m for m in self.state.unsorted.get(name, [])}

    def commit(
        self, subject: str, body: str = "", trailers: dict[str, Any] | None = None
    ) -> str | None:
        """Write every touched file, commit exactly those, publish the change to readers.

        Durability: the transaction marker (fsynced) names every file first; the files are
        written and renamed without one fsync each, `git add` writes their objects without
        one fsync each either, then one syncfs flushes files and objects together before
        `git commit` refers to them (where syncfs is missing: an fsync per file, and git's
        own fsync per object). A crash before the commit is undone at start-up from the
        marker, a crash after it loses nothing."""
        self.w.check_writable()
        self.check_no_staged()
        self.paths.ensure_data_dirs()
        w = self.w
        change, shards = self._change()
        w.begin_txn(subject, self.touched_paths())
        batch_sync = w.can_syncfs

        def commit() -> str | None:
            """On the git thread, beside the publisher's `prepare`: the files, then git."""
            written = self._write_files(shards, batch_sync)
            return w.git.commit(
                written,
                subject,
                body,
                trailers,
                flush=(lambda: self._flush(written)) if batch_sync else None,
                expected=self._blobs,
            )

        sha, prepared = w.commit_beside_prepare(commit, change)
        w.end_txn()
        w.watch.own(self._keys)  # their events are the daemon's own
        # where the memories of the changed files are now: found there without a pass
        self.state.note_places(self._clusters, self._archive, self._shards)
        self.clear()
        w.rolled_back.clear()  # the staged check before this commit found no leftover
        w.publish(replace(change, commit=sha), prepared)
        w.trash.reap_soon()
        return sha

    def _change(self) -> tuple[StoreChange, list[tuple[str, list[Memory]]]]:
        """What the touched files change (not committed yet), and each touched shard's
        memories (a shard left empty leaves the state)."""
        shards: list[tuple[str, list[Memory]]] = []
        added: list[Memory] = []
        removed: list[str] = []
        for name, before in sorted(self._shards.items()):
            mems = self.state.unsorted.get(name, [])
            if not mems:
                self.state.unsorted.pop(name, None)
            shards.append((name, mems))
            unsorted_change(before, mems, added, removed)
        clusters = self.state.clusters
        index = IndexChange(
            upsert_clusters=tuple(clusters[c] for c in sorted(self._clusters) if c in clusters),
            remove_clusters=tuple(c for c in sorted(self._clusters) if c not in clusters),
            add_unsorted=tuple(added),
            remove_unsorted=tuple(removed),
        )
        archived = tuple(sorted(self._archive))
        return StoreChange(index, archive_changed=bool(archived), archive_ids=archived), shards

    def _write_files(self, shards: list[tuple[str, list[Memory]]], batch_sync: bool) -> list[str]:
        """Write the touched files (without one fsync each when `batch_sync`: `_flush` then
        flushes them all at once); returns their paths."""
        written: list[str] = []
        for cid in sorted(self._clusters):
            written.append(self._write_or_remove(cid, archived=False))
        for cid in sorted(self._archive):
            written.append(self._write_or_remove(cid, archived=True))
        for name, mems in shards:
            path = self.paths.shard_file(name)
            text = shard_yaml(mems, self.w.fragments) if mems else None
            self._write(path, text, fsync=not batch_sync)
            written.append(str(path.relative_to(self.paths.root)))
        if not batch_sync:
            for d in DATA_DIRS:
                fsync_dir(self.paths.root / d)
        return written

    def _flush(self, written: list[str]) -> None:
        """After `git add`, before `git commit`: the files and the new objects."""
        w = self.w
        w.can_syncfs = syncfs(self.paths.root)
        if not w.can_syncfs:  # flush what was written without fsync, file by file
            for rel in written:
                fsync_file(self.paths.root / rel)
            for d in DATA_DIRS:
                fsync_dir(self.paths.root / d)
            os.sync()  # and the objects git wrote without fsync (paths not known here)

    def record(
        self, subject: str, body: str = "", trailers: dict[str, Any] | None = None
    ) -> str | None:
        """An empty commit that records an event (a session that changed nothing) in history."""
        self.w.check_writable()
        self.check_no_staged()
        sha = self.w.git.commit([], subject, body, trailers, allow_empty=True)
        self.w.publish(StoreChange(commit=sha))
        return sha

    def _write_or_remove(self, cid: str, archived: bool) -> str:
        area = self.state.archived if archived else self.state.clusters
        path = self.paths.cluster_file(cid, archived)
        if cid in area:
            self._write(
                path, cluster_yaml(area[cid], self.w.fragments), fsync=not self.w.can_syncfs
            )
        else:
            self._write(path, None)
        return str(path.relative_to(self.paths.root))

    def _write(self, path: Path, text: str | None, fsync: bool = True) -> None:
        """Write (None: remove) one file, and remember the blob it must be in the commit:
        a person's stash, reset or checkout between this write and the commit must not
        make the commit miss the change while the memories are acknowledged."""
        rel = str(path.relative_to(self.paths.root))
        trash = self.w.trash
        if text is None:
            trash.remove(path)
            self._blobs[rel] = self._keys[rel] = None
            return
        data = text.encode("utf-8")
        atomic_write_text(path, text, sync_dir=False, fsync=fsync, make_dir=True, trash=trash)
        self._keys[rel], self._blobs[rel] = file_key(path), blob_id(data)

    def revert(
        self,
        sha: str,
        subject: str,
        trailers: dict[str, Any],
        keep_out: frozenset[str] = frozenset(),
    ) -> str:
        """git revert one commit, then reload exactly the files it touched.

        The revert is checked before it is committed: a revert that git applies cleanly can
        still make an invalid store (a memory that moved on since comes back to its old
        place too, and is then stored twice); such a revert is refused like a conflict.
        `keep_out`: memory ids the result must not hold (forgotten ones, and the ones the
        reverted commit added that moved on since): taken out of the files the revert
        staged and of any other file holding them, in the same revert commit. A revert
        that changes nothing is refused (Conflict `nothing_to_revert`), never committed
        empty. The transaction marker makes a revert killed half-way be undone at start-up."""
        w = self.w
        w.check_writable()
        self.check_no_staged()
        w.begin_txn(subject)
        before = set(w.git.staged_files())  # the person's, if any: not the revert's
        try:
            full = w.git.revert_apply(sha)
        except Conflict:
            w.end_txn()
            raise
        staged = [p for p in w.git.staged_files() if p not in before]
        try:
            candidate, _ = read_changes(self.paths.root, w.state, staged)
            staged += self._keep_out(candidate, keep_out)
        except StoreError as exc:
            w.git.revert_abort()
            w.end_txn()
            raise Conflict(
                f"cannot revert {full[:10]}: the result would be invalid: {exc}"
            ) from None
        if not staged or not w.git.staged_differ(staged):
            w.git.revert_abort()
            w.end_txn()
            raise Conflict(
                f"reverting {full[:10]} changes nothing: what it did was undone or moved on "
                "by later commits, and none of its memories is still served",
                "nothing_to_revert",
            )
        new = w.git.revert_commit(full, subject, trailers, staged)
        w.end_txn()
        self.reload_paths(w.git.changed_files(new), commit=new)
        return new

    def _keep_out(self, candidate: StoreState, ids: frozenset[str]) -> list[str]:
        """Take `ids` out of the revert's result `candidate`: the files that held them
        written again and staged. Returns those files' paths."""
        root, paths = self.paths.root, self.paths
        hit = ids & candidate.memory_ids()
        if not hit:
            return []
        marked: list[tuple[str, str]] = []
        drop_memories(candidate, hit, lambda area, key: marked.append((area, key)))
        rels = []
        for area, key in marked:
            if area == "unsorted":
                mems = candidate.unsorted.get(key) or []
                path = paths.shard_file(key)
                text = shard_yaml(mems, self.w.fragments) if mems else None
            else:
                group = candidate.archived if area == "archive" else candidate.clusters
                path = paths.cluster_file(key, archived=area == "archive")
                text = cluster_yaml(group[key], self.w.fragments) if key in group else None
            if text is None:
                path.unlink(missing_ok=True)
            else:
                atomic_write_text(path, text, sync_dir=False)
            rels.append(str(path.relative_to(root)))
        self.git.run("add", "-A", "--", *rels)
        return rels

    def reload_paths(
        self, rel_paths: list[str], commit: str | None = None, settled: bool = False
    ) -> StoreChange:
        """Re-read the given store files from the working tree into the state (see
        `read_paths`) and publish them."""
        candidate, change = self.read_paths(rel_paths, settled)
        return self.adopt(candidate, change, commit)

    def read_paths(
        self, rel_paths: list[str], settled: bool = False
    ) -> tuple[StoreState, StoreChange]:
        """The state with the given store files re-read from the working tree, and the
        index changes to it; nothing is published. Raises StoreError when a file is broken
        or ids collide. `settled`: the files are taken only if no git command of the
        person's ran while they were read (a checkout rewrites the working tree before it
        moves HEAD): Paused otherwise."""
        head = self.git.head() if settled else None
        candidate, changes = read_changes(self.paths.root, self.w.state, rel_paths)
        if settled:
            self.git.check_not_paused()
            if self.git.head() != head:
                raise Paused("HEAD moved while clagd read the files; it reads them again")
        return candidate, changes

    def adopt(
        self, state: StoreState, change: StoreChange, commit: str | None = None
    ) -> StoreChange:
        """Make `state` (from `read_paths`) the served one; returns the change published."""
        change = replace(change, commit=commit)
        self.w.state = state
        self.w.publish(change)
        return change

    def reload_all(self) -> None:
        self.w.state = load_state(self.paths.root)
        self.w.publish(StoreChange.whole(self.w.state, self.w.git.head()))


class Writer(Generic[P]):
    def __init__(
        self,
        root: Path,
        state: StoreState,
        git: GitStore,
        publisher: Publisher[StoreChange, P] | None = None,
        fragments: Fragments | None = None,
        on_thread_start: Callable[[], None] | None = None,
    ) -> None:
        self.paths = Paths(Path(root))
        # the store's cache of its memories' file texts (`files.Fragments`)
        self.fragments = fragments if fragments is not None else Fragments()
        self.state = state
        self.git = git
        # where each change goes (the engine): `prepare` runs on the writer thread while the
        # git thread writes the commit's files and commits them (it must not touch git or
        # the files, nor change the state); `publish` gets what it made once committed
        self.publisher = publisher
        # called first on the writer thread and its git thread (the daemon nices them)
        self.on_thread_start = on_thread_start
        # a commit's files and git's commit run on this thread while the writer prepares
        self._git_thread = ThreadPoolExecutor(1, "clagd-writer-git", self._thread_started)
        # the old versions of the files it replaces or removes, unlinked after each commit
        # on the trash's reaper thread; what a crash left is unlinked now
        self.trash = Trash(self.paths.runtime / "trash", self._thread_started)
        self.trash.empty()
        # writes first; organizing's slices when writes give them room (`writequeue.py`)
        self._q: WriteQueue[Queued] = WriteQueue()
        self._thread = threading.Thread(target=self._run, name="clagd-writer", daemon=True)
        self._stopping = False
        # the daemon is stopping: long work (a session's slices) ends at its next step
        self.closing = False
        self.commits = 0
        self.can_syncfs = True  # until a syncfs call says otherwise
        self.failures = 0
        self.last_error = ""
        self._needs_restore = False
        self.branch = BranchFollower(self.paths.root, git)  # the person's git
        # a follower's writer never commits: why not (the primary's remote), "" on a primary
        self.read_only = ""
        self.moved_retries = 0  # commits retried after the branch moved under them
        self.rolled_back: set[str] = set()  # put back by rollbacks (`settle_own_staged`)
        self.holds = Holds()  # the longest operation the thread ran
        self.idle = WriterIdle()  # long work off the writer gives way (`store/holds.py`)
        # copies of the hot clusters, for snapshots; with the clusters' names and the
        # memories' places made after the start, in short operations (`Engine.start`)
        self.frozen = FrozenClusters()
        git.base = git.head()  # the commit the loaded working tree is on
        # what changed in the memory folders and the index, known without git
        self.watch = git.watch = ChangeWatch(self.paths.root, git.gitdir, DATA_DIRS)

    def check_writable(self) -> None:
        """Refuse every commit of a follower's (its history is the primary's)."""
        if self.read_only:
            raise ReadOnly(self.read_only)

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 60.0) -> None:
        """Run everything already queued, then stop."""
        if self._thread.is_alive():
            self._stopping = True
            self._q.close()
            self._thread.join(timeout)
        self._git_thread.shutdown(wait=False)
        self.trash.close()
        self.watch.close()

    @overload
    def submit(self, op: Callable[[WriteContext], R], *, background: bool = ...) -> Future[R]: ...
    @overload
    def submit(
        self, op: Callable[[WriteContext, A], R], arg: A, *, background: bool = ...
    ) -> Future[R]: ...
    def submit(
        self, op: Callable[..., Any], arg: Any = NO_ARG, *, background: bool = False
    ) -> Future[Any]:
        """Queue `op(ctx)` or `op(ctx, arg)`: an operation takes at most one argument, a
        small frozen dataclass when it needs more than one value. `background`: a slice of
        organizing, which gives way to writes (`writequeue.py`)."""
        fut: Future[Any] = Future()
        if self._stopping:
            fut.set_exception(StoreError("the daemon is shutting down"))
            return fut
        self.idle.queued()
        self._q.put(Queued(op, arg, fut), background)
        return fut

    @overload
    def call(self, op: Callable[[WriteContext], R], *, background: bool = ...) -> R: ...
    @overload
    def call(self, op: Callable[[WriteContext, A], R], arg: A, *, background: bool = ...) -> R: ...
    def call(self, op: Callable[..., Any], arg: Any = NO_ARG, *, background: bool = False) -> Any:
        """Submit and wait. On the writer thread itself, run inline (no deadlock)."""
        if threading.current_thread() is self._thread:
            return Queued(op, arg, Future()).run(WriteContext(self))
        return self.submit(op, arg, background=background).result()

    def pending(self) -> int:
        return len(self._q)

    def status(self) -> WriterStatus:
        """The `writer` section of `status`."""
        h = self.holds
        return WriterStatus(
            self.alive(),
            self.pending(),
            self.commits,
            self.failures,
            self.last_error,
            round(h.longest_ms, 1),
            h.longest,
            {k: round(v, 1) for k, v in sorted(h.by_op.items())},
        )

    def history_status(self) -> HistoryStatus:
        """The `history` section of `status`: what the history log recorded, and the moves
        of the branch this writer took in."""
        return self.branch.history.status(self.branch.outside_moves, self.moved_retries)

    # -- transaction marker: tells start-up that a change was half-written ----------
    @property
    def txn_file(self) -> Path:
        # in .git/: a person's `git clean -fdx` must not remove the mark of a change being
        # written (a kill after it would leave that change staged, taken for the person's)
        return self.git.gitdir / TXN_FILE

    def begin_txn(self, what: str, paths: list[str] | None = None) -> None:
        """Mark a change as being written: its subject, then the files it may touch (none
        listed: it may touch any file under the data folders)."""
        lines = [what.replace("\n", " ")] + list(paths or [])
        atomic_write_text(self.txn_file, "\n".join(lines) + "\n")

    def end_txn(self) -> None:
        self.txn_file.unlink(missing_ok=True)

    def commit_beside_prepare(
        self, commit: Callable[[], str | None], change: StoreChange
    ) -> tuple[str | None, P | None]:
        """`commit()` (the files, then git: staging, objects, tree, the branch's
        compare-and-swap, child processes on the other core) on the git thread while this
        thread runs the publisher's `prepare` for `change`. Returns the commit and what
        `prepare` made. A failed commit raises as ever (what was prepared is dropped, never
        published); a failed `prepare` is logged and leaves the work to `publish`."""
        if self.publisher is None or change.empty:
            return commit(), None
        fut = self._git_thread.submit(commit)
        prepared = None
        try:
            prepared = self.publisher.prepare(change)
        except Exception as exc:  # noqa: BLE001 - publish does the same work and reports it
            log.warning("preparing the index beside the commit failed: %s", exc)
        except BaseException:
            fut.exception()  # never leave git running unattended
            raise
        return fut.result(), prepared

    def settle_own_staged(self, staged: list[str]) -> set[str]:
        """The files among `staged` that a rollback of the daemon's put back, made as HEAD
        has them again; returns them. A person's `git commit` that starts between the
        daemon's staging of a file and the rollback's `git reset` of it commits the file,
        which the reset leaves staged as deleted: the daemon's doing, not the person's."""
        own = sorted(p for p in staged if p in self.rolled_back)
        if own:
            self.git.restore_paths(own)
            self.rolled_back.difference_update(own)
            log.info("put back as HEAD has them (a rollback raced a git commit): %s", own)
        return set(own)

    def publish(self, change: StoreChange, prepared: P | None = None) -> None:
        """`change` is committed (or taken in): the publisher serves it, from what its
        `prepare` made for this very change when given."""
        if change.commit:
            self.commits += 1
        self.frozen.changed(change)
        if self.publisher is not None and not change.empty:
            self.publisher.publish(change, prepared)

    # -- the thread ------------------------------------------------------------------
    def _thread_started(self) -> None:
        if self.on_thread_start is not None:
            self.on_thread_start()

    def _run(self) -> None:
        self._thread_started()
        while (item := self._q.get()) is not None:
            try:
                self._run_one(item)
            finally:
                self._q.done()
                self.idle.finished()

    def _run_one(self, item: Queued) -> None:
        fut, ctx = item.future, WriteContext(self)
        if not fut.set_running_or_notify_cancel():
            return
        started = time.perf_counter()
        try:
            if self._needs_restore:
                # an earlier rollback failed (disk full, read-only store): the state may
                # hold a change that is not in HEAD; nothing runs on it until restored
                self._restore_all()
            try:
                result = self._attempt(item, ctx)
            finally:  # before the caller hears: its next `status` shows this hold
                self.holds.note(item.name, (time.perf_counter() - started) * 1000)
        except Paused as exc:
            self.branch.paused = str(exc)  # shown in status until a write goes through
            # writes wait for the person; what this operation wrote goes back to HEAD
            if ctx.touched or self.txn_file.exists():
                self._rollback_worktree(ctx.touched_paths())
            fut.set_exception(exc)
        except BaseException as exc:  # noqa: BLE001 - reported through the future
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("write operation %s failed: %s", item.name, exc)
            if not self._needs_restore and (ctx.touched or self.txn_file.exists()):
                self._rollback_worktree(ctx.touched_paths())
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def _attempt(self, item: Queued, ctx: WriteContext) -> Any:
        """Run one operation on a view equal to the branch's HEAD. When its commit finds the
        branch moved meanwhile (the compare-and-swap failed: nothing was committed), its files
        go back to HEAD, the new HEAD is loaded and the operation runs again."""
        for attempt in range(MOVED_RETRIES + 1):
            self.sync()
            try:
                return item.run(ctx)
            except HeadMoved as exc:
                if attempt == MOVED_RETRIES:
                    raise
                self.moved_retries += 1
                log.info("%s; reloading HEAD and trying again", exc)
                if ctx.touched or self.txn_file.exists():
                    # (nothing touched: e.g. a hand edit's commit; the person's files stay)
                    self._rollback_worktree(ctx.touched_paths())
                ctx.clear()
        raise AssertionError("unreachable")

    def sync(self) -> None:
        """Before any write: refuse (Paused) while the person's git holds the store, and take
        in a move of the branch that the daemon did not make (`store/following.py`)."""
        moved = self.branch.sync(self.state)
        if moved is not None:
            self.watch.unsettle()  # staged against the new HEAD? the next check asks git
            self.state, change = moved
            self.publish(change)

    def _rollback_worktree(self, rel_paths: list[str]) -> None:
        """Put the files a failed operation touched back to HEAD and re-read exactly those
        from the daemon's commit (an operation marks a file before it changes the state
        behind it). Other files, and a hand edit in progress elsewhere, are left alone."""
        if rel_paths:
            try:
                self.git.restore_paths(rel_paths)
                self.rolled_back.update(rel_paths)
                self.end_txn()
                # the state goes back to the commit the view is on (`base`), from git's
                # objects: HEAD may be the person's checkout elsewhere (why the operation
                # paused) or files mid-way through their git (a moved branch: next `sync`)
                base = self.git.base
                texts = self.git.texts_at(base, rel_paths) if base else {}
                self.state, change = read_changes(self.paths.root, self.state, rel_paths, texts)
                self.publish(replace(change, commit=base))
                log.info("put %d file(s) back to HEAD after a failed operation", len(rel_paths))
                return
            except Exception as exc:  # noqa: BLE001 - fall back to the whole store
                log.warning("partial restore failed (%s); reloading the whole store", exc)
        try:
            self._restore_all()
            log.info("working tree put back to HEAD after a failed operation")
        except Exception as exc:  # noqa: BLE001
            self._needs_restore = True
            log.error("could not restore the working tree (retried before the next op): %s", exc)

    def _restore_all(self) -> None:
        self.git.reset_paths_to_head(DATA_DIRS)
        self.end_txn()
        # from the daemon's commit, not the working tree (see `_rollback_worktree`)
        base = self.git.base
        texts = self.git.texts_at(base, DATA_DIRS) if base else {}
        self.state = read_files(self.paths.root, StoreState(), sorted(texts), texts)[0]
        self._needs_restore = False
        self.publish(StoreChange.whole(self.state, base))
