"""Commands that make and serve a store: init, run, follow, sync, install-service, mcp."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from clagd.cli.base import EXIT_BAD_CONFIG, MCP_HINT, Ctx, echo, emit, main, pass_ctx, scope_option
from clagd.errors import ClagdError


@main.command()
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option(
    "--force", is_flag=True, help="make a store in a non-empty folder (its files stay uncommitted)"
)
@pass_ctx
def init(c: Ctx, path: str | None, force: bool) -> None:
    """Create a store (from store_template/) with its git repository.

    A folder that already holds files but no store is refused unless --force."""
    from clagd.store.create import init_store

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
    d.exit(d.run())


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
    d.exit(d.run())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="the follower's status as JSON")
@pass_ctx
def sync(c: Ctx, as_json: bool) -> None:
    """A follower: fetch from the primary now and serve what it has."""
    with c.client() as cl:
        s = cl.sync()
    emit(s.raw, as_json, follow_line(s.raw))


def follow_line(f: dict[str, Any]) -> str:
    ago = f.get("seconds_since_fetch")
    line = (
        f"follower of {f.get('remote')} ({f.get('branch')}): head {(f.get('head') or '')[:10]}, "
        f"{f.get('behind', 0)} behind, fetched "
        + (f"{ago:.1f}s ago" if isinstance(ago, (int, float)) else "never")
    )
    return line + (f"; last error: {f['last_error']}" if f.get("last_error") else "")


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
@scope_option
@pass_ctx
def mcp(c: Ctx) -> None:
    """Serve the store's memory as MCP tools over stdio (needs the mcp extra). With
    --scope (or $CLAGD_SCOPE), the server is pinned to that scope: its tools read and write
    that scope's memories alone, and a call naming another scope is refused."""
    try:
        from clagd.mcp_server import run_mcp
    except ImportError:
        raise click.ClickException(f"the MCP server needs the official SDK: {MCP_HINT}") from None
    run_mcp(c.socket_path(), store=c.store, scope=c.scope)
