"""`clagd forget`: memories removed for good, and with --purge from history too."""

from __future__ import annotations

import sys

import click

from clagd.cli.base import Ctx, emit, json_option, main, pass_ctx, scope_option
from clagd.replies import Forgotten


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--match", help="forget every memory whose content contains TEXT (any case)")
@click.option("--purge", is_flag=True, help="also rewrite every commit that held the text")
@click.option("--yes", is_flag=True, help="purge without asking (for scripts)")
@click.option("--force-remote", is_flag=True, help="force-push the purge to replication.remote")
@json_option
@scope_option
@pass_ctx
def forget(
    c: Ctx,
    ids: tuple[str, ...],
    match: str | None,
    purge: bool,
    yes: bool,
    force_remote: bool,
    as_json: bool,
) -> None:
    """Remove memories for good: from HEAD (one forget commit), the index and every cache;
    no later revert brings them back. --purge also removes their text from history."""
    if bool(ids) == bool(match):
        raise click.UsageError("give memory ids or --match TEXT (one of the two)")
    if force_remote and not purge:
        raise click.UsageError("--force-remote pushes a purge: use it with --purge")
    if purge and not yes:
        _confirm_purge()
    with c.client() as cl:
        res = cl.forget(list(ids), match, None, purge, force_remote)
    emit(res, as_json, _forget_text(res))  # emit prints a typed reply's JSON object


def _confirm_purge() -> None:
    warning = (
        "--purge rewrites the store's git history: every commit that held the text gets a "
        "new id, reflogs are expired and unreachable objects pruned. Clones and followers "
        "keep the old history until they follow the rewrite."
    )
    if not sys.stdin.isatty():
        raise click.UsageError(f"{warning} Not a terminal: add --yes to purge.")
    if not click.confirm(f"{warning}\nRewrite history?", default=False):
        raise click.Abort()


def _forget_text(res: Forgotten) -> str:
    n = len(res.forgotten)
    lines = [
        f"forgot {n} memor{'y' if n == 1 else 'ies'} ({', '.join(res.forgotten[:5])}"
        f"{', ...' if n > 5 else ''}); commit {str(res.commit)[:10]}"
    ]
    if res.rejected_redacted:
        lines.append(f"redacted in inbox/rejected/: {', '.join(res.rejected_redacted)}")
    purge = res.purge
    if purge:
        lines.append(f"purged: {len(purge['rewritten'])} commit(s) rewritten (old -> new):")
        lines += [f"  {r['old'][:10]} -> {r['new'][:10]}" for r in purge["rewritten"][:50]]
        if purge.get("pushed"):
            lines.append(f"force-pushed to {purge['pushed']}")
        elif purge.get("remote_note"):
            lines.append(purge["remote_note"])
    return "\n".join(lines)
