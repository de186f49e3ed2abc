"""The engine: one store, its writer, its index snapshots and its statistics, behind the
operations that the socket server, `clagd eval` and the tests call.

Queries read the current index snapshot (swapped in by the writer after each commit) and
never wait for the writer or an SLM.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clagd.config import Config, load_config
from clagd.engine.loader import load_store
from clagd.engine.stats import AccessStats
from clagd.errors import BadRequest, Conflict, StoreError
from clagd.ingest.batch import IngestResult, ingest_items, route_shards
from clagd.ingest.inbox import Item, validate_item
from clagd.model import Memory, parse_time
from clagd.retrieval.index import Index
from clagd.store.files import Paths, StoreState, data_files, is_store
from clagd.store.gitrepo import GitStore
from clagd.store.writer import DATA_DIRS, Changes, WriteContext, Writer, read_changes

log = logging.getLogger("clagd")

# a route pass waits for the inbox to be quiet, but not longer than this after the first
# deferred batch (a steady stream of files still gets its memories into their clusters)
ROUTE_MAX_WAIT = 30.0
# Bumped whenever the pickled classes move or change shape (2: the layer subpackages). The
# header is read before anything is unpickled, so an older snapshot is refused without
# importing classes that no longer exist.
SNAPSHOT_FORMAT = 2
SNAPSHOT_MAGIC = b"clagd-startup-snapshot %d\n" % SNAPSHOT_FORMAT


class Engine:
    def __init__(self, root: Path, config: Config | None = None, start: bool = True) -> None:
        self.root = Path(root).resolve()
        if not is_store(self.root):
            raise StoreError(
                f"{self.root} is not a clagd store (create one with: clagd init {root})"
            )
        self.paths = Paths(self.root)
        self.paths.ensure_dirs()
        self.config = config or load_config(self.root)
        self.git = GitStore(self.root)
        self.started_at = time.time()
        self.notes: list[str] = self.git.recover()
        txn = self.paths.runtime / "txn"
        if txn.exists():
            # a killed daemon left a change half-written (its inputs are still in the inbox):
            # put back the files it named, or every data folder when it named none
            touched = [p for p in txn.read_text(encoding="utf-8").splitlines()[1:] if p.strip()]
            if touched:
                self.git.restore_paths(touched)
            else:
                self.git.reset_paths_to_head(DATA_DIRS)
            txn.unlink()
            self.notes.append("discarded a half-written change left by a stopped daemon")
        for note in self.notes:
            log.warning("recovery: %s", note)
        t0 = time.monotonic()
        self.head = self.git.head()
        self._snapshot_head: str | None = None
        self._snapshot_at = time.monotonic()
        self.load_processes = 1
        snap = self._load_snapshot()
        if snap is not None:
            state, self.index = snap
            self.load_source = "snapshot"
        else:
            loaded = load_store(self.root, self.config)
            state, self.index = loaded.state, loaded.index
            self.load_source = "files"
            self.load_processes = loaded.workers
        self._archive_index: Index | None = None
        self._archived = dict(state.archived)
        self.load_seconds = time.monotonic() - t0
        self.known = state.memory_ids()
        self.stats = AccessStats(self.paths.runtime / "stats.json")
        self.writer = Writer(self.root, state, self.git, on_change=self._on_change)
        self._summaries = self._summarize(state)
        self.counters: dict[str, int] = {
            "queries": 0,
            "added": 0,
            "duplicates": 0,
            "ingest_batches": 0,
            "ingest_failures": 0,
            "sessions": 0,
            "sessions_accepted": 0,
            "sessions_rolled_back": 0,
            "sessions_fallback": 0,
            "sessions_failed": 0,
            "archived": 0,
            "thawed": 0,
            "reverts": 0,
            "outside_edits": 0,
            "outside_edit_errors": 0,
            "routed": 0,
            "route_passes": 0,
            "route_failures": 0,
        }
        # unsorted shards of large batches, waiting for a route pass (name -> when added)
        self._route_pending: dict[str, float] = {}
        self._route_lock = threading.Lock()
        self._route_running = False
        self._last_ingest = 0.0
        self.new_since_session = 0
        self.rounds_since_session = 0
        self.outside_error = ""
        self._outside_sig: tuple | None = None
        self._blocked: set[str] = set()  # clusters whose file holds a broken hand edit
        self.session_lock = threading.Lock()
        self.last_session: dict[str, Any] | None = None
        # hooks set by the daemon: thresholds reached -> schedule a session; commits -> push
        self.on_threshold: Callable[[str], None] | None = None
        self.on_commit: Callable[[str], None] | None = None
        self.session_runner: Callable[..., dict[str, Any]] | None = None
        self.backend_status: Callable[[], dict[str, Any]] | None = None
        self.status_hooks: dict[str, Callable[[], Any]] = {}
        self.refiner: Any = None  # refine.Refiner when retrieval.slm_refine is on
        log.info(
            "store %s: %d memories in %d clusters, %d unsorted, %d archived clusters "
            "(%.2fs from %s, %d process%s)",
            self.root,
            len(self.index),
            self.index.n_clusters,
            sum(len(v) for v in state.unsorted.values()),
            len(state.archived),
            self.load_seconds,
            self.load_source,
            self.load_processes,
            "" if self.load_processes == 1 else "es",
        )
        if start:
            self.start()

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        self.writer.start()

    def close(self) -> None:
        if self.writer.alive():
            try:
                self.maybe_route(force=True)
            except Exception as exc:  # noqa: BLE001 - the memories stay unsorted, not lost
                log.warning("route pass at shutdown failed: %s", exc)
            try:
                self.writer.call(self._save_snapshot_op)
            except Exception as exc:  # noqa: BLE001 - only a start-up speed-up is lost
                log.warning("could not save the start-up snapshot: %s", exc)
        self.writer.stop()
        self.stats.save()

    # -- start-up snapshot: the loaded state and index, valid for one clean HEAD -----------
    @property
    def snapshot_file(self) -> Path:
        return self.paths.runtime / "snapshot.pickle"

    def _snapshot_key(self) -> dict[str, Any]:
        return {
            "format": SNAPSHOT_FORMAT,
            "retrieval": asdict(self.config.retrieval),
            "ingest": asdict(self.config.ingest),
        }

    def _load_snapshot(self) -> tuple[StoreState, Index] | None:
        """The state and index of a recent commit (saved at stop and periodically), brought
        up to date by re-reading only the files changed since then (git diff + uncommitted
        edits). Loading 100k memories from YAML takes far longer; a missing, foreign or
        unreadable snapshot just means a full load."""
        path = self.snapshot_file
        if not path.exists() or self.head is None:
            return None
        try:
            gc.disable()
            try:
                with open(path, "rb") as fh:
                    if fh.readline() != SNAPSHOT_MAGIC:
                        log.info("start-up snapshot has another format: loading every file")
                        return None
                    data = pickle.load(fh)
            finally:
                gc.enable()
            if data.get("key") != self._snapshot_key():
                return None
            snap_head, state, index = data["head"], data["state"], data["index"]
            changed = set(self.git.dirty_paths(DATA_DIRS))
            if snap_head != self.head:
                changed.update(self.git.changed_between(snap_head, self.head, DATA_DIRS))
            if changed:
                state, changes = read_changes(self.root, state, sorted(changed))
                index = index.apply(
                    upsert_clusters=changes.upsert_clusters,
                    remove_clusters=changes.remove_clusters,
                    add_unsorted=changes.add_unsorted,
                    remove_unsorted=changes.remove_unsorted,
                )
                self.notes.append(
                    f"start-up snapshot of {snap_head[:10]} brought up to date ({len(changed)} files re-read)"
                )
            self._snapshot_head = snap_head
            return state, index
        except Exception as exc:  # noqa: BLE001 - a bad snapshot only costs a full load
            log.warning("not using the start-up snapshot (%s): loading every file", exc)
            return None

    def maybe_snapshot(self, min_interval: float = 600.0) -> bool:
        """Save a fresh snapshot when the store moved on and the last one is old enough, so a
        start after a crash stays fast. Runs on the writer (it must see a consistent state)."""
        if self.head == self._snapshot_head or time.monotonic() - self._snapshot_at < min_interval:
            return False
        self.writer.submit(self._save_snapshot_op)
        return True

    def _save_snapshot_op(self, ctx: WriteContext) -> None:
        head = ctx.git.head()
        if head is None or ctx.git.dirty_paths(DATA_DIRS):
            return
        self._snapshot_at = time.monotonic()
        data = {"key": self._snapshot_key(), "head": head, "state": ctx.state, "index": self.index}
        tmp = self.snapshot_file.with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            fh.write(SNAPSHOT_MAGIC)
            pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.snapshot_file)
        self._snapshot_head = head

    @property
    def state(self) -> StoreState:
        """The writer's state. Read it only on the writer thread or for rough counts."""
        return self.writer.state

    # -- publishing snapshots (runs on the writer thread) ---------------------------------
    def _on_change(self, changes: Changes, state: StoreState) -> None:
        if changes.full:
            self.index = Index.build(state.clusters, state.unsorted_memories(), self.config)
            self.known = state.memory_ids()
        elif (
            changes.upsert_clusters
            or changes.remove_clusters
            or changes.add_unsorted
            or changes.remove_unsorted
        ):
            self.index = self.index.apply(
                upsert_clusters=changes.upsert_clusters,
                remove_clusters=changes.remove_clusters,
                add_unsorted=changes.add_unsorted,
                remove_unsorted=changes.remove_unsorted,
            )
        if changes.full or changes.archive_changed:
            self._archived = dict(state.archived)
            self._archive_index = None
        if (
            changes.full
            or changes.archive_changed
            or changes.upsert_clusters
            or changes.remove_clusters
        ):
            self._summaries = self._summarize(state)
        if changes.commit:
            self.head = changes.commit
            if self.on_commit is not None:
                self.on_commit(changes.commit)

    def _summarize(self, state: StoreState) -> list[dict[str, Any]]:
        out = []
        for archived, area in ((False, state.clusters), (True, state.archived)):
            for c in area.values():
                out.append(
                    {
                        "id": c.id,
                        "name": c.name,
                        "description": c.description,
                        "tags": list(c.tags),
                        "size": len(c.memories),
                        "archived": archived,
                        "pinned": c.pinned,
                        "created_at": c.created_at,
                        "updated_at": c.updated_at,
                    }
                )
        return out

    def archive_index(self) -> Index:
        idx = self._archive_index
        if idx is None:
            idx = Index.build(self._archived, [], self.config)
            self._archive_index = idx
        return idx

    # -- adding ---------------------------------------------------------------------------
    def add(self, raw_items: list[Any], source: str = "socket") -> dict[str, Any]:
        """Validate every item first (all or nothing), then commit them as one batch."""
        if not isinstance(raw_items, list) or not raw_items:
            raise BadRequest("'items' must be a non-empty list")
        items = [validate_item(r, f"item {i + 1}") for i, r in enumerate(raw_items)]
        return self.ingest(items, source=source).to_dict()

    def ingest(self, items: list[Item], source: str = "inbox", files: int = 0) -> IngestResult:
        try:
            res: IngestResult = self.writer.call(self._ingest_op, items, source, files)
        except Exception:
            self.counters["ingest_failures"] += 1
            raise
        self.counters["ingest_batches"] += 1
        self.counters["added"] += len(res.added)
        self.counters["duplicates"] += len(res.duplicates)
        self.counters["routed"] += sum(res.routed.values())
        if res.added:
            self.new_since_session += len(res.added)
            if self.new_since_session >= self.config.session.memory_add_threshold:
                self._threshold("memories")
        return res

    def _ingest_op(
        self, ctx: WriteContext, items: list[Item], source: str, files: int
    ) -> IngestResult:
        # Take in an outside change first (a hand edit, a user's commit): routing a memory
        # into a cluster rewrites its file, which must not undo an edit not yet noticed.
        self._outside_op(ctx)
        res = ingest_items(
            ctx,
            items,
            self._route,
            source,
            files,
            self.known,
            self._blocked,
            route_limit=self.config.ingest.route_inline_max,
        )
        now = time.monotonic()
        self._last_ingest = now
        if res.deferred and res.shard:
            with self._route_lock:
                self._route_pending[res.shard] = now
        return res

    # -- the route pass: large batches' memories into their clusters ----------------------
    def route_due(self, now: float | None = None) -> bool:
        """A route pass is waiting and the inbox has been quiet for `route_delay_seconds`
        (or the first waiting batch is ROUTE_MAX_WAIT old)."""
        with self._route_lock:
            if not self._route_pending:
                return False
            oldest = min(self._route_pending.values())
        now = time.monotonic() if now is None else now
        quiet = now - self._last_ingest >= self.config.ingest.route_delay_seconds
        return quiet or now - oldest >= ROUTE_MAX_WAIT

    def maybe_route(self, force: bool = False, wait: bool = True) -> dict[str, Any] | None:
        """Run the route pass when it is due (or waiting at all, with `force`). With
        `wait=False` (housekeeping) it is queued on the writer and this returns at once."""
        with self._route_lock:
            if self._route_running or not self._route_pending:
                return None
        if not (force or self.route_due()):
            return None
        with self._route_lock:
            self._route_running = True
        fut = self.writer.submit(self._route_op)
        fut.add_done_callback(self._route_done)
        return fut.result() if wait else None

    def _route_done(self, fut: Future) -> None:
        with self._route_lock:  # also when the op never ran (the writer was stopping)
            self._route_running = False
        exc = fut.exception()
        if exc is not None:
            log.warning("route pass failed (tried again later): %s", exc)

    def _route_op(self, ctx: WriteContext) -> dict[str, Any]:
        # as for ingest: take in a hand edit first, routing rewrites cluster files
        self._outside_op(ctx)
        with self._route_lock:
            taken = list(self._route_pending)
        # the shards stay listed as waiting until the pass has committed (a failed pass is
        # tried again at the next due time)
        try:
            res = route_shards(ctx, taken, self._route, self._blocked)
        except BaseException:
            self.counters["route_failures"] += 1
            raise
        finally:
            with self._route_lock:
                self._route_running = False
        with self._route_lock:
            for name in taken:
                self._route_pending.pop(name, None)
        self.counters["route_passes"] += 1
        self.counters["routed"] += res.routed
        if res.commit:
            log.info(
                "route pass: %d memories into %d clusters (%s)",
                res.routed,
                res.clusters,
                res.commit[:10],
            )
        return res.to_dict()

    def _route(self, memories: list[Memory]) -> list[str | None]:
        return self.index.route_many(memories)

    def _threshold(self, why: str) -> None:
        if self.on_threshold is not None:
            self.on_threshold(why)

    # -- reading --------------------------------------------------------------------------
    def query(
        self,
        text: str,
        max_memories: int | None = None,
        token_budget: int | None = None,
        include_archive: bool = False,
        count_round: bool = True,
    ) -> dict[str, Any]:
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("'text' must be a non-empty string")
        if max_memories is not None and (
            not isinstance(max_memories, int) or not 0 < max_memories <= 100
        ):
            raise BadRequest("'max_memories' must be an integer from 1 to 100")
        if token_budget is not None and (not isinstance(token_budget, int) or token_budget < 0):
            raise BadRequest("'token_budget' must be a non-negative integer")
        t0 = time.perf_counter()
        archive = self.archive_index() if include_archive else None
        index = self.index  # one snapshot for the whole query
        # optional SLM pick among the lexical candidates (None: the lexical choice);
        # `refiner` is set by the daemon when retrieval.slm_refine is on
        refiner = getattr(self, "refiner", None)
        chosen = refiner.choose(index, text) if refiner is not None else None
        res = index.search(text, max_memories, token_budget, archive=archive, clusters=chosen)
        out = res.to_dict()
        archived_ids = (
            {c["id"] for c in self._summaries if c["archived"]} if include_archive else set()
        )
        for m in out["memories"]:
            m["archived"] = m["cluster_id"] in archived_ids
        self.stats.record(
            [h.memory.id for h in res.memories],
            sorted({h.cluster_id for h in res.memories if h.cluster_id}),
        )
        out["took_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        self.counters["queries"] += 1
        if count_round:
            self.round(1)
        hit_archived = sorted({m["cluster_id"] for m in out["memories"] if m["archived"]})
        if hit_archived and self.config.archive.thaw_on_hit:
            self.writer.submit(self._thaw_op, hit_archived)
            out["thawing"] = hit_archived
        return out

    def round(self, n: int = 1) -> dict[str, Any]:
        if not isinstance(n, int) or n < 1:
            raise BadRequest("'n' must be a positive integer")
        self.rounds_since_session += n
        if self.rounds_since_session >= self.config.session.dialogue_round_threshold:
            self._threshold("rounds")
        return {"rounds_since_session": self.rounds_since_session}

    def clusters(self, include_archive: bool = False) -> dict[str, Any]:
        out = []
        for c in self._summaries:
            if c["archived"] and not include_archive:
                continue
            count, last = self.stats.cluster(c["id"])
            out.append({**c, "access_count": count, "last_accessed": _iso(last)})
        out.sort(key=lambda c: (c["archived"], -c["size"], c["name"]))
        return {"clusters": out, "unsorted": self.index_unsorted_count()}

    def index_unsorted_count(self) -> int:
        return len(self.index) - sum(c["size"] for c in self._summaries if not c["archived"])

    def status(self) -> dict[str, Any]:
        counts = {
            "memories": len(self.index),
            "clusters": sum(1 for c in self._summaries if not c["archived"]),
            "archived_clusters": sum(1 for c in self._summaries if c["archived"]),
            "archived_memories": sum(c["size"] for c in self._summaries if c["archived"]),
            "unsorted": self.index_unsorted_count(),
        }
        out: dict[str, Any] = {
            "store": str(self.root),
            "head": self.head,
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "load_seconds": round(self.load_seconds, 3),
            "load_source": self.load_source,
            "load_processes": self.load_processes,
            "route_pending": len(self._route_pending),
            "counts": counts,
            "counters": dict(self.counters),
            "writer": {
                "alive": self.writer.alive(),
                "pending": self.writer.pending(),
                "commits": self.writer.commits,
                "failures": self.writer.failures,
                "last_error": self.writer.last_error,
            },
            "new_since_session": self.new_since_session,
            "rounds_since_session": self.rounds_since_session,
            "last_session": self.last_session,
            "outside_edit_error": self.outside_error,
            "recovery": self.notes,
        }
        if self.backend_status is not None:
            out["backend"] = self.backend_status()
        for key, hook in self.status_hooks.items():
            out[key] = hook()
        return out

    def log(self, n: int = 20) -> dict[str, Any]:
        if not isinstance(n, int) or not 0 < n <= 10_000:
            raise BadRequest("'n' must be an integer from 1 to 10000")
        entries = self.git.log(n)
        for e in entries:
            t = e["trailers"]
            e["session"] = t.get("session")
            e["status"] = t.get("status")
            e["trigger"] = t.get("trigger")
            e["backend"] = t.get("backend")
        return {"entries": entries}

    # -- history ------------------------------------------------------------------------
    def revert(self, ref: str) -> dict[str, Any]:
        """Revert one commit, or every commit of a session (newest first), through git."""
        if not isinstance(ref, str) or not ref.strip():
            raise BadRequest("'ref' must be a commit or a session id")
        ref = ref.strip()
        shas = self.git.find_by_trailer("session", ref) if not _looks_like_sha(ref) else []
        if not shas:
            shas = [self.git.resolve(ref)]
        result = self.writer.call(self._revert_op, shas, ref)
        self.counters["reverts"] += 1
        return result

    def _revert_op(self, ctx: WriteContext, shas: list[str], ref: str) -> dict[str, Any]:
        done: list[str] = []
        start_head = ctx.git.head()
        try:
            for sha in shas:
                entry = ctx.git.log(1, sha)[0]
                if entry["kind"] == "revert" and sha != shas[0]:
                    continue
                new = ctx.revert(
                    sha,
                    f"revert: {entry['subject']}"[:200],
                    {"kind": "revert", "reverts": sha, "session": entry["trailers"].get("session")},
                )
                done.append(new)
        except (Conflict, StoreError):
            if done and start_head:  # a session of several commits: all or nothing
                ctx.git.run("reset", "-q", "--hard", start_head)
                ctx.reload_all()
            raise
        self.known = ctx.state.memory_ids()
        return {"reverted": shas, "commits": done, "head": ctx.git.head()}

    # -- outside edits --------------------------------------------------------------------
    def check_outside(self) -> dict[str, Any] | None:
        """Notice hand edits and git commands run in the store; validate and reload."""
        return self.writer.call(self._outside_op)

    def _outside_op(self, ctx: WriteContext) -> dict[str, Any] | None:
        head = ctx.git.head()
        dirty = ctx.git.dirty_paths(DATA_DIRS)
        moved = head != self.head
        if not moved and not dirty:
            # back in step with HEAD (e.g. a broken edit was undone): nothing to report
            self._outside_sig = None
            self.outside_error = ""
            self._blocked = set()
            return None
        sig = (head, tuple(sorted((p, _mtime(self.root / p)) for p in dirty)))
        if sig == self._outside_sig:
            return None  # already reported this exact broken state
        changed = set(dirty)
        if moved and self.head:
            try:
                changed.update(ctx.git.changed_between(self.head, head or "HEAD", DATA_DIRS))
            except Exception:  # noqa: BLE001 - unrelated history: reload everything
                changed.update(data_files(self.root))
        try:
            ctx.reload_paths(sorted(changed), commit=None)
        except StoreError as exc:
            self._outside_sig = sig
            self._blocked = {Path(p).stem for p in dirty if p.startswith("clusters/")}
            self.outside_error = str(exc)
            self.counters["outside_edit_errors"] += 1
            log.error("outside edit rejected, still serving the last good state: %s", exc)
            return {"ok": False, "error": str(exc)}
        self.outside_error = ""
        self._outside_sig = None
        self._blocked = set()
        self.known = ctx.state.memory_ids()
        sha = None
        if dirty:
            sha = ctx.git.commit(
                dirty,
                f"edit: {len(dirty)} file(s) changed outside clagd",
                "\n".join(dirty),
                {"kind": "edit"},
            )
        self.head = ctx.git.head()
        self.counters["outside_edits"] += 1
        log.info(
            "outside change loaded (%d files%s)",
            len(changed),
            f", committed {sha[:10]}" if sha else "",
        )
        return {"ok": True, "files": sorted(changed), "commit": sha}

    # -- archive ----------------------------------------------------------------------
    def archive(self, dry_run: bool = False, now: float | None = None) -> dict[str, Any]:
        return self.writer.call(self._archive_op, dry_run, now)

    def cold_clusters(self, state: StoreState, now: float | None = None) -> list[str]:
        cfg = self.config.archive
        now = time.time() if now is None else now
        cold = []
        for c in state.clusters.values():
            if c.pinned or len(c.memories) < cfg.min_size:
                continue
            _count, last = self.stats.cluster(c.id)
            if last is None:
                last = max(_epoch(c.updated_at), _epoch(c.created_at))
            if now - last >= cfg.cold_after_days * 86400:
                cold.append(c.id)
        return sorted(cold)

    def _archive_op(self, ctx: WriteContext, dry_run: bool, now: float | None) -> dict[str, Any]:
        cold = self.cold_clusters(ctx.state, now)
        names = [ctx.state.clusters[c].name for c in cold]
        if dry_run or not cold:
            return {"dry_run": dry_run, "clusters": cold, "names": names, "commit": None}
        for cid in cold:
            ctx.touch_cluster(cid)
            ctx.touch_archive(cid)
            ctx.state.archived[cid] = ctx.state.clusters.pop(cid)
        sha = ctx.commit(
            f"archive: {len(cold)} cold cluster(s)",
            "\n".join(f"- {cid}: {n}" for cid, n in zip(cold, names)),
            {"kind": "archive", "clusters": len(cold)},
        )
        self.counters["archived"] += len(cold)
        return {"dry_run": False, "clusters": cold, "names": names, "commit": sha}

    def _thaw_op(self, ctx: WriteContext, cids: list[str]) -> dict[str, Any]:
        cids = [c for c in cids if c in ctx.state.archived]
        if not cids:
            return {"clusters": [], "commit": None}
        for cid in cids:
            ctx.touch_cluster(cid)
            ctx.touch_archive(cid)
            ctx.state.clusters[cid] = ctx.state.archived.pop(cid)
            self.stats.touch_cluster(cid)
        sha = ctx.commit(
            f"thaw: {len(cids)} cluster(s) back from the archive",
            "\n".join(f"- {c}: {ctx.state.clusters[c].name}" for c in cids),
            {"kind": "thaw", "clusters": len(cids)},
        )
        self.counters["thawed"] += len(cids)
        return {"clusters": cids, "commit": sha}

    def thaw(self, cids: list[str]) -> dict[str, Any]:
        return self.writer.call(self._thaw_op, cids)

    # -- sessions ------------------------------------------------------------------------
    def recluster(self, trigger: str = "manual", backend: str | None = None) -> dict[str, Any]:
        """Run one clustering session now (waiting for any running one) and report it."""
        if self.session_runner is None:
            # no daemon wired one in (eval, scripts, tests): the backend config decides
            from clagd.organize.session import engine_session_runner
            from clagd.slm.manager import BackendManager

            self.session_runner = engine_session_runner(BackendManager(self.config))
        self.check_outside()
        if self.outside_error:
            # a session rewrites cluster files: not while one of them holds a broken edit
            raise Conflict(
                f"no clustering session while a hand edit is broken: {self.outside_error}"
            )
        with self.session_lock:
            self.new_since_session = 0
            self.rounds_since_session = 0
            outcome = self.session_runner(self, trigger=trigger, backend=backend)
        self.last_session = outcome
        self.counters["sessions"] += 1
        key = f"sessions_{outcome.get('status', 'failed')}"
        if key in self.counters:
            self.counters[key] += 1
        return outcome


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return (
        datetime.fromtimestamp(ts, timezone.utc)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z")
    )


def _epoch(s: str) -> float:
    dt = parse_time(s)
    return dt.timestamp() if dt else 0.0


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _looks_like_sha(ref: str) -> bool:
    return 4 <= len(ref) <= 40 and all(c in "0123456789abcdef" for c in ref.lower())
