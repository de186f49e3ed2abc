"""`clagd mcp`: the daemon's memory as Model Context Protocol tools, served over stdio.

An agent framework starts this process and speaks MCP on its stdin/stdout; every tool call is
forwarded to the running daemon through `clagd.client`, so the MCP process holds no state and
can be restarted freely. When the daemon is down, tools answer with an error that says how to
start it instead of failing the whole session.

Needs the official SDK: `pip install '.[mcp]'` in a checkout of clagd (the `mcp` extra).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from pydantic import Field, ValidationError
from typing_extensions import TypedDict  # pydantic needs it below Python 3.12

from clagd import __version__
from clagd.client import Client, ClientError, DaemonNotRunning, QueryResult
from clagd.ingest.inbox import IMPORTANCE_SCALE, MAX_CONTENT_CHARS
from clagd.protocol import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    MAX_MEMORIES_LIMIT,
    resolve_socket,
    store_owner,
    store_path,
)
from clagd.scopes import SCOPE_RE, BadScope, check_scope
from clagd.serve.units import SYSTEM_SOCKET_DIR, UNIT_PREFIX, service_unit

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as _MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _MCPServer  # type: ignore[no-redef,attr-defined,unused-ignore]
    from mcp.server.fastmcp.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        ResourceError,
        ToolError,
    )
from mcp.types import CallToolResult, TextContent, ToolAnnotations

__all__ = ["build_server", "main", "run_mcp"]

T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory for this agent, kept by the clagd daemon. Call `recall` with the question or
topic at hand before answering anything that may depend on earlier conversations; it returns a
short context block of the most relevant memories, grouped by topic. Call `remember` to store
a fact, preference or outcome worth keeping (one self-contained statement per call). Every
change is a git commit: `memory_history` lists them and `revert` undoes one. `forget` removes
memories for good when the user asks for it (no revert brings them back)."""


MAX_LOG_ENTRIES = 10_000  # the daemon's bound on `log`'s n

# The tools' arguments: each with a description and its bounds, in the input schema a
# model reads, so a value out of range is refused (naming the argument) before the daemon.
Content = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CONTENT_CHARS,
        description="the memory: one self-contained statement (a fact, a preference, an outcome)",
    ),
]
Importance = Annotated[
    float | None,
    Field(ge=0, le=1, description=f"how much the memory matters: {IMPORTANCE_SCALE}"),
]
Metadata = Annotated[
    dict[str, Any] | None,
    Field(description="free mapping kept with the memory, e.g. {source: chat, task_type: travel}"),
]
CreatedAt = Annotated[
    str | None,
    Field(description="ISO 8601 time the memory is from, when older than now"),
]
QueryText = Annotated[
    str,
    Field(min_length=1, description="the question or topic at hand, in plain words"),
]
MaxMemories = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_MEMORIES_LIMIT,
        description="how many memories at most (default: the store's retrieval.max_memories)",
    ),
]
TokenBudget = Annotated[
    int | None,
    Field(ge=0, description="size limit of the context in tokens (0: none; default: the store's)"),
]
IncludeArchive = Annotated[
    bool, Field(description="also search clusters moved to the archive for being unused")
]
Where = Annotated[
    dict[str, str | int | float | bool | None] | None,
    Field(
        description="only memories whose metadata has each of these values (exact match on "
        "scalar metadata, all of them), e.g. {task_type: travel, source: chat}"
    ),
]
MemoryId = Annotated[
    str, Field(min_length=1, description="a memory id (m- and 16 hex digits), as recall gives it")
]
Since = Annotated[
    str | None,
    Field(description="only memories made at or after this: an ISO 8601 time or an age (2h, 7d)"),
]
ListLimit = Annotated[
    int, Field(ge=1, le=MAX_LIST_LIMIT, description="how many memories at most, newest first")
]
IncludeSuperseded = Annotated[
    bool, Field(description="also memories replaced by a newer one (update), ranked lower")
]
LogEntries = Annotated[
    int, Field(ge=1, le=MAX_LOG_ENTRIES, description="how many changes, newest first")
]
Ref = Annotated[
    str,
    Field(min_length=1, description="a commit id from memory_history (or a session id)"),
]
Scope = Annotated[
    str | None,
    Field(
        pattern=SCOPE_RE.pattern,
        description="whose memory (a user, agent or run): a scope name; left out, the "
        "server's scope (its --scope, else default). A server pinned to a scope refuses any "
        "other",
    ),
]

ForgetIds = Annotated[
    list[Annotated[str, Field(pattern=r"^m-[0-9a-f]{16}$")]] | None,
    Field(max_length=1000, description="memory ids to forget (from recall)"),
]
ForgetMatch = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=1000,
        description="forget every memory whose content contains this text (any case)",
    ),
]


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
    """Register `fn` as a tool whose description is its docstring as clean text; the
    server refuses any argument `fn` does not take (`_Server.call_tool`)."""
    description = inspect.cleandoc(fn.__doc__ or "")
    server.tool(description=description, annotations=annotations)(fn)
    known = getattr(server, "clagd_arguments", None)
    if isinstance(known, dict):
        known[fn.__name__] = frozenset(inspect.signature(fn).parameters)


# what agents written for mem0 or LangGraph send for "whose memory": `scope` here
OWNER_ARGUMENTS = frozenset({"user_id", "agent_id", "run_id", "namespace", "user", "agent"})


def unknown_arguments(tool: str, given: Iterable[str], known: frozenset[str]) -> str | None:
    """The error for arguments a tool does not take (None: all known). An unknown one is
    never ignored: `remember(user_id=...)` ignored would store the memory in another
    user's scope than the agent meant."""
    extra = sorted(set(given) - known)
    if not extra:
        return None
    names = ", ".join(f"'{e}'" for e in extra)
    hint = ""
    if set(extra) & OWNER_ARGUMENTS and "scope" in known:
        hint = "; whose memory it is goes in 'scope' (a user, agent or run: a scope name)"
    return f"{tool}: unknown argument {names} (it takes {', '.join(sorted(known))}){hint}"


class _Tools:
    """The tools, each forwarding one call to the daemon through `client`. `pinned`: the
    one scope this server may read and write (`clagd mcp --scope NAME`); a tool call
    naming another is refused before anything reaches the daemon."""

    def __init__(self, client: Client, store: Path | None, pinned: str | None = None) -> None:
        self.client, self.store = client, store
        self.pinned = None if pinned is None else check_scope(pinned)

    def scope(self, tool: str, given: str | None) -> str | None:
        """The scope a tool call works in: the pinned one (another named: refused), else
        the one it names, else None (the daemon's default)."""
        try:
            named = None if given is None or given == "" else check_scope(given)
        except BadScope as exc:
            raise ToolError(f"{tool}: argument 'scope': {exc}") from None
        if self.pinned is not None and named not in (None, self.pinned):
            raise ToolError(
                f"{tool}: this memory server is pinned to scope {self.pinned!r}; "
                f"scope {named!r} is refused"
            )
        return self.pinned or named

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
            self.update_tool(),
            _annotations("Update", readOnlyHint=False, destructiveHint=False, idempotentHint=False),
        )
        _tool(
            server,
            self.recall_tool(),
            _annotations("Recall", readOnlyHint=True, destructiveHint=False),
        )
        _tool(server, self.get_tool(), _annotations("Get a memory", readOnlyHint=True))
        _tool(server, self.list_tool(), _annotations("List memories", readOnlyHint=True))
        _tool(server, self.clusters_tool(), _annotations("List clusters", readOnlyHint=True))
        _tool(server, self.history_tool(), _annotations("Memory history", readOnlyHint=True))
        _tool(
            server,
            self.revert_tool(),
            _annotations(
                "Revert a change", readOnlyHint=False, destructiveHint=True, idempotentHint=False
            ),
        )
        _tool(
            server,
            self.forget_tool(),
            _annotations(
                "Forget memories", readOnlyHint=False, destructiveHint=True, idempotentHint=False
            ),
        )

    def remember_tool(self) -> Callable[..., Any]:
        async def remember(
            content: Content,
            importance: Importance = None,
            metadata: Metadata = None,
            created_at: CreatedAt = None,
            scope: Scope = None,
        ) -> dict[str, Any]:
            """Store one memory: a self-contained statement (a fact, a preference, an outcome).

            `importance` is a number from 0 to 1 (0.5 when left out); `metadata` a free
            mapping (for example task_type, source); `created_at` an ISO 8601 time when the
            memory is older than now; `scope` whose memory it is (a user, agent or run).
            Storing the same content twice in one scope keeps one copy.
            """
            chosen = self.scope("remember", scope)
            meta = dict(metadata or {})
            if importance is not None:
                meta["importance"] = importance
            res = await self.forward(
                lambda: self.client.add(content, meta or None, created_at, scope=chosen)
            )
            return res.raw

        return remember

    def update_tool(self) -> Callable[..., Any]:
        async def update(
            memory_id: MemoryId,
            content: Content,
            metadata: Metadata = None,
            scope: Scope = None,
        ) -> dict[str, Any]:
            """Replace a fact that changed: store `content` as a new memory superseding
            memory `memory_id` (from recall) of `scope`. The old memory is kept in history,
            marked superseded, and no longer recalled unless asked for."""
            chosen = self.scope("update", scope)
            res = await self.forward(
                lambda: self.client.update(memory_id, content, metadata, scope=chosen)
            )
            return {"id": res.id, "supersedes": res.supersedes, "commit": res.commit}

        return update

    def recall_tool(self) -> Callable[..., Any]:
        async def recall(
            query: QueryText,
            max_memories: MaxMemories = None,
            token_budget: TokenBudget = None,
            include_archive: IncludeArchive = False,
            where: Where = None,
            superseded: IncludeSuperseded = False,
            scope: Scope = None,
        ) -> Annotated[CallToolResult, RecallOutput]:
            """Find the memories relevant to `query`, grouped by topic cluster.

            Returns a ready-to-use context block (first text item) and the memories with their
            ids, clusters and scores (second item, JSON; also the structured content).
            `include_archive` also searches clusters moved to the archive for being unused;
            `where` keeps only memories whose metadata has each of its values;
            `superseded` also memories a newer one replaced (`update`); `scope` searches
            that scope's memories (no other scope's is ever returned).
            """
            if not query.strip():
                raise ToolError("recall: argument 'query' must be a question or topic, not blank")
            chosen = self.scope("recall", scope)
            res = await self.forward(
                lambda: self.client.query(
                    query,
                    max_memories,
                    token_budget,
                    include_archive,
                    where=where,
                    superseded=superseded,
                    scope=chosen,
                )
            )
            return recall_result(res)

        return recall

    def get_tool(self) -> Callable[..., Any]:
        async def get(id: MemoryId, scope: Scope = None) -> dict[str, Any]:
            """One memory by its id (from `recall` or `list`): its text, time, metadata and
            the cluster it is filed in; only a memory of `scope`."""
            chosen = self.scope("get", scope)
            return (await self.forward(lambda: self.client.get(id, scope=chosen))).raw

        return get

    def list_tool(self) -> Callable[..., Any]:
        async def list(
            where: Where = None,
            since: Since = None,
            limit: ListLimit = DEFAULT_LIST_LIMIT,
            include_archive: IncludeArchive = False,
            scope: Scope = None,
        ) -> dict[str, Any]:
            """The stored memories of `scope`, newest first, without a query: those whose
            metadata has each `where` value, made at or after `since`; `total` says how
            many match."""
            chosen = self.scope("list", scope)
            res = await self.forward(
                lambda: self.client.list_memories(
                    where, since, limit, include_archive, scope=chosen
                )
            )
            return res.raw

        return list

    def clusters_tool(self) -> Callable[..., Any]:
        async def list_clusters(
            include_archive: IncludeArchive = False, scope: Scope = None
        ) -> dict[str, Any]:
            """The topic clusters memory is organized in: id, name, description, size (of
            `scope` only, when given or when the server is pinned to one)."""
            chosen = self.scope("list_clusters", scope)
            return (await self.forward(lambda: self.client.clusters(include_archive, chosen))).raw

        return list_clusters

    def history_tool(self) -> Callable[..., Any]:
        async def memory_history(n: LogEntries = 20, scope: Scope = None) -> dict[str, Any]:
            """The last `n` changes to memory (git commits): what was added, reorganized,
            archived or reverted, with the commit id `revert` takes (those of `scope`
            only, when given or when the server is pinned to one)."""
            chosen = self.scope("memory_history", scope)
            return (await self.forward(lambda: self.client.log(n, chosen))).raw

        return memory_history

    def revert_tool(self) -> Callable[..., Any]:
        async def revert(ref: Ref, scope: Scope = None) -> dict[str, Any]:
            """Undo one change to memory by its commit id (from `memory_history`). The undo is
            itself a new commit, so it can be reverted in turn. With `scope` (or a pinned
            server), only a change of that scope's memories alone."""
            chosen = self.scope("revert", scope)
            return (await self.forward(lambda: self.client.revert(ref, chosen))).raw

        return revert

    def forget_tool(self) -> Callable[..., Any]:
        async def forget(
            ids: ForgetIds = None, match: ForgetMatch = None, scope: Scope = None
        ) -> dict[str, Any]:
            """Remove memories for good, by id (`ids`, from recall) or every one whose
            content contains `match`: gone from memory and from every later recall, and no
            revert brings them back (storing the text again is a new memory). Use it when
            the user asks to forget something. Give `ids` or `match`, not both."""
            if bool(ids) == bool(match):
                raise ToolError("forget: give 'ids' (memory ids) or 'match' (a text), one of them")
            chosen = self.scope("forget", scope)
            return (await self.forward(lambda: self.client.forget(ids or (), match, chosen))).raw

        return forget

    def register_context(self, server: Any) -> None:
        """A resource (the clusters) and a prompt (a question with recall's context), so
        the resource and prompt lists the server advertises are not empty."""

        async def clusters_resource() -> str:
            try:
                data = await self.forward(lambda: self.client.clusters(True, self.pinned))
            except ToolError as exc:
                raise ResourceError(str(exc)) from None
            return json.dumps(data.raw, ensure_ascii=False, indent=1)

        server.resource(
            CLUSTERS_URI,
            name="clusters",
            description="the topic clusters memory is organized in (archived ones included)",
            mime_type="application/json",
        )(clusters_resource)

        async def answer_with_memory(
            question: Annotated[str, Field(min_length=1, description="the user's question")],
        ) -> str:
            res = await self.forward(lambda: self.client.query(question, scope=self.pinned))
            return memory_prompt(question, res.context)

        server.prompt(
            name="answer_with_memory",
            description="the user's question with the memories `recall` finds for it, "
            "placed before the question as a model should read them",
        )(answer_with_memory)


CLUSTERS_URI = "memory://clusters"


def memory_prompt(question: str, context: str) -> str:
    """How a model should be given `recall`'s context: before the question, marked as
    memory, to be used only where it applies."""
    context = context or "(no relevant memories)"
    return (
        "Memories from earlier conversations (from clagd; use them only where they apply):\n"
        f"{context}\n\nQuestion: {question}"
    )


def argument_errors(tool: str, exc: ValidationError) -> str:
    """A tool's bad arguments in one line, each named as the tool calls it, without the
    library's links ("For further information visit https://errors.pydantic.dev/...")."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"argument '{loc}': {err.get('msg', 'invalid')}")
    return f"{tool}: " + "; ".join(parts)


class _Server(_MCPServer):  # type: ignore[misc,valid-type,unused-ignore]
    """The SDK's server, with argument errors said plainly (`argument_errors`)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], *args: Any) -> Any:
        known = getattr(self, "clagd_arguments", {}).get(name)
        if known is not None and isinstance(arguments, dict):
            why = unknown_arguments(name, arguments, known)
            if why is not None:
                raise ToolError(why)
        try:
            return await super().call_tool(name, arguments, *args)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(argument_errors(name, exc.__cause__)) from None
            raise


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
    scope: str | None = None,
) -> Any:
    """The MCP server object with clagd's tools, talking to the daemon at `socket_path`
    (`store`, when known, is named in the "not running" message). `scope`: the one scope
    its tools may read and write (`_Tools`; None: any, the default when none is named)."""
    client = Client(socket_path, timeout=timeout, owner=store_owner(store_path(store)), scope=scope)
    try:  # serverInfo.version: this package's version (mcp 1.x has no such argument)
        server = _Server("clagd", instructions=INSTRUCTIONS, version=__version__)
    except TypeError:  # pragma: no cover - mcp 1.x
        server = _Server("clagd", instructions=INSTRUCTIONS)
    server.clagd_arguments = {}  # type: ignore[attr-defined]  # tool -> the arguments it takes
    tools = _Tools(client, Path(store) if store is not None else None, scope)
    tools.register(server)
    tools.register_context(server)
    server.clagd_client = client  # type: ignore[attr-defined]
    return server


def run_mcp(
    socket_path: str | os.PathLike[str],
    timeout: float = 60.0,
    store: str | os.PathLike[str] | None = None,
    scope: str | None = None,
) -> None:
    """Serve MCP over stdin/stdout until the client disconnects (pinned to `scope`)."""
    server = build_server(socket_path, timeout=timeout, store=store, scope=scope)
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
    parser.add_argument(
        "--scope",
        default=os.environ.get("CLAGD_SCOPE") or None,
        help="pin the server to this scope: its tools read and write no other "
        "(default: $CLAGD_SCOPE; none: any scope a tool call names)",
    )
    args = parser.parse_args(argv)
    if args.scope is not None:
        try:
            check_scope(args.scope)
        except BadScope as exc:
            parser.error(f"--scope: {exc}")
    run_mcp(_socket_from(args), timeout=args.timeout, store=args.store, scope=args.scope)
    return 0


if __name__ == "__main__":
    sys.exit(main())
