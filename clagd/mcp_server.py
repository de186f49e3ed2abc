"""`clagd mcp`: the daemon's memory as Model Context Protocol tools, served over stdio.

An agent framework starts this process and speaks MCP on its stdin/stdout; every tool call is
forwarded to the running daemon through `clagd.client`, so the MCP process holds no state and
can be restarted freely. When the daemon is down, tools answer with an error that says how to
start it instead of failing the whole session.

Needs the official SDK: `pip install 'clagd[mcp]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from clagd.client import Client, ClientError, DaemonNotRunning, find_socket_path

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as _MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _MCPServer  # type: ignore[no-redef,attr-defined]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef,import-not-found]
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


def build_server(socket_path: str | os.PathLike[str], timeout: float = 60.0) -> Any:
    """The MCP server object with clagd's tools, talking to the daemon at `socket_path`."""
    client = Client(socket_path, timeout=timeout)
    server = _MCPServer("clagd", instructions=INSTRUCTIONS)

    async def forward(fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn)
        except DaemonNotRunning as exc:
            raise ToolError(
                f"the clagd memory daemon is not running ({exc}). Start it with "
                f"`clagd run <store>` or `systemctl --user start clagd`, then retry."
            ) from None
        except ClientError as exc:
            raise ToolError(f"clagd error [{exc.code}]: {exc.message}") from None

    @server.tool(
        annotations=_annotations(
            "Remember", readOnlyHint=False, destructiveHint=False, idempotentHint=True
        )
    )
    async def remember(
        content: str, metadata: dict[str, Any] | None = None, created_at: str | None = None
    ) -> dict[str, Any]:
        """Store one memory: a self-contained statement (a fact, a preference, an outcome).

        `metadata` is a free mapping (for example task_type, importance 1-5, source);
        `created_at` an ISO 8601 time when the memory is older than now. Storing the same
        content twice keeps one copy.
        """
        result = await forward(lambda: client.add(content, metadata, created_at))
        return result if isinstance(result, dict) else {"result": result}

    @server.tool(annotations=_annotations("Recall", readOnlyHint=True, destructiveHint=False))
    async def recall(
        query: str,
        max_memories: int | None = None,
        token_budget: int | None = None,
        include_archive: bool = False,
    ) -> CallToolResult:
        """Find the memories relevant to `query`, grouped by topic cluster.

        Returns a ready-to-use context block (first text item) and the memories with their
        ids, clusters and scores (second item, JSON). `include_archive` also searches
        clusters moved to the archive for being unused.
        """
        res = await forward(
            lambda: client.query(query, max_memories, token_budget, include_archive)
        )
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

    @server.tool(annotations=_annotations("List clusters", readOnlyHint=True))
    async def list_clusters(include_archive: bool = False) -> dict[str, Any]:
        """The topic clusters memory is organized in: id, name, description, size."""
        result = await forward(lambda: client.clusters(include_archive))
        return result if isinstance(result, dict) else {"clusters": result}

    @server.tool(annotations=_annotations("Memory history", readOnlyHint=True))
    async def memory_history(n: int = 20) -> dict[str, Any]:
        """The last `n` changes to memory (git commits): what was added, reorganized,
        archived or reverted, with the commit id `revert` takes."""
        result = await forward(lambda: client.log(n))
        return result if isinstance(result, dict) else {"commits": result}

    @server.tool(
        annotations=_annotations(
            "Revert a change", readOnlyHint=False, destructiveHint=True, idempotentHint=False
        )
    )
    async def revert(ref: str) -> dict[str, Any]:
        """Undo one change to memory by its commit id (from `memory_history`). The undo is
        itself a new commit, so it can be reverted in turn."""
        result = await forward(lambda: client.revert(ref))
        return result if isinstance(result, dict) else {"result": result}

    server.clagd_client = client  # type: ignore[attr-defined]
    return server


def run_mcp(socket_path: str | os.PathLike[str], timeout: float = 60.0) -> None:
    """Serve MCP over stdin/stdout until the client disconnects."""
    server = build_server(socket_path, timeout=timeout)
    try:
        server.run("stdio")
    finally:
        server.clagd_client.close()


def _socket_from(args: argparse.Namespace) -> Path:
    if args.socket:
        return Path(args.socket)
    if os.environ.get("CLAGD_SOCKET"):
        return Path(os.environ["CLAGD_SOCKET"])
    store = args.store or os.environ.get("CLAGD_STORE") or "."
    return find_socket_path(store)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clagd.mcp_server", description="clagd MCP server (stdio)"
    )
    parser.add_argument("--socket", help="daemon socket (default: $CLAGD_SOCKET, or the store's)")
    parser.add_argument("--store", help="store whose daemon to use (default: $CLAGD_STORE, or .)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per daemon request")
    args = parser.parse_args(argv)
    run_mcp(_socket_from(args), timeout=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
