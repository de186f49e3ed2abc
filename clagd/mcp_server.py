"""`clagd mcp`: the daemon's memory as Model Context Protocol tools, served over stdio.

An agent framework starts this process and speaks MCP on its stdin/stdout; every tool call is
forwarded to the running daemon through `clagd.client`, so the MCP process holds no state and
can be restarted freely. When the daemon is down, tools answer with an error that says how to
start it instead of failing the whole session.

Needs the official SDK: `pip install 'clagd[mcp]'`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from typing_extensions import TypedDict  # pydantic needs it below Python 3.12

from clagd import __version__
from clagd.client import Client, ClientError, DaemonNotRunning, QueryResult
from clagd.protocol import resolve_socket, store_path
from clagd.serve.units import SYSTEM_SOCKET_DIR, UNIT_PREFIX, service_unit

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as _MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _MCPServer  # type: ignore[no-redef,attr-defined,unused-ignore]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef,import-not-found,unused-ignore]
from mcp.types import CallToolResult, TextContent, ToolAnnotations

__all__ = ["build_server", "main", "run_mcp"]

T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory for this agent, kept by the clagd daemon. Call `recall` with the question or
topic at hand before answering anything that may depend on earlier conversations; it returns a
short context block of the most relevant memories, grouped by topic. Call `remember` to store
a fact, preference or outcome worth keeping (one self-contained statement per call). Every
change is a git commit: `memory_history` lists them and `revert` undoes one."""


def _annotations(title: str, **hints: bool) -> ToolAnnotations:
    # Wire (camelCase) names: accepted by the SDK's models in both mcp 1.x and 2.x.
    return ToolAnnotations.model_validate({"title": title, "openWorldHint": False, **hints})


class RecalledMemory(TypedDict):
    id: str
    content: str
    cluster_id: str | None
    cluster_name: str
    score: float
    created_at: str | None
    metadata: dict[str, Any]


class RecalledCluster(TypedDict):
    id: str
    name: str
    score: float


class RecallOutput(TypedDict):
    """`recall`'s structured content (its output schema): the memories, the clusters they
    came from, the formatted context block and its estimated size in tokens."""

    memories: list[RecalledMemory]
    clusters: list[RecalledCluster]
    context: str
    tokens: int


def store_of_socket(socket_path: str | os.PathLike[str]) -> Path | None:
    """The store whose default socket this is (`<store>/.clagd/clagd.sock`), else None."""
    p = Path(socket_path)
    return p.parent.parent if p.parent.name == ".clagd" else None


def not_running_message(socket_path: str | os.PathLike[str], store: Path | None) -> str:
    """What an agent (and its user) should read when the daemon is down: where clagd was
    looked for and the two real ways to start it, said once."""
    sock = Path(socket_path)
    why = "connection refused" if sock.exists() else "no socket file"
    store = store or store_of_socket(sock)
    run, unit = "clagd run <store>", f"{UNIT_PREFIX}<store folder name>.service"
    ctl = "systemctl --user"
    if store is not None:
        run, unit = f"clagd run {store}", service_unit(store)
    if sock.parent == SYSTEM_SOCKET_DIR:  # a system unit's socket: /run/clagd/<name>.sock
        unit, ctl = f"{UNIT_PREFIX}{sock.stem}.service", "sudo systemctl"
    return (
        f"the clagd memory daemon is not running at {sock} ({why}). Start it with "
        f"`{run}`, or, when `clagd install-service` set it up, `{ctl} start {unit}`; "
        "then retry."
    )


def _tool(server: Any, fn: Callable[..., Any], annotations: ToolAnnotations) -> None:
    """Register `fn` as a tool whose description is its docstring as clean text."""
    description = inspect.cleandoc(fn.__doc__ or "")
    server.tool(description=description, annotations=annotations)(fn)


class _Tools:
    """The five tools, each forwarding one call to the daemon through `client`."""

    def __init__(self, client: Client, store: Path | None) -> None:
        self.client, self.store = client, store

    async def forward(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn)
        except DaemonNotRunning:
            raise ToolError(not_running_message(self.client.socket_path, self.store)) from None
        except ClientError as exc:
            raise ToolError(f"clagd error [{exc.code}]: {exc.message}") from None

    def register(self, server: Any) -> None:
        _tool(
            server,
            self.remember_tool(),
            _annotations(
                "Remember", readOnlyHint=False, destructiveHint=False, idempotentHint=True
            ),
        )
        _tool(
            server,
            self.recall_tool(),
            _annotations("Recall", readOnlyHint=True, destructiveHint=False),
        )
        _tool(server, self.clusters_tool(), _annotations("List clusters", readOnlyHint=True))
        _tool(server, self.history_tool(), _annotations("Memory history", readOnlyHint=True))
        _tool(
            server,
            self.revert_tool(),
            _annotations(
                "Revert a change", readOnlyHint=False, destructiveHint=True, idempotentHint=False
            ),
        )

    def remember_tool(self) -> Callable[..., Any]:
        async def remember(
            content: str, metadata: dict[str, Any] | None = None, created_at: str | None = None
        ) -> dict[str, Any]:
            """Store one memory: a self-contained statement (a fact, a preference, an outcome).

            `metadata` is a free mapping (for example task_type, importance 1-5, source);
            `created_at` an ISO 8601 time when the memory is older than now. Storing the same
            content twice keeps one copy.
            """
            return await self.forward(lambda: self.client.add(content, metadata, created_at))

        return remember

    def recall_tool(self) -> Callable[..., Any]:
        async def recall(
            query: str,
            max_memories: int | None = None,
            token_budget: int | None = None,
            include_archive: bool = False,
        ) -> Annotated[CallToolResult, RecallOutput]:
            """Find the memories relevant to `query`, grouped by topic cluster.

            Returns a ready-to-use context block (first text item) and the memories with their
            ids, clusters and scores (second item, JSON; also the structured content).
            `include_archive` also searches clusters moved to the archive for being unused.
            """
            res = await self.forward(
                lambda: self.client.query(query, max_memories, token_budget, include_archive)
            )
            return recall_result(res)

        return recall

    def clusters_tool(self) -> Callable[..., Any]:
        async def list_clusters(include_archive: bool = False) -> dict[str, Any]:
            """The topic clusters memory is organized in: id, name, description, size."""
            result = await self.forward(lambda: self.client.clusters(include_archive))
            return result if isinstance(result, dict) else {"clusters": result}

        return list_clusters

    def history_tool(self) -> Callable[..., Any]:
        async def memory_history(n: int = 20) -> dict[str, Any]:
            """The last `n` changes to memory (git commits): what was added, reorganized,
            archived or reverted, with the commit id `revert` takes."""
            result = await self.forward(lambda: self.client.log(n))
            return result if isinstance(result, dict) else {"commits": result}

        return memory_history

    def revert_tool(self) -> Callable[..., Any]:
        async def revert(ref: str) -> dict[str, Any]:
            """Undo one change to memory by its commit id (from `memory_history`). The undo is
            itself a new commit, so it can be reverted in turn."""
            return await self.forward(lambda: self.client.revert(ref))

        return revert


def recall_result(res: QueryResult) -> CallToolResult:
    """The context block first (what a model reads), then the details as JSON text, and the
    same details as structured content for clients that read `structuredContent`."""
    data = res.to_dict()
    context = res.context or "(no relevant memories)"
    detail = json.dumps(
        {"memories": data["memories"], "clusters": data["clusters"], "tokens": res.tokens},
        ensure_ascii=False,
    )
    return CallToolResult.model_validate(
        {
            "content": [
                TextContent(type="text", text=context),
                TextContent(type="text", text=detail),
            ],
            "structuredContent": data,
        }
    )


def build_server(
    socket_path: str | os.PathLike[str],
    timeout: float = 60.0,
    store: str | os.PathLike[str] | None = None,
) -> Any:
    """The MCP server object with clagd's tools, talking to the daemon at `socket_path`
    (`store`, when known, is named in the "not running" message)."""
    client = Client(socket_path, timeout=timeout)
    try:  # serverInfo.version: this package's version (mcp 1.x has no such argument)
        server = _MCPServer("clagd", instructions=INSTRUCTIONS, version=__version__)
    except TypeError:  # pragma: no cover - mcp 1.x
        server = _MCPServer("clagd", instructions=INSTRUCTIONS)
    _Tools(client, Path(store) if store is not None else None).register(server)
    server.clagd_client = client  # type: ignore[attr-defined]
    return server


def run_mcp(
    socket_path: str | os.PathLike[str],
    timeout: float = 60.0,
    store: str | os.PathLike[str] | None = None,
) -> None:
    """Serve MCP over stdin/stdout until the client disconnects."""
    server = build_server(socket_path, timeout=timeout, store=store)
    try:
        server.run("stdio")
    finally:
        server.clagd_client.close()


def _socket_from(args: argparse.Namespace) -> Path:
    """The daemon's socket, found as the CLI finds it (`protocol.resolve_socket`)."""
    return resolve_socket(store_path(args.store), args.socket)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clagd.mcp_server", description="clagd MCP server (stdio)"
    )
    parser.add_argument(
        "--socket",
        help="daemon socket (default: $CLAGD_SOCKET, or the store's server.socket or default)",
    )
    parser.add_argument(
        "--store", help="store whose daemon to use (default: $CLAGD_STORE, or ./memory)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per daemon request")
    args = parser.parse_args(argv)
    run_mcp(_socket_from(args), timeout=args.timeout, store=args.store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
