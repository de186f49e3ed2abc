"""One socket resolution: a `server.socket` set in the store's clagd.yaml is where the daemon
binds, and where the CLI, `Client.for_store` and `clagd mcp` (both ways of starting it) look,
without being told. A real daemon (`clagd run`, a subprocess) on a real Unix socket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from helpers import REPO, make_store, wait_for

from clagd.cli import main
from clagd.client import Client, DaemonNotRunning
from clagd.protocol import default_socket_path, resolve_socket

CONFIGURED = "run/configured.sock"  # relative: inside the store


@pytest.fixture
def served(short_tmp: Path) -> Iterator[Path]:
    """A store named `memory` whose clagd.yaml sets server.socket, served by `clagd run
    <store>` started with no --socket and no $CLAGD_SOCKET."""
    store = make_store(short_tmp / "memory", {"server": {"socket": CONFIGURED}})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAGD_", "LISTEN_"))}
    env.update(PYTHONPATH=str(REPO), CLAGD_BACKEND="none")
    log = short_tmp / "daemon.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clagd", "run", str(store)],
            env=env,
            cwd=short_tmp,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}:\n{log.read_text()}")
        try:
            with Client(store / CONFIGURED, timeout=5) as c:
                return bool(c.ping()["pong"])
        except DaemonNotRunning:
            return False

    try:
        wait_for(answers, 60, "the daemon on the configured socket")
        yield store
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_daemon_binds_the_configured_socket(served: Path) -> None:
    assert (served / CONFIGURED).is_socket()
    assert not default_socket_path(served).exists()  # so nobody can find it by the default
    assert resolve_socket(served) == served / CONFIGURED


def test_cli_finds_the_configured_socket(served: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = CliRunner().invoke(main, ["--store", str(served), "status", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["store"] == str(served)
    # and with the default store, ./memory
    monkeypatch.chdir(served.parent)
    added = CliRunner().invoke(main, ["add", "the configured socket was found"])
    assert added.exit_code == 0, added.output
    out = CliRunner().invoke(main, ["query", "configured socket", "--json"])
    assert out.exit_code == 0, out.output
    contents = [m["content"] for m in json.loads(out.output)["memories"]]
    assert contents == ["the configured socket was found"]


def test_client_for_store_finds_the_configured_socket(served: Path) -> None:
    with Client.for_store(served, timeout=10) as c:
        assert c.socket_path == served / CONFIGURED
        assert c.ping()["store"] == str(served)
        assert c.add("reached through Client.for_store")["added"] == 1


def _mcp_recall(args: list[str], cwd: Path, text: str) -> Any:
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[mcp]')")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=args, env={"PYTHONPATH": str(REPO)}, cwd=str(cwd)
    )

    async def run() -> Any:
        with open(cwd / "mcp.err", "w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                with anyio.fail_after(60):
                    await session.call_tool("remember", {"content": text})
                    return await session.call_tool("recall", {"query": text})

    return anyio.run(run)


@pytest.mark.parametrize(
    "how",
    [
        ["-m", "clagd", "--store", "{store}", "mcp"],  # `clagd mcp`
        ["-m", "clagd", "mcp"],  # `clagd mcp` in the folder holding ./memory
        ["-m", "clagd.mcp_server"],  # the module, whose default store is ./memory too
        ["-m", "clagd.mcp_server", "--store", "{store}"],
    ],
    ids=["cli-store", "cli-default", "module-default", "module-store"],
)
def test_mcp_finds_the_configured_socket(served: Path, how: list[str]) -> None:
    args = [a.replace("{store}", str(served)) for a in how]
    text = f"remembered through mcp {' '.join(how[1:])}"
    result = _mcp_recall(args, served.parent, text)
    body = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
    assert not result.is_error, body
    assert text in result.content[0].text
    assert result.structured_content["memories"][0]["content"] == text
