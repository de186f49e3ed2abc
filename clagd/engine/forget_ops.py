"""The engine's forget and purge operations (`Engine` takes them as a base class): a forget
commit, then no copy left in the index, the query processes, the warm start, the access
statistics, the file-text cache or the rejected inbox files; with `purge`, none in history
either (engine/purge.py). The request, the selection and the commit are in engine/forget.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clagd.engine import forget as forgetting
from clagd.engine.forget import ForgetRequest
from clagd.engine.purge import run_purge
from clagd.engine.results import Forgotten, Purged
from clagd.errors import NotFound
from clagd.model import Memory
from clagd.scopes import scope_or_default
from clagd.store.writer import StoreChange, WriteContext

if TYPE_CHECKING:
    from clagd.config import Config
    from clagd.engine.outside import OutsideChange
    from clagd.engine.stats import AccessStats
    from clagd.engine.warmstart import WarmStart
    from clagd.retrieval.index import Index
    from clagd.store.files import Fragments, Paths
    from clagd.store.gitrepo import GitStore
    from clagd.store.packing import ObjectPacker
    from clagd.store.writer import Writer


class ForgetOps:
    """`forget` and what it needs of the engine (set by `Engine.__init__`)."""

    config: Config
    paths: Paths
    git: GitStore
    writer: Writer[Any]
    index: Index
    head: str | None
    known: set[str]
    fragments: Fragments
    stats: AccessStats
    packer: ObjectPacker
    warmstart: WarmStart
    counters: dict[str, int]

    def _outside_op(self, ctx: WriteContext) -> OutsideChange | None:
        raise NotImplementedError  # Engine's: a hand edit is taken in before a forget

    def forget(
        self,
        ids: list[str] | None = None,
        match: str | None = None,
        scope: str | None = None,
        purge: bool = False,
        force_remote: bool = False,
    ) -> Forgotten:
        """Take memories out of HEAD in one `forget` commit, and out of every copy the
        daemon keeps: the index (rebuilt whole), the query processes, the warm start, the
        access statistics, the file-text cache, rejected inbox copies. `purge`: out of
        every commit of history too (engine/purge.py)."""
        req = forgetting.ForgetRequest(
            tuple(ids or ()), match, scope_or_default(scope), None, purge, force_remote
        ).check()
        result: Forgotten = self.writer.call(self._forget_op, req)
        self.counters["forgotten"] += len(result.forgotten)
        return result

    def _forget_op(self, ctx: WriteContext, req: forgetting.ForgetRequest) -> Forgotten:
        self._outside_op(ctx)  # a hand edit first: the forget rewrites files
        try:
            mems = forgetting.select(ctx, req)
        except NotFound:
            if not req.purge:
                raise
            return self._purge_earlier(ctx, req)
        sha = forgetting.commit_forget(ctx, req, mems)
        self.forget_copies(ctx, {m.id for m in mems})
        redacted = forgetting.redact_rejected(
            self.paths.root, forgetting.memory_texts(mems, req.match)
        )
        ids = tuple(m.id for m in mems)
        purged = self._purge(ctx, mems, req) if req.purge else None
        if purged is not None:
            sha = next((r.new for r in purged.rewritten if r.old == sha), sha)
        return Forgotten(ids, sha, ctx.git.head(), req.scope, tuple(redacted), purged)

    def _purge_earlier(self, ctx: WriteContext, req: ForgetRequest) -> Forgotten:
        """`--purge` of memories forgotten before without it: out of history now."""
        mems = forgetting.select_forgotten(ctx.git, req)
        purged = self._purge(ctx, mems, req)
        ids = tuple(m.id for m in mems)
        redacted = forgetting.redact_rejected(
            self.paths.root, forgetting.memory_texts(mems, req.match)
        )
        return Forgotten(ids, None, ctx.git.head(), req.scope, tuple(redacted), purged)

    def _purge(self, ctx: WriteContext, mems: list[Memory], req: ForgetRequest) -> Purged:
        """History rewritten without `mems` (writer thread: every write waits), then the
        warm start saved at the new head. `git gc --auto` does not run meanwhile."""
        self.packer.stop(timeout=600)
        try:
            rep = self.config.replication
            branch = rep.branch or self.git.branch
            done = run_purge(ctx, mems, (rep.remote, branch, req.force_remote))
        finally:
            self.packer.resume()
        self.head = ctx.git.head()
        self.warmstart.save_or_drop(ctx, self.index)
        return done

    def forget_copies(self, ctx: WriteContext, ids: set[str]) -> None:
        """After a commit that took `ids` out (writer thread): no copy of them stays. The
        index is rebuilt whole (an incremental change only clears a slot's bit, and keeps
        its text and terms), so are the query processes' copies; the warm start is saved
        again (removed when it cannot be); the files' old versions the commit replaced are
        unlinked now, not on the reaper thread."""
        ctx.w.trash.empty()
        self.known -= ids
        self.fragments.drop(ids)
        self.stats.forget(ids)
        ctx.w.publish(StoreChange.whole(ctx.state, ctx.git.head()))
        self.warmstart.save_or_drop(ctx, self.index)
