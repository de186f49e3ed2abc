"""The ground every `clagd` command stands on: the context (store, socket, client), the
exit statuses, safe output, progress, and the `main` group the command modules add to."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from clagd import __version__
from clagd.client import Client
from clagd.errors import ClagdError
from clagd.protocol import SOCKET_ENV, resolve_socket, store_owner, store_path
from clagd.replies import Reply
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
    def __init__(self, store: str | None, socket: str | None, scope: str | None = None) -> None:
        self.store = store_path(store)
        self.socket = socket or os.environ.get(SOCKET_ENV)
        # the scope the commands read and write (--scope / $CLAGD_SCOPE; None: default)
        self.scope = scope

    def socket_path(self) -> Path:
        """--socket / $CLAGD_SOCKET, else the store's `server.socket`, else its default."""
        return resolve_socket(self.store, self.socket)

    def client(self, timeout: float | None = 30.0) -> Client:
        if not self.socket:
            self.require_store()
        return Client(
            self.socket_path(), timeout=timeout, owner=store_owner(self.store), scope=self.scope
        )

    def require_store(self) -> None:
        """A mistyped --store says so, rather than "no daemon running", with advice that
        works there: the store it lies inside, the store inside it, or how to make one."""
        if (self.store / "clagd.yaml").is_file():
            return
        path = click.format_filename(str(self.store))
        raise NotAStore(f"{path} is not a clagd store (no clagd.yaml): {self._store_hint(path)}")

    def _store_hint(self, path: str) -> str:
        from clagd.store.create import enclosing_store, is_store

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

SCOPE_ENV = "CLAGD_SCOPE"
SCOPE_HELP = (
    "the scope (user, agent, run) to read and write: [a-z0-9][a-z0-9_-]{0,62} "
    f"(env {SCOPE_ENV}; default: default)"
)


def checked_scope(value: str | None) -> str | None:
    """A --scope value checked (None when not given); a bad name is a usage error."""
    from clagd.scopes import BadScope, check_scope

    if value is None or value == "":
        return None
    try:
        return check_scope(value)
    except BadScope as exc:
        raise click.BadParameter(str(exc), param_hint="--scope") from None


def _set_scope(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """A command's own --scope: it overrides the one given to `clagd` (or $CLAGD_SCOPE)."""
    scope = checked_scope(value)
    if scope is not None:
        ctx.ensure_object(Ctx).scope = scope


# `--scope NAME` on every command that reads or writes memories (also `clagd --scope NAME`)
scope_option = click.option(
    "--scope",
    metavar="NAME",
    callback=_set_scope,
    expose_value=False,
    is_eager=False,
    help=SCOPE_HELP,
)


def _also_scopes(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    from clagd.scopes import BadScope, check_scopes

    try:
        return check_scopes(value)
    except BadScope as exc:
        raise click.BadParameter(str(exc), param_hint="--also-scope") from None


# `--also-scope NAME` (repeatable) on the reading commands: scopes seen besides --scope
also_scope_option = click.option(
    "--also-scope",
    "also_scopes",
    metavar="NAME",
    multiple=True,
    callback=_also_scopes,
    help="also read this scope's memories (repeatable); no other scope's is ever shown",
)
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


def emit(data: Any, as_json: bool, text: str | None = None) -> None:
    """`text`, or with `as_json` the result as JSON: a typed reply (`clagd.replies`) as
    the object the daemon sent."""
    if isinstance(data, Reply):
        data = data.raw
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
@click.option("--scope", envvar=SCOPE_ENV, metavar="NAME", help=SCOPE_HELP)
@click.pass_context
def main(ctx: click.Context, store: str | None, socket: str | None, scope: str | None) -> None:
    """clagd: a git-versioned memory daemon for small-language-model agents."""
    ctx.obj = Ctx(store, socket, checked_scope(scope))


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
