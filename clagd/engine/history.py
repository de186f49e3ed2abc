"""Undo through git: `clagd revert` of one commit or of every commit of a session."""

from __future__ import annotations

from clagd.engine.forget import (
    ForgetRequest,
    commit_forget,
    forgotten_ids,
    refuse_forget_revert,
)
from clagd.engine.results import LogEntry
from clagd.errors import BadScope, Conflict, StoreError
from clagd.scopes import check_scope, trailer_scopes
from clagd.store.gitrepo import GitStore
from clagd.store.history import ids_at
from clagd.store.writer import DATA_DIRS, WriteContext

MEMORY_DIRS = set(DATA_DIRS)


def commits_for(git: GitStore, ref: str) -> list[str]:
    """The commits `ref` names that are still in effect: a session id's commits (newest
    first; its own reverts, a rolled-back plan, are not undone again), else one commit.
    A ref whose every commit was reverted already (by `clagd revert`) is refused with
    Conflict `already_reverted`, naming the revert: reverting twice changes nothing.
    Refused (Conflict, one line) when one changes anything outside the memory folders:
    undoing the store's first commit would delete clagd.yaml, prompts/ and .gitignore, a
    config or prompt commit is the person's to revert with git."""
    entries = git.log(2000)
    kinds = {e.commit: e.kind for e in entries}
    reverts: dict[str, list[str]] = {}
    for e in entries:
        # a forget that undid an ingest git could not revert counts as its revert
        if e.kind in ("revert", "forget") and e.trailers.get("reverts"):
            reverts.setdefault(e.trailers["reverts"], []).append(e.commit)
    session = (
        []
        if looks_like_sha(ref)
        else [e.commit for e in entries if e.trailers.get("session") == ref]
    )
    named = [s for s in session if kinds[s] != "revert"] if session else [git.resolve(ref)]
    for sha in named:
        refuse_forget_revert(kinds.get(sha, ""), sha)
    shas = [s for s in named if _undone_by(s, reverts) is None]
    if not shas:
        by = _undone_by(named[0], reverts) if named else None
        what = f"session {ref}" if session else named[0][:10]
        raise Conflict(
            f"{what} is already reverted (by {str(by)[:10]}): nothing changed", "already_reverted"
        )
    _check_inside(git, shas)
    return shas


def _undone_by(sha: str, reverts: dict[str, list[str]], depth: int = 0) -> str | None:
    """The revert commit that undid `sha` and is itself still in effect, else None."""
    if depth > 20:  # a revert of a revert of ...: treat the deepest as in effect
        return None
    for r in reverts.get(sha, []):
        if _undone_by(r, reverts, depth + 1) is None:
            return r
    return None


def _check_inside(git: GitStore, shas: list[str]) -> None:
    for sha in shas:
        outside = [p for p in git.changed_files(sha) if p.split("/")[0] not in MEMORY_DIRS]
        if outside:
            more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
            raise Conflict(
                f"cannot revert {sha[:10]}: it changes {outside[0]}{more}, outside "
                "clusters/, archive/ and unsorted/ (revert it with git itself if you mean it)"
            )


def added_by(git: GitStore, sha: str) -> set[str]:
    """The memory ids `sha` put into the store (not the ones it only moved): in the files
    it changed after it, not before it."""
    entry = git.log(1, sha)[0]
    if len(entry.parents) != 1:
        return set()
    files = [p for p in git.changed_files(sha) if p.split("/")[0] in MEMORY_DIRS]
    return ids_at(git.root, sha, files) - ids_at(git.root, entry.parents[0], files)


def revert_commits(ctx: WriteContext, shas: list[str]) -> list[str]:
    """Revert `shas` in order, one revert commit each (writer thread). All or nothing: when
    one of several fails, HEAD goes back to where it was and the state is reloaded.

    A revert never brings a forgotten memory back (`forget.forgotten_ids`), and it undoes
    what the commit added wherever those memories are now: an ingest whose memories a
    session moved since is reverted by taking them out of their clusters (in the revert
    commit; as a `forget` commit when git cannot apply the revert at all). A revert that
    would change nothing is refused with the reason."""
    done: list[str] = []
    start_head = ctx.git.head()
    forgotten = forgotten_ids(ctx.git)
    try:
        for sha in shas:
            done.append(_revert_one(ctx, sha, forgotten))
    except (Conflict, StoreError):
        if done and start_head:
            ctx.git.run("reset", "-q", "--hard", start_head)
            ctx.git.base = start_head  # the daemon's own move: nothing to report
            ctx.reload_all()
        raise
    return done


def _revert_one(ctx: WriteContext, sha: str, forgotten: set[str]) -> str:
    entry = ctx.git.log(1, sha)[0]
    live = ctx.state.memory_ids()
    added = added_by(ctx.git, sha)
    keep_out = frozenset((forgotten - live) | added)
    trailers = {"kind": "revert", "reverts": sha, "session": entry.trailers.get("session")}
    try:
        return ctx.revert(sha, f"revert: {entry.subject}"[:200], trailers, keep_out)
    except Conflict as exc:
        moved = added & live
        if entry.kind != "ingest" or not moved or exc.code == "nothing_to_revert":
            raise
        # git cannot undo an ingest whose files changed since: its memories go (a forget)
        mems = [m for m, _a, _k in ctx.state.all_memories() if m.id in moved]
        new = commit_forget(ctx, ForgetRequest(reverts=sha), mems)
        if new is None:
            raise
        return new


def looks_like_sha(ref: str) -> bool:
    return 4 <= len(ref) <= 40 and all(c in "0123456789abcdef" for c in ref.lower())


def log_entries(git: GitStore, n: int, scope: str | None) -> tuple[LogEntry, ...]:
    """The newest `n` commits; with `scope`, those that name it in their `scopes` trailer
    (ingests, sessions and forgets of its memories; a commit without the trailer counts as
    the default scope's, as every commit before scopes did)."""
    if scope is None:
        return tuple(LogEntry.of(c) for c in git.log(n))
    scope = check_scope(scope)
    found = git.log(min(10_000, n * 20))
    mine = [c for c in found if scope in trailer_scopes(c.trailers)]
    return tuple(LogEntry.of(c) for c in mine[:n])


def check_revert_scope(git: GitStore, shas: list[str], scope: str) -> None:
    """A caller pinned to `scope` may revert only commits of that scope alone: BadScope,
    naming no other scope, for a commit that changed memories of any other."""
    for sha in shas:
        found = git.log(1, rev=sha)
        if not found or trailer_scopes(found[0].trailers) != {scope}:
            raise BadScope(
                f"commit {sha[:10]} changed memories outside scope {scope!r}: "
                "not revertible from this scope"
            )
