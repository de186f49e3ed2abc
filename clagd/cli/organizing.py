"""Commands that change the organization or undo history: revert, recluster, archive."""

from __future__ import annotations

import threading

import click

from clagd.cli.base import Ctx, Progress, emit, json_option, main, pass_ctx, scope_option


@main.command()
@click.argument("ref")
@json_option
@scope_option
@pass_ctx
def revert(c: Ctx, ref: str, as_json: bool) -> None:
    """Undo a commit or a whole clustering session (git revert).

    With --scope (or CLAGD_SCOPE), only a commit that changed that scope's memories alone."""
    with c.client() as cl:
        res = cl.revert(ref)
    emit(
        res.raw,
        as_json,
        f"reverted {', '.join(s[:10] for s in res.reverted)}; head {(res.head or '')[:10]}",
    )


@main.command()
@click.option("--no-wait", is_flag=True, help="schedule it and return")
@json_option
@scope_option
@pass_ctx
def recluster(c: Ctx, no_wait: bool, as_json: bool) -> None:
    """Run a clustering session now and report its outcome.

    With --scope (or CLAGD_SCOPE), of that scope's memories and clusters only."""
    stop = threading.Event()

    def tick() -> None:
        prog = Progress("clustering session running")
        while not stop.wait(1.0):
            prog.update(0)
        prog.close()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with c.client(timeout=None) as cl:
            res = cl.recluster(wait=not no_wait)
    finally:
        stop.set()
        ticker.join()
    text = f"session {res.session_id or ''}: {res.status}"
    if res.reasons:
        text += " — " + "; ".join(res.reasons)[:500]
    emit(res.raw, as_json, text)


@main.command()
@click.option("--dry-run", is_flag=True, help="only list the clusters that would move")
@json_option
@scope_option
@pass_ctx
def archive(c: Ctx, dry_run: bool, as_json: bool) -> None:
    """Move cold clusters to archive/ now (of --scope only, when given)."""
    with c.client() as cl:
        res = cl.archive(dry_run=dry_run)
    verb = "would archive" if dry_run else "archived"
    emit(
        res.raw,
        as_json,
        f"{verb} {len(res.clusters)} cluster(s)"
        + "".join(f"\n  {i}  {n}" for i, n in zip(res.clusters, res.names)),
    )
