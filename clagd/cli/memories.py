"""Commands that write and read memories: add, update, import, query, export."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from clagd.cli.base import (
    EXIT_ERROR,
    Ctx,
    Progress,
    also_scope_option,
    emit,
    json_option,
    main,
    pass_ctx,
    scope_option,
)
from clagd.cli.reading import where_option
from clagd.protocol import MAX_MEMORIES_LIMIT


@main.command()
@click.argument("content", required=False)
@click.option(
    "--file",
    "-f",
    "from_file",
    type=click.Path(exists=True, dir_okay=False),
    help="read the memory from this file (no shell argument limit); `-` as CONTENT: stdin",
)
@click.option("--meta", "-m", multiple=True, help="metadata KEY=VALUE (repeatable)")
@click.option("--created-at", help="ISO 8601 time (default: now)")
@json_option
@scope_option
@pass_ctx
def add(
    c: Ctx,
    content: str | None,
    from_file: str | None,
    meta: tuple[str, ...],
    created_at: str | None,
    as_json: bool,
) -> None:
    """Store one memory: CONTENT, or --file FILE, or standard input (`clagd add - < FILE`).

    A memory holds at most 65,536 characters; a longer text is refused with its size:
    split it into several memories."""
    from clagd.ingest.inbox import validate_item

    item: dict[str, Any] = {"content": _memory_text(content, from_file)}
    metadata = _metadata(meta)
    if metadata:
        item["metadata"] = metadata
    if created_at:
        item["created_at"] = created_at
    validate_item(item, "memory", c.scope)  # the daemon's own checks, before anything is sent
    with c.client() as cl:
        res = cl.add(item["content"], metadata=metadata or None, created_at=created_at)
    if res.added:
        text = f"added {', '.join(res.ids)} ({res.commit[:10] if res.commit else ''})"
    else:
        text = f"already stored: {', '.join(res.duplicate_ids)}"
    emit(res.raw, as_json, text)


@main.command()
@click.argument("memory_id", metavar="ID")
@click.argument("content", metavar="TEXT")
@click.option("--meta", "-m", multiple=True, help="metadata KEY=VALUE (repeatable)")
@click.option("--created-at", help="ISO 8601 time (default: now)")
@json_option
@scope_option
@pass_ctx
def update(
    c: Ctx,
    memory_id: str,
    content: str,
    meta: tuple[str, ...],
    created_at: str | None,
    as_json: bool,
) -> None:
    """Store TEXT as a new memory that supersedes memory ID.

    The old memory stays in the store and in git, marked superseded_by the new one, and is
    left out of queries (`clagd query --superseded` shows it)."""
    with c.client() as cl:
        res = cl.update(memory_id, content, metadata=_metadata(meta) or None, created_at=created_at)
    text = f"{res.id} supersedes {res.supersedes} ({(res.commit or '')[:10]})"
    emit(res.raw, as_json, text)


_HOW_TO_ADD = 'clagd add "TEXT", clagd add --file FILE, or clagd add - < FILE'


def _memory_text(content: str | None, from_file: str | None) -> str:
    """The text to store, from the argument, a file or stdin; a usage error (exit 2) when
    there is none, rather than waiting silently on a terminal."""
    if from_file is not None:
        if content is not None:
            raise click.UsageError("give the memory as CONTENT or as --file, not both")
        try:
            content = Path(from_file).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise click.BadParameter(
                f"{from_file} is not UTF-8 text", param_hint="--file"
            ) from None
    elif content is None or content == "-":
        if content is None and sys.stdin.isatty():
            raise click.UsageError(f"no memory given: {_HOW_TO_ADD}")
        content = sys.stdin.read()
    if not content.strip():
        raise click.UsageError(f"the memory is empty: give the text to store ({_HOW_TO_ADD})")
    return content


META_HINT = "'-m' / '--meta'"  # as click names an option in its errors


def _metadata(meta: tuple[str, ...]) -> dict[str, Any]:
    """-m KEY=VALUE pairs (a VALUE that is JSON is taken as such: numbers, true, ...)."""
    from clagd.errors import InboxRejected
    from clagd.ingest.inbox import check_importance

    metadata: dict[str, Any] = {}
    for kv in meta:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{kv!r} is not KEY=VALUE", param_hint=META_HINT)
        try:
            metadata[k] = json.loads(v)
        except ValueError:
            metadata[k] = v
    try:
        if "importance" in metadata:
            check_importance(metadata["importance"], "-m")
    except InboxRejected as exc:
        raise click.BadParameter(str(exc).removeprefix("-m: "), param_hint=META_HINT) from None
    return metadata


def _import_files(paths: tuple[str, ...]) -> tuple[list[Path], dict[str, str]]:
    """The files to import (folders walked, sorted) and every file passed over, with why:
    nothing in PATHS is left out without a word."""
    from clagd.ingest.inbox import SUFFIXES, ignored_name

    files: list[Path] = []
    skipped: dict[str, str] = {}
    kinds = " ".join(sorted(SUFFIXES))
    for p in map(Path, paths):
        if not p.is_dir():
            files.append(p)  # named explicitly: read it, and reject it with the reason
            continue
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p)
            if any(part.startswith(".") for part in rel.parts[:-1]):
                continue  # inside a hidden folder (.git/ ...): reported once, below
            if f.is_dir():
                if f.name.startswith("."):
                    skipped[f"{f}/"] = "hidden folder"
            elif not f.is_file():
                skipped[str(f)] = "not a regular file"
            elif ignored_name(f.name):
                skipped[str(f)] = "hidden or temporary name (as in the inbox)"
            elif f.suffix.lower() not in SUFFIXES:
                skipped[str(f)] = f"unknown suffix {f.suffix or '(none)'} (not {kinds})"
            else:
                files.append(f)
    return files, skipped


IMPORT_MAX_FILE_BYTES = 64 * 1024 * 1024  # a file clagd import reads (the inbox's is a setting)
# bytes of memories per `add` request: under the daemon's default server.max_request_bytes
IMPORT_REQUEST_BYTES = 900_000


def _read_items(
    files: list[Path], scope: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The items of the files, each with its scope (its own `scope:`, else `scope`); a file
    naming another scope than `scope` is rejected with the reason."""
    from clagd.errors import InboxRejected
    from clagd.ingest.inbox import read_file

    items: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    for f in files:
        try:
            for it in read_file(f, IMPORT_MAX_FILE_BYTES, 1_000_000, setting=None, scope=scope):
                d: dict[str, Any] = {
                    "content": it.content,
                    "metadata": it.metadata,
                    "scope": it.scope,
                }
                if it.created_at:
                    d["created_at"] = it.created_at
                items.append(d)
        except InboxRejected as exc:
            rejected[str(f)] = str(exc)
        except OSError as exc:
            rejected[str(f)] = f"unreadable: {exc.strerror or exc}"
    return items, rejected


def _chunks(items: list[dict[str, Any]], batch: int) -> Iterator[list[dict[str, Any]]]:
    """`batch` items at a time, fewer when they would make a request over
    IMPORT_REQUEST_BYTES (the daemon refuses a request over server.max_request_bytes)."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for it in items:
        n = len(json.dumps(it, ensure_ascii=False).encode("utf-8"))
        if chunk and (len(chunk) >= batch or size + n > IMPORT_REQUEST_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(it)
        size += n
    if chunk:
        yield chunk


@main.command(name="import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="memories per request and commit (fewer: smaller requests)",
)
@json_option
@scope_option
@pass_ctx
def import_cmd(c: Ctx, paths: tuple[str, ...], batch: int, as_json: bool) -> None:
    """Bulk import memory files (the inbox formats; folders are walked) with progress.

    Every file left out is listed with the reason: skipped (unknown suffix, hidden or
    temporary name) or rejected (unreadable, invalid); a rejected file makes the exit
    status 1."""
    files, skipped = _import_files(paths)
    items, rejected = _read_items(files, c.scope)
    added = dupes = 0
    prog = Progress("importing", len(items))
    with c.client(timeout=None) as cl:
        for chunk in _chunks(items, batch):
            res = cl.add_many(chunk, source="import")
            added += res.added
            dupes += res.duplicates
            prog.update(len(chunk))
    prog.close()
    out = {
        "files": len(files),
        "memories": len(items),
        "added": added,
        "duplicates": dupes,
        "rejected": rejected,
        "skipped": skipped,
    }
    text = f"imported {added} new memories from {len(files)} file(s) ({dupes} already stored)"
    text += "".join(f"\nskipped {k}: {v}" for k, v in skipped.items())
    text += "".join(f"\nrejected {k}: {v}" for k, v in rejected.items())
    emit(out, as_json, text)
    if rejected:
        sys.exit(EXIT_ERROR)


@main.command()
@click.argument("text")
@click.option(
    "-k",
    "--max-memories",
    type=click.IntRange(1, MAX_MEMORIES_LIMIT),
    help=f"memories to return, 1-{MAX_MEMORIES_LIMIT} (default: retrieval.max_memories)",
)
@click.option(
    "--budget",
    "token_budget",
    type=click.IntRange(min=0),
    help="token budget of the context (0: none; default: the configured one)",
)
@click.option("--archive", "include_archive", is_flag=True, help="also search archived clusters")
@click.option("--superseded", is_flag=True, help="also memories another supersedes (clagd update)")
@where_option
@json_option
@scope_option
@also_scope_option
@pass_ctx
def query(
    c: Ctx,
    text: str,
    max_memories: int | None,
    token_budget: int | None,
    include_archive: bool,
    superseded: bool,
    where: dict[str, Any],
    as_json: bool,
    also_scopes: tuple[str, ...],
) -> None:
    """Relevant memories for TEXT, as a context block (--where: only memories with that
    metadata, the answer filled from them; --superseded: also the memories a newer one
    replaced; --also-scope: that scope's memories too, besides --scope's)."""
    with c.client() as cl:
        res = cl.query(
            text,
            max_memories,
            token_budget,
            include_archive,
            where=where or None,
            scopes=also_scopes,
            superseded=superseded,
        )
    emit(res.raw, as_json, res.context or "(no relevant memories)")


@main.command()
@click.argument("dest", type=click.Path(file_okay=False))
@click.option(
    "--format", "fmt", type=click.Choice(["markdown"]), default="markdown", show_default=True
)
@json_option
@scope_option
@pass_ctx
def export(c: Ctx, dest: str, fmt: str, as_json: bool) -> None:
    """Write the clusters as readable Markdown into DEST, one file per cluster (with
    --scope, only that scope's clusters and unsorted memories; else every scope's)."""
    from clagd.store.export import export_markdown

    c.require_store()
    paths = export_markdown(c.store, Path(dest), scope=c.scope)
    emit({"files": [str(p) for p in paths]}, as_json, f"wrote {len(paths)} file(s) to {dest}")
