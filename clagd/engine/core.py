"""The engine: one store, its writer, its index snapshots and its statistics, behind the
operations that the socket server, `clagd eval` and the tests call.

Queries read the current index snapshot (swapped in by the writer after each commit) and
never wait for the writer or an SLM. The parts live beside this module, one job each:
`recovery` (what a killed daemon left), `warmstart` (the fast start), `routing` (route-pass
bookkeeping), `outside` (hand edits and git commands), `archive`, `history` (revert),
`summary` (what `status` and `clusters` show), `hooks` (what the daemon plugs in), `answer`
(a query's reply from one snapshot), `requests` (the writer operations' arguments) and
`forget_ops` (forget and purge, a base class of `Engine`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clagd.config import Config, load_config
from clagd.engine import archive, history, lookup, summary, updating
from clagd.engine.answer import answer
from clagd.engine.forget_ops import ForgetOps
from clagd.engine.hooks import EngineHooks, SessionRunner
from clagd.engine.loader import gc_paused, load_store
from clagd.engine.outside import OutsideChange, OutsideEdits
from clagd.engine.recovery import recover
from clagd.engine.requests import (
    MAX_ROUNDS,
    ArchiveRun,
    IngestBatch,
    NextIndex,
)
from clagd.engine.results import (
    Added,
    Archived,
    ClusterList,
    Log,
    MemoryList,
    MemoryRecord,
    QueryResult,
    Reverted,
    Rounds,
    Status,
    Thawed,
)
from clagd.engine.route_ops import RouteOps
from clagd.engine.routing import RouteQueue, Scorer
from clagd.engine.stats import STATS_FILE, AccessStats
from clagd.engine.updating import Updated, UpdateRequest
from clagd.engine.warmstart import WarmStart, reread_at
from clagd.errors import BadRequest, Conflict, Paused, StoreError
from clagd.ingest import supersede
from clagd.ingest.batch import IngestResult, ingest_items
from clagd.ingest.inbox import Item, validate_item
from clagd.ingest.turns import stored_roles, turn_items
from clagd.model import Memory, iso_utc
from clagd.organize.size_policy import SessionMemo
from clagd.protocol import ListParams, QueryParams
from clagd.retrieval.index import Index
from clagd.scopes import DEFAULT_SCOPE, check_scope, scope_or_default
from clagd.store.create import is_store
from clagd.store.files import Fragments, IgnoredFiles, Paths, StoreState, is_data_path
from clagd.store.gitrepo import GitStore
from clagd.store.holds import giving_way
from clagd.store.packing import ObjectPacker
from clagd.store.special import SpecialFiles
from clagd.store.writer import DATA_DIRS, StoreChange, WriteContext, Writer

if TYPE_CHECKING:
    from clagd.organize.session import SessionOutcome

log = logging.getLogger("clagd")

# cluster copies one of the writer's operations after the start makes (`_prime_op`): 6-13
# ms at 11k clusters (in process, quiet)
PRIME_SLICE = 2000


class Engine(ForgetOps, RouteOps):
    def __init__(
        self,
        root: Path,
        config: Config | None = None,
        start: bool = True,
        hooks: EngineHooks | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self._open(root)
        self.config = config or load_config(self.root)
        self.hooks = hooks or EngineHooks()
        self.git = GitStore(self.root, self.config.git.branch)
        self.packer = ObjectPacker(self.root, self.config.git.gc_interval_minutes * 60)
        self.started_at = time.time()
        self.notes: list[str] = recover(self.git, self.paths)
        # the store's own caches (never shared with another store's): of its files, and
        # what its sessions remember between them
        self.fragments = Fragments()
        self.ignored = IgnoredFiles(self.root)
        self.special = SpecialFiles(self.root, DATA_DIRS)
        self.session_memo = SessionMemo()
        # the load and everything made from the loaded state (the writer's frozen copies,
        # names table and places, the summaries) without a cyclic GC pass over the growing
        # heap: they only allocate what they keep (the daemon freezes it all once serving)
        with gc_paused():
            state = self._load()
            self._archive_index: Index | None = None
            self._archived = dict(state.archived)
            self.known = state.memory_ids()
            self.stats = AccessStats(
                self.git.gitdir / STATS_FILE, self.paths.runtime / "stats.json"
            )
            self.writer: Writer[NextIndex] = Writer(
                self.root,
                state,
                self.git,
                publisher=self,
                fragments=self.fragments,
                on_thread_start=self.hooks.on_thread_start,
            )
            self._summaries = summary.summarize(state)
            self._counts = summary.CountsMemo()
        self.counters = summary.new_counters()
        self.routes = RouteQueue(self.config.ingest.route_delay_seconds)
        # off the writer, giving way to its writes
        self.scorer = Scorer(self.routes, self.hooks.on_thread_start, self.writer.idle)
        self.outside = OutsideEdits(self.root)
        self.new_since_session = 0
        self.rounds_since_session = 0
        self.session_lock = threading.Lock()
        self.last_session: SessionOutcome | None = None
        self._log_loaded(state)
        if start:
            self.start()

    def _open(self, given: Path) -> None:
        if not is_store(self.root):
            raise StoreError(
                f"{self.root} is not a clagd store (create one with: clagd init {given})"
            )
        self.paths = Paths(self.root)
        self.paths.ensure_dirs()

    def _load(self) -> StoreState:
        """The state and first index snapshot: from the warm-start file when it is usable,
        else from every YAML file (in several processes for a large store)."""
        t0 = time.monotonic()
        self.head = self.git.head()
        self.warmstart = WarmStart(self.paths.runtime, self.config)
        self.load_processes = 1
        warm = self.warmstart.load(self.root, self.git, self.head)
        if warm is not None:
            state, self.index = warm.state, warm.index
            self.load_source = "warmstart"
            if warm.note:
                self.notes.append(warm.note)
        else:
            loaded = load_store(self.root, self.config, fragments=self.fragments)
            state, self.index = loaded.state, loaded.index
            self.load_source = "files"
            self.load_processes = loaded.workers
        state = self._served_from_head(state)
        self.load_seconds = time.monotonic() - t0
        return state

    def _served_from_head(self, state: StoreState) -> StoreState:
        """The state as HEAD holds it. The working tree may hold changes that are not in
        HEAD: a hand edit (taken in and committed by the first outside check, then served),
        or a person's staged files (a `stash pop`, a git command that lost git's race for
        HEAD: writes pause until the person commits or resets). Served before they are
        committed, such a change would stay served after a `reset --hard` drops it."""
        pending = sorted(
            {p for p in self.git.dirty_paths(DATA_DIRS) if is_data_path(p)}
            # a symlink, FIFO or hard-linked file is never read: what HEAD holds is served
            | {p for p in self.special.refresh() if is_data_path(p)}
        )
        self._outside_at_start = bool(pending)
        if not pending or not self.head:
            return state
        state, self.index = reread_at(self.root, self.git, self.head, pending, state, self.index)
        log.info("%d file(s) differ from HEAD: serving HEAD until they are taken in", len(pending))
        return state

    def _log_loaded(self, state: StoreState) -> None:
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

    # -- lifecycle --------------------------------------------------------------------
    def start(self, prime: bool = True) -> None:
        """Start the writer. `prime`: queue `_prime_op` now (the daemon calls `prime` once
        it serves, so the copies do not share the CPU with the rest of its start)."""
        self.writer.start()
        if prime:
            self.prime()
        if self._outside_at_start:
            # a hand edit made while no daemon ran: committed, then served (see
            # `_served_from_head`); a person's staged files pause writes until resolved
            try:
                self.check_outside()
            except Exception as exc:  # noqa: BLE001 - reported by status; retried later
                log.warning("could not take in the changes made while stopped: %s", exc)

    def prime(self) -> None:
        self.writer.submit(self._prime_op, 0)

    def _prime_op(self, ctx: WriteContext, step: int) -> None:
        """What the writer keeps for the first session, made once the daemon serves, in
        operations of PRIME_SLICE cluster copies, then the clusters' names, then every
        memory's place (`store.frozen`, `StoreState.places`), each queued behind the writes
        waiting: made before the start's first answer they took 0.3-0.4 s at 100k, and
        made by the first session they would hold the writer as long."""
        frozen = self.writer.frozen
        if self.writer.closing:
            return
        # no cyclic GC pass inside: the daemon freezes its heap only once it serves, and a
        # full collection over the loaded store's unfrozen objects held one op 225 ms
        with gc_paused():
            if step == 0:
                done = frozen.prime(ctx.state, PRIME_SLICE)
                self.writer.submit(self._prime_op, 1 if done else 0)
            elif step == 1:
                frozen.names(ctx.state)
                self.writer.submit(self._prime_op, 2)
            else:
                ctx.state.note_all_places()

    def close(self) -> None:
        self.writer.closing = True  # a session in progress stops at its next step
        self.scorer.close()
        # a pass waiting for the scorer (cancelled just now) ends here: the last one below
        self.routes.release()
        if self.writer.alive():
            try:
                if not self.writer.read_only:  # a follower never routes (nor commits)
                    self.maybe_route(force=True)
            except Exception as exc:  # noqa: BLE001 - the memories stay unsorted, not lost
                log.warning("route pass at shutdown failed: %s", exc)
            try:
                self.writer.call(self._save_warmstart_op)
            except Exception as exc:  # noqa: BLE001 - only a start-up speed-up is lost
                log.warning("could not save the warm-start file: %s", exc)
        self.writer.stop()
        self.packer.stop()
        self.stats.save()

    def maybe_pack(self) -> bool:
        """Start `git gc --auto` in the background when it is due and the person's git does
        not hold the store (see clagd/store/packing.py). Returns whether one was started."""
        if self.git.pause_reason(locks=False):
            self.packer.poll()
            return False
        return self.packer.maybe_start()

    def maybe_save_warmstart(self, min_interval: float = 600.0) -> bool:
        """Save a fresh warm-start file when the store moved on and the last one is old
        enough, so a start after a crash stays fast. Queued on the writer."""
        if not self.warmstart.due(self.head, min_interval):
            return False
        self.writer.submit(self._save_warmstart_op)
        return True

    def save_warmstart(self) -> None:
        """Save the warm-start file now and wait for it (after a follower followed a rewrite:
        the file must not keep what the rewrite removed): a file that could not be saved
        at the served commit is removed instead."""
        self.writer.call(self._save_warmstart_op)
        if self.warmstart.saved_head != self.head:
            self.warmstart.path.unlink(missing_ok=True)

    def _save_warmstart_op(self, ctx: WriteContext) -> None:
        self.warmstart.save(ctx, self.index)

    @property
    def state(self) -> StoreState:
        """The writer's state. Read it only on the writer thread or for rough counts."""
        return self.writer.state

    # -- the writer's publisher (`clagd.change.Publisher`, on the writer thread) ----------
    def prepare(self, change: StoreChange) -> NextIndex | None:
        """A commit's files are being written and committed (on the git thread): the next
        snapshot is made now, beside it, by the engine and by its index publisher (the
        query processes, on the other core); none is served before `publish`."""
        if change.index.empty:
            return None
        theirs = None
        if self.hooks.index_publisher is not None:
            theirs = self.hooks.index_publisher.prepare(change.index)
        return NextIndex(self.index.apply(change.index, routes=True), theirs)

    def publish(self, change: StoreChange, prepared: NextIndex | None) -> None:
        """`change` is committed (or taken in): serve the snapshot `prepare` made for it,
        or make it now when none was (a reload, a failed `prepare`)."""
        idx = change.index
        if idx.build or change.reloaded:
            # taken in from outside: memories may have left, and must not stay "known"
            self.known = self.state.memory_ids()
        if not idx.empty:
            if prepared is None:
                prepared = NextIndex(self.index.apply(idx, routes=True))
            self.index = prepared.index
            if self.hooks.index_publisher is not None:
                self.hooks.index_publisher.publish(idx, prepared.theirs)
        if idx.build or change.archive_changed:
            self._archived = dict(self.state.archived)
            self._archive_index = None
        self._summaries = summary.after(self._summaries, self.state, change)
        if change.commit:
            self.head = change.commit
            if self.hooks.on_commit is not None:
                self.hooks.on_commit(change.commit)

    def archive_index(self) -> Index:
        idx = self._archive_index
        if idx is None:
            idx = Index.build(self._archived, [], self.config.retrieval, self.config.ingest)
            self._archive_index = idx
        return idx

    # -- adding ---------------------------------------------------------------------------
    def add(self, raw_items: list[Any], source: str = "socket", scope: object = None) -> Added:
        """Validate every item first (all or nothing), then commit them as one batch.
        `scope`: the request's (None: the default; an item may name it again, not another)."""
        if not isinstance(raw_items, list) or not raw_items:
            raise BadRequest("'items' must be a non-empty list")
        given = None if scope is None else check_scope(scope)
        items = [validate_item(r, f"item {i + 1}", given) for i, r in enumerate(raw_items)]
        return Added.of(self.ingest(items, source=source))

    def add_messages(
        self, raw: object, metadata: object = None, source: str = "socket", scope: object = None
    ) -> Added:
        """Chat messages, one memory per turn of the roles configured (`ingest.turns`),
        every message checked first; `skipped` counts the turns left out by role.
        `scope`: the request's, as for `add`."""
        if not isinstance(raw, list) or not raw:
            raise BadRequest("'messages' must be a non-empty list of chat messages")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be an object (shared by every turn)")
        given = None if scope is None else check_scope(scope)
        items = turn_items(raw, metadata, scope=given)
        kept = self.kept_turns(items)
        return Added.of(self.ingest(kept, source=source), skipped=len(items) - len(kept))

    def ingest(self, items: list[Item], source: str = "inbox", files: int = 0) -> IngestResult:
        items = self.kept_turns(items)
        try:
            res: IngestResult = self.writer.call(self._ingest_op, IngestBatch(items, source, files))
        except Exception:
            self.counters["ingest_failures"] += 1
            raise
        self.counters["ingest_batches"] += 1
        self.counters["added"] += len(res.added)
        self.counters["duplicates"] += len(res.duplicates)
        self.counters["routed"] += sum(res.routed.values())
        self.counters["superseded"] += len(res.supersedes)
        if res.added:
            self.new_since_session += len(res.added)
            if self.new_since_session >= self.config.session.memory_add_threshold:
                self._threshold("memories")
        return res

    def kept_turns(self, items: list[Item]) -> list[Item]:
        """The items to store: every memory, and the conversation turns of the roles
        configured (`ingest.turns`: user turns, and assistant ones with
        `ingest.assistant_turns`)."""
        roles = stored_roles(self.config.ingest.assistant_turns)
        return [it for it in items if it.role is None or it.role in roles]

    def _ingest_op(self, ctx: WriteContext, batch: IngestBatch) -> IngestResult:
        # Take in an outside change first (a hand edit, a user's commit): routing a memory
        # into a cluster rewrites its file, which must not undo an edit not yet noticed.
        self._outside_op(ctx)
        res = ingest_items(
            ctx,
            batch.items,
            self._route,
            batch.source,
            batch.files,
            self.known,
            self.outside.blocked,
            route_limit=self.config.ingest.route_inline_max,
            find_superseded=self._find_superseded if self.config.ingest.auto_supersede else None,
            max_size=self.config.session.max_cluster_size,
        )
        self.routes.ingested(res.shard if res.deferred else None, batch.source)
        if self.routes and self.hooks.on_route_waiting is not None:
            self.hooks.on_route_waiting(self.routes.quiet_seconds)
        if res.deferred and res.shard:
            # scored now, while the pass waits for the inbox to be quiet: on the index just
            # published, off the writer (it reads a snapshot, as a query does)
            mems = list(ctx.state.unsorted.get(res.shard, ()))
            self.scorer.soon(res.shard, mems, self.index)
        return res

    def _find_superseded(self, fresh: list[Memory]) -> dict[str, Memory]:
        return supersede.find(self.index, fresh)

    # -- changing a memory: `update` ------------------------------------------------------
    def update(self, old_id: object, raw_item: Any, scope: object = None) -> Updated:
        """A new memory (`raw_item`: content, metadata?, created_at?) that supersedes the
        memory `old_id` of `scope` (None: the default; `engine.updating`)."""
        req = UpdateRequest(
            updating.check_id(old_id),
            validate_item(raw_item, "update"),
            scope_or_default(scope),
        )
        result: Updated = self.writer.call(self._update_op, req)
        self.counters["superseded"] += 1
        return result

    def _update_op(self, ctx: WriteContext, req: UpdateRequest) -> Updated:
        self._outside_op(ctx)  # a hand edit not yet noticed is taken in first
        return updating.update(ctx, req, self.known)

    def _route(self, memories: list[Memory]) -> list[str | None]:
        return self.index.route_many(memories)

    def _threshold(self, why: str) -> None:
        if self.hooks.on_threshold is not None:
            self.hooks.on_threshold(why)

    # -- reading --------------------------------------------------------------------------
    def query(
        self,
        text: str,
        max_memories: int | None = None,
        token_budget: int | None = None,
        include_archive: bool = False,
        count_round: bool = True,
        scope: str | None = None,
        scopes: tuple[str, ...] = (),
    ) -> QueryResult:
        """Answer a query (the DESIGN shape: memories, clusters, context, tokens) from the
        memories of `scope` (None: the default) and of the `scopes` named besides."""
        params = QueryParams(
            text, max_memories, token_budget, include_archive, scope=scope, scopes=scopes
        )
        return self.run_query(params.check(), count_round)

    def run_query(self, q: QueryParams, count_round: bool = True) -> QueryResult:
        """`query` with checked parameters (what the socket server calls)."""
        t0 = time.perf_counter()
        archive_idx = self.archive_index() if q.include_archive else None
        index = self.index  # one snapshot for the whole query
        # optional SLM pick among the lexical candidates (None: the lexical choice)
        refiner = self.hooks.refiner
        chosen = refiner.choose(index, q.text, q.visible()) if refiner is not None else None
        archived_ids = (
            {c.id for c in self._summaries.values() if c.archived} if q.include_archive else set()
        )
        out, memory_ids, cluster_ids = answer(
            index, q, archive_idx, chosen, archived_ids, started=t0
        )
        self.note_query(memory_ids, cluster_ids, count_round)
        hit_archived = sorted({m.cluster_id for m in out.memories if m.archived and m.cluster_id})
        if hit_archived and self.config.archive.thaw_on_hit and not self.writer.read_only:
            self.writer.submit(self._thaw_op, hit_archived)
            out = replace(out, thawing=tuple(hit_archived))
        return out

    def note_query(self, memory_ids: list[str], cluster_ids: list[str], count_round: bool) -> None:
        """Count a query answered (here, or by a query process from its copy of the index):
        the access statistics that archiving reads, and the round that triggers sessions."""
        self.stats.record(memory_ids, cluster_ids)
        self.counters["queries"] += 1
        if count_round:
            self.round(1)

    def round(self, n: int = 1) -> Rounds:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_ROUNDS:
            raise BadRequest(f"'n' must be an integer from 1 to {MAX_ROUNDS}, not {n!r}"[:200])
        self.rounds_since_session += n
        if self.rounds_since_session >= self.config.session.dialogue_round_threshold:
            self._threshold("rounds")
        return Rounds(self.rounds_since_session)

    def get(self, mid: object, scopes: Collection[str] = (DEFAULT_SCOPE,)) -> MemoryRecord:
        """One memory of `scopes` by id, hot or archived (`engine.lookup`); NotFound names
        the id."""
        return lookup.get_memory(self.index, self.archive_index(), mid, scopes)

    def list_memories(self, params: ListParams) -> MemoryList:
        """The newest memories a filter lets through (`engine.lookup`)."""
        archive_idx = self.archive_index() if params.include_archive else None
        return lookup.list_memories(self.index, archive_idx, params)

    def clusters(
        self, include_archive: bool = False, scopes: Collection[str] | None = None
    ) -> ClusterList:
        """The clusters of `scopes` (None: all), and their unsorted memories' count."""
        out = []
        for c in self._summaries.values():
            if (c.archived and not include_archive) or (
                scopes is not None and c.scope not in scopes
            ):
                continue
            count, last = self.stats.cluster(c.id)
            when = None if last is None else iso_utc(last)
            out.append(replace(c, access_count=count, last_accessed=when))
        out.sort(key=lambda c: (c.archived, -c.size, c.name))
        if scopes is None:
            return ClusterList(tuple(out), self.index_unsorted_count())
        loose = self.index.unsorted_by_scope()
        return ClusterList(tuple(out), sum(n for s, n in loose.items() if s in scopes))

    def index_unsorted_count(self) -> int:
        return len(self.index) - sum(c.size for c in self._summaries.values() if not c.archived)

    def status(self, scope: str | None = None) -> Status:
        hooks = self.hooks
        part = {key: hook() for key, hook in hooks.status.items()}
        # the counters before the route queue: a batch is waiting from inside its commit's
        # op and counted once the op returns, so a status that commit overtakes shows the
        # batch waiting or not at all, never counted and not waiting (taken for routed)
        counters = dict(self.counters)
        return Status(
            store=str(self.root),
            head=self.head,
            uptime_seconds=round(time.time() - self.started_at, 1),
            load_seconds=round(self.load_seconds, 3),
            load_source=self.load_source,
            load_processes=self.load_processes,
            route_pending=len(self.routes),
            counts=self._counts.get(
                self._summaries, len(self.index), self.index.unsorted_by_scope(), scope
            ),
            counters=counters,
            writer=self.writer.status(),
            new_since_session=self.new_since_session,
            rounds_since_session=self.rounds_since_session,
            last_session=self.last_session,
            outside_edit_error=self.outside.error,
            recovery=tuple(self.notes),
            branch=self.git.branch,
            paused=self.writer.branch.paused or self.git.pause_reason(locks=False) or "",
            git_gc=self.packer.status(),
            ignored_files=tuple(self.ignored.files()),
            special_files=self.special.files,
            history=self.writer.history_status(),
            backend=hooks.backend_status() if hooks.backend_status is not None else None,
            inbox=part.get("inbox"),
            query_processes=part.get("query_processes"),
            activity=part.get("activity"),
            privacy=part.get("privacy"),
            config=part.get("config"),
            refine=part.get("refine"),
            replication=part.get("replication"),
            follow=part.get("follow"),
        )

    def log(self, n: int = 20, scope: str | None = None) -> Log:
        """The newest `n` commits (of `scope` only: `history.log_entries`) and the outside
        moves of the branch that took memories out of HEAD."""
        if not isinstance(n, int) or not 0 < n <= 10_000:
            raise BadRequest("'n' must be an integer from 1 to 10000")
        entries = history.log_entries(self.git, n, scope)
        return Log(entries, tuple(self.writer.branch.history.recent(n)))

    # -- history ------------------------------------------------------------------------
    def revert(self, ref: str, scope: str | None = None) -> Reverted:
        """Revert one commit, or every commit of a session (newest first), through git.
        `scope`: the caller works in this scope only (a pinned MCP server): a commit that
        changed memories of any other scope is refused, naming none of them."""
        if not isinstance(ref, str) or not ref.strip():
            raise BadRequest("'ref' must be a commit or a session id")
        ref = ref.strip()
        shas = history.commits_for(self.git, ref)
        if scope is not None:
            history.check_revert_scope(self.git, shas, check_scope(scope))
        result: Reverted = self.writer.call(self._revert_op, shas)
        self.counters["reverts"] += 1
        return result

    def _revert_op(self, ctx: WriteContext, shas: list[str]) -> Reverted:
        ctx.check_no_staged()
        before = ctx.state.memory_ids()
        done = history.revert_commits(ctx, shas)
        self.known = ctx.state.memory_ids()
        gone = before - self.known
        if gone:  # what a revert took out leaves no copy either (as a forget)
            self.forget_copies(ctx, gone)
        return Reverted(tuple(shas), tuple(done), ctx.git.head())

    # -- outside edits --------------------------------------------------------------------
    def check_outside(self) -> OutsideChange | None:
        """Notice hand edits and git commands run in the store; validate and reload. While
        writes are paused (the person's git holds the store) nothing is taken in: queries
        go on with the last good state, and `status.paused` says why."""
        try:
            result: OutsideChange | None = self.writer.call(self._outside_op, True)
        except Paused as exc:
            return OutsideChange(False, paused=str(exc))
        return result

    def _outside_op(self, ctx: WriteContext, full: bool = False) -> OutsideChange | None:
        """Take in an outside change (`full`: ask git whatever the watch of the memory
        folders says, as housekeeping and sessions do)."""
        change = self.outside.take_in(ctx, self.head, full)
        if change is None:
            return None
        if not change.ok:
            self.counters["outside_edit_errors"] += 1
            return change
        self.known = ctx.state.memory_ids()
        self.head = ctx.git.head()
        self.counters["outside_edits"] += 1
        return change

    # -- archive ----------------------------------------------------------------------
    def archive(
        self, dry_run: bool = False, now: float | None = None, scope: str | None = None
    ) -> Archived:
        """Archive the cold clusters (of `scope` only, when given): in slices."""
        run = ArchiveRun(dry_run, now, None if scope is None else check_scope(scope))
        cfg = self.config.archive
        # its slices give way to writes (`store/writequeue.py`)
        call = partial(self.writer.call, background=True)
        return archive.archive_slices(call, self._archive_op, self.stats, cfg, run)

    def _archive_op(self, ctx: WriteContext, run: ArchiveRun) -> Archived:
        if not run.dry_run:
            ctx.check_no_staged()  # paused as an `add` is, even when nothing is cold
        out = archive.archive_cold(
            ctx, self.stats, self.config.archive, run.dry_run, run.now, run.scope, run.clusters
        )
        if not out.dry_run:
            self.counters["archived"] += len(out.clusters)
        return out

    def _thaw_op(self, ctx: WriteContext, cids: list[str]) -> Thawed:
        out = archive.thaw(ctx, self.stats, cids)
        self.counters["thawed"] += len(out.clusters)
        return out

    # -- sessions ------------------------------------------------------------------------
    def recluster(
        self, trigger: str = "manual", backend: str | None = None, scope: str | None = None
    ) -> SessionOutcome:
        """Run one clustering session now (of `scope`'s memories only, when given; waiting
        for any running one) and report it."""
        scope, runner = scope if scope is None else check_scope(scope), self._session_runner()
        change = self.check_outside()
        if change is not None and change.paused:  # the person's git holds the store: a
            raise Paused(change.paused)  # session waits exactly as an `add` does
        if self.outside.error:  # a session rewrites cluster files: not while one is broken
            raise Conflict(
                f"no clustering session while a hand edit is broken: {self.outside.error}"
            )
        with self.session_lock:
            if scope is None:  # a session of one scope leaves the others' due
                self.new_since_session = self.rounds_since_session = 0
            with giving_way(self.writer.idle):  # its work off the writer pauses for writes
                outcome = runner(self, trigger=trigger, backend=backend, scope=scope)
        self.last_session = outcome
        self.counters["sessions"] += 1
        self.counters["named"] += outcome.named
        self.counters["naming_asked"] += outcome.naming_asked
        self.counters["naming_rejected"] += outcome.naming_rejected
        key = f"sessions_{outcome.status}"
        if key in self.counters:
            self.counters[key] += 1
        return outcome

    def _session_runner(self) -> SessionRunner:
        if self.hooks.session_runner is None:
            # no daemon wired one in (eval, scripts, tests): the backend config decides
            from clagd.organize.session import engine_session_runner
            from clagd.slm.manager import BackendManager

            self.hooks.session_runner = engine_session_runner(BackendManager(self.config))
        return self.hooks.session_runner
