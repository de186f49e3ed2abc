"""Commands that read memories without a query: get (one by id) and list (those a filter
lets through, newest first); and the `--where KEY=VALUE` option that `query` shares."""

from __future__ import annotations

import time
from typing import Any

import click

from clagd.cli.base import (
    Ctx,
    also_scope_option,
    emit,
    json_option,
    main,
    pass_ctx,
    scope_option,
)
from clagd.client import MemoryRecord
from clagd.errors import BadRequest
from clagd.protocol import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, SINCE_FORMS, parse_where, since_epoch


def _where(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> dict[str, str]:
    try:
        return parse_where(value)
    except BadRequest as exc:
        raise click.BadParameter(str(exc).removeprefix("--where "), param_hint="--where") from None


def _since(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            since_epoch(value, time.time())
        except BadRequest:
            raise click.BadParameter(
                f"{value!r} is not {SINCE_FORMS}", param_hint="--since"
            ) from None
    return value


where_option = click.option(
    "--where",
    "where",
    multiple=True,
    callback=_where,
    metavar="KEY=VALUE",
    help="only memories whose metadata KEY is VALUE (exact; repeatable, all must hold)",
)


def memory_line(m: MemoryRecord) -> str:
    """One memory in a listing: id, time, where it is filed, its text."""
    place = f"{m.cluster_name}{' [archived]' if m.archived else ''}"
    return f"{m.id}  {m.created_at[:19] or '(no time)':<19}  {place}: {m.content}"


@main.command()
@click.argument("memory_id")
@json_option
@scope_option
@also_scope_option
@pass_ctx
def get(c: Ctx, memory_id: str, as_json: bool, also_scopes: tuple[str, ...]) -> None:
    """One memory by its id (as `query --json` and `list` show it), of --scope (and each
    --also-scope)."""
    with c.client() as cl:
        m = cl.get(memory_id, scopes=also_scopes)
    meta = ", ".join(f"{k}={v}" for k, v in sorted(m.metadata.items()))
    lines = [
        m.id,
        f"created    {m.created_at or '(unknown)'}",
        f"cluster    {m.cluster_name} ({m.cluster_id or 'unsorted'})"
        + ("  [archived]" if m.archived else ""),
        *([f"metadata   {meta}"] if meta else []),
        "",
        m.content,
    ]
    emit(m.raw, as_json, "\n".join(lines))


@main.command(name="list")
@where_option
@click.option(
    "--since",
    callback=_since,
    help="only memories made at or after this: an ISO 8601 time or an age (30m, 2h, 7d, 4w)",
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=DEFAULT_LIST_LIMIT,
    show_default=True,
    help=f"memories at most, newest first (1-{MAX_LIST_LIMIT})",
)
@click.option("--archive", "include_archive", is_flag=True, help="also list archived clusters")
@click.option(
    "--superseded", is_flag=True, help="also list memories a newer one supersedes (update)"
)
@json_option
@scope_option
@also_scope_option
@pass_ctx
def list_cmd(
    c: Ctx,
    where: dict[str, Any],
    since: str | None,
    limit: int,
    include_archive: bool,
    superseded: bool,
    as_json: bool,
    also_scopes: tuple[str, ...],
) -> None:
    """The stored memories, newest first, without a query: all of them, or those --where
    and --since let through (a memory a newer one supersedes only with --superseded), of
    --scope (and each --also-scope)."""
    with c.client() as cl:
        res = cl.list_memories(
            where or None,
            since,
            limit,
            include_archive,
            scopes=also_scopes,
            superseded=superseded,
        )
    rows = [memory_line(m) for m in res.memories]
    shown = len(res.memories)
    if shown < res.total:
        rows.append(f"({shown} of {res.total}, newest first; --limit N for more)")
    elif not shown:
        rows.append("(no memories)")
    emit(res.raw, as_json, "\n".join(rows))
