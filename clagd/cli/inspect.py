"""Commands that show what the daemon holds and did: status, clusters, log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clagd.cli.base import Ctx, echo, emit, json_option, main, pass_ctx, scope_option
from clagd.cli.serving import follow_line
from clagd.errors import DaemonNotRunning
from clagd.replies import Log


@main.command()
@json_option
@scope_option
@pass_ctx
def status(c: Ctx, as_json: bool) -> None:
    """What the daemon holds and does.

    With --scope (or CLAGD_SCOPE), the memory counts are that scope's alone."""
    with c.client() as cl:
        s = cl.status()
    if as_json:
        emit(s.raw, True)
        return
    n, k = s.counts, s.counters
    b = s.backend or {}
    ls = s.last_session
    lines = [
        f"store      {s.store}",
        f"head       {(s.head or '')[:10]}",
        *([f"scope      {n.scope} (the counts of memories are its alone)"] if n.scope else []),
        f"memories   {n.memories} in {n.clusters} clusters, {n.unsorted} unsorted; "
        f"{n.archived_clusters} archived clusters ({n.archived_memories} memories)",
        *_scope_lines(n.scopes),
        f"backend    {b.get('active', 'none')} ({b.get('reason', '')})",
        *_gate_lines(b.get("gate") or []),
        f"sessions   {k['sessions']} run, {k['sessions_accepted']} accepted, "
        f"{k['sessions_rolled_back']} rolled back, {k['sessions_fallback']} fell back"
        + (f"; last: {ls.status} ({ls.trigger})" if ls else ""),
        f"queries    {k['queries']}; ingested {k['added']} ({k['duplicates']} duplicates)",
        *_query_process_lines(s.query_processes or {}, s.uptime_seconds),
    ]
    if s.follow:
        lines.insert(1, f"follower   {follow_line(s.follow.raw)}")
    if s.outside_edit_error:
        lines.append(f"ATTENTION  outside edit rejected: {s.outside_edit_error}")
    lines += _attention(s.raw)
    echo("\n".join(lines))


def _scope_lines(scopes: dict[str, dict[str, int]]) -> list[str]:
    """One line of memories per scope, when the store holds any but the default."""
    if set(scopes) <= {"default"}:
        return []
    parts = [
        f"{name} {row.get('memories', 0)} ({row.get('unsorted', 0)} unsorted)"
        for name, row in sorted(scopes.items())
    ]
    return ["scopes     " + ", ".join(parts)]


def _query_process_lines(qp: dict[str, Any], uptime: float) -> list[str]:
    """A line only when the query processes are not as they should be: one was restarted,
    or fewer serve than configured half a minute after the start (the daemon answers
    queries itself while none does)."""
    want, have, restarts = qp.get("configured", 0), qp.get("serving", 0), qp.get("restarts", 0)
    if not want or (not restarts and (have >= want or uptime < 30)):
        return []
    line = f"serving    {have} of {want} query processes"
    line += f"; restarted {restarts} times" if restarts else ""
    line += f"; last error: {qp['last_error']}" if qp.get("last_error") else ""
    return [line + ("; the daemon answers queries meanwhile" if not have else "")]


def _gate_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per measured model: its scores against the lexical organizer, what it may do."""
    out = []
    for r in results:
        tasks = r.get("tasks") or {}
        scores = ", ".join(f"{k} {t['model']:.2f}/{t['lexical']:.2f}" for k, t in tasks.items())
        may = ", ".join(r.get("allowed") or []) or "nothing (lexical organizer)"
        out.append(f"gate       {r['backend']} {r['model']}: {scores} (model/lexical); may: {may}")
    return out


def _attention(s: dict[str, Any]) -> list[str]:
    """What the person should know: paused writes, history rewrites that removed memories,
    a store others can read, ignored files, a failing `git gc`, a changed configuration."""
    out = []
    if s.get("paused"):
        out.append(f"PAUSED     {s['paused']}")
    h = s.get("history") or {}
    if h.get("memories_removed"):
        last = (h.get("last") or [{}])[-1]
        out.append(
            f"HISTORY    {h['memories_removed']} memories left HEAD in {h['events']} outside "
            f"move(s) of the branch; last: {last.get('removed')} {last.get('where', '')}"
        )
    for w in (s.get("privacy") or {}).get("warnings", []):
        out.append(f"PRIVACY    {w}")
    if (s.get("inbox") or {}).get("rejected_refused"):
        out.append(f"INBOX      {s['inbox']['rejected_refused']}")
    if s.get("ignored_files"):
        out.append(f"IGNORED    {', '.join(s['ignored_files'][:5])} (not memory files)")
    if s.get("special_files"):
        out.append(f"SPECIAL    {'; '.join(s['special_files'][:5])} (never read as memories)")
    gc = s.get("git_gc") or {}
    if str(gc.get("last_result", "")).startswith("failed"):
        out.append(f"GIT GC     {gc['last_result']}")
    cfg = s.get("config") or {}
    if cfg.get("error"):
        out.append(f"CONFIG     {cfg['error']}")
    if cfg.get("restart_needed"):
        out.append(f"CONFIG     restart needed for {', '.join(cfg['restart_needed'])}")
    return out


@main.command()
@click.option("--archive", "include_archive", is_flag=True, help="include archived clusters")
@json_option
@scope_option
@pass_ctx
def clusters(c: Ctx, include_archive: bool, as_json: bool) -> None:
    """The clusters, largest first (of --scope only, when given; else of every scope)."""
    with c.client() as cl:
        res = cl.clusters(include_archive)
    rows = [
        f"{x.id}  {x.size:>5}  {x.name}{'  [archived]' if x.archived else ''}"
        + ("  [pinned]" if x.pinned else "")
        for x in res.clusters
    ]
    rows.append(f"(unsorted: {res.unsorted})")
    emit(res.raw, as_json, "\n".join(rows))


@main.command(name="log")
@click.option(
    "-n", type=click.IntRange(1, 10_000), default=20, show_default=True, help="entries, 1-10000"
)
@json_option
@scope_option
@pass_ctx
def log_cmd(c: Ctx, n: int, as_json: bool) -> None:
    """The store's history: ingests, sessions, archives, reverts, edits (with --scope,
    the commits that changed that scope's memories).

    Asks the daemon; when none runs, reads the store's git directly (as `export` does)."""
    try:
        with c.client() as cl:
            res = cl.log(n)
    except DaemonNotRunning:
        from clagd.store.lock import lock_holder

        if c.socket or lock_holder(c.store) is not None:
            raise  # a daemon was named, or one runs: say what is wrong with it
        res = _log_from_git(c.store, n, c.scope)
    rows = []
    for e in res.entries:
        named = {"session": e.session, "status": e.status, "trigger": e.trigger}
        extra = " ".join(f"{k}={v}" for k, v in {**named, "backend": e.backend}.items() if v)
        rows.append(
            f"{e.commit[:10]} {e.date[:19]} {e.kind:<8} {e.subject}{'  ' + extra if extra else ''}"
        )
    for h in res.history:  # outside moves of the branch that removed memories
        rows.append(
            f"{str(h.get('to'))[:10]} {h.get('at', '')[:19]} {h.get('kind', ''):<8} "
            f"{h.get('removed')} memories left HEAD (noticed {h.get('noticed')}); {h.get('where')}"
        )
    emit(res.raw, as_json, "\n".join(rows) or "(no history)")


def _log_from_git(store: Path, n: int, scope: str | None = None) -> Log:
    """`log`'s answer read from the store itself: the daemon's `log` op, without a daemon."""
    from clagd.engine import results
    from clagd.protocol import to_wire
    from clagd.scopes import trailer_scopes
    from clagd.store.gitrepo import GitStore
    from clagd.store.history import HistoryLog

    git = GitStore(store)
    found = git.log(n if scope is None else min(10_000, n * 20))
    mine = [c for c in found if scope is None or scope in trailer_scopes(c.trailers)]
    entries = tuple(results.LogEntry.of(c) for c in mine[:n])
    wire = to_wire(results.Log(entries, tuple(HistoryLog(git.gitdir).recent(n))))
    assert isinstance(wire, dict)  # a dataclass is an object on the wire
    return Log.from_dict(wire)
