"""A real MCP client session over stdio against `python -m clagd.mcp_server` and a real daemon."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[mcp]')")

from helpers import REPO
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402


class RunningDaemon:
    def __init__(self, proc: subprocess.Popen[bytes], socket_path: Path, log: Path) -> None:
        self.proc, self.socket_path, self.log = proc, socket_path, log


def wait_for(notify: socket.socket, line: str, proc: subprocess.Popen[bytes], log: Path) -> str:
    """Read sd_notify datagrams until one carries `line` (the daemon says when it is ready)."""
    notify.settimeout(60)
    while True:
        try:
            msg = notify.recv(4096).decode()
        except TimeoutError:
            raise AssertionError(f"no {line} from the daemon; log:\n{log.read_text()}") from None
        if line in msg.splitlines():
            return msg
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}; log:\n{log.read_text()}")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    """`clagd run` on a fresh store (backend none), ready when it sends READY=1."""
    with tempfile.TemporaryDirectory(prefix="clagd-m-") as short:
        sock = Path(short) / "clagd.sock"
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(Path(short) / "notify.sock"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LISTEN_", "WATCHDOG_"))}
        env.update(
            PYTHONPATH=str(REPO),
            CLAGD_BACKEND="none",
            NOTIFY_SOCKET=str(Path(short) / "notify.sock"),
        )
        log = tmp_path / "daemon.log"
        with open(log, "wb") as logf:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clagd",
                    "--socket",
                    str(sock),
                    "run",
                    str(tmp_path / "store"),
                ],
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        try:
            wait_for(notify, "READY=1", proc, log)
            yield RunningDaemon(proc, sock, log)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            notify.close()


def _params(socket_path: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "clagd.mcp_server", "--socket", str(socket_path)],
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )


def run_session(socket_path: Path, errlog: Path, body: Any) -> Any:
    async def main() -> Any:
        with open(errlog, "w") as err:
            async with (
                stdio_client(_params(socket_path), errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                with anyio.fail_after(60):
                    return await body(session)

    return anyio.run(main)


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def test_mcp_tools_end_to_end(daemon: RunningDaemon, tmp_path: Path) -> None:
    async def body(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["tools"] = {t.name: t for t in (await s.list_tools()).tools}
        out["remember"] = [
            await s.call_tool(
                "remember",
                {"content": "The user prefers metric units", "metadata": {"source": "chat"}},
            ),
            await s.call_tool("remember", {"content": "The user's cat is called Miso"}),
            await s.call_tool("remember", {"content": "The user's cat is called Miso"}),
        ]
        out["recall"] = await s.call_tool("recall", {"query": "what is the cat called?"})
        out["recall_where"] = await s.call_tool(
            "recall", {"query": "units cat", "where": {"source": "chat"}}
        )
        first_id = out["recall"].structured_content["memories"][0]["id"]
        out["get"] = await s.call_tool("get", {"id": first_id})
        out["get_missing"] = await s.call_tool("get", {"id": "m-00000000000000ff"})
        out["list"] = await s.call_tool("list", {"where": {"source": "chat"}, "limit": 5})
        out["clusters"] = await s.call_tool("list_clusters", {})
        out["history"] = await s.call_tool("memory_history", {"n": 5})
        cat_commit = out["history"].structured_content["entries"][0]["commit"]
        out["revert"] = await s.call_tool("revert", {"ref": cat_commit})
        out["recall_after"] = await s.call_tool("recall", {"query": "what is the cat called?"})
        out["bad_revert"] = await s.call_tool("revert", {"ref": "0000000000"})
        out["forget"] = await s.call_tool("forget", {"match": "metric units"})
        out["recall_forgot"] = await s.call_tool("recall", {"query": "which units?"})
        out["bad_forget"] = await s.call_tool("forget", {"match": "no such text anywhere"})
        return out

    out = run_session(daemon.socket_path, tmp_path / "mcp.err", body)

    tools = out["tools"]
    assert set(tools) == {
        "remember",
        "update",
        "recall",
        "get",
        "list",
        "list_clusters",
        "memory_history",
        "revert",
        "forget",
    }
    assert tools["forget"].annotations.destructive_hint is True
    for name in ("recall", "get", "list", "list_clusters", "memory_history"):
        assert tools[name].annotations.read_only_hint is True, name
    assert tools["revert"].annotations.destructive_hint is True
    assert tools["revert"].annotations.read_only_hint is False
    assert tools["remember"].annotations.read_only_hint is False
    assert tools["remember"].annotations.destructive_hint is False
    assert "query" in tools["recall"].input_schema["properties"]

    first, second, dup = out["remember"]
    assert not first.is_error and first.structured_content["added"] == 1
    assert not second.is_error and second.structured_content["added"] == 1
    assert dup.structured_content["added"] == 0  # same content is stored once

    recall = out["recall"]
    assert not recall.is_error
    assert "Miso" in recall.content[0].text  # the formatted context block comes first
    detail = json.loads(recall.content[1].text)
    assert any("Miso" in m["content"] for m in detail["memories"])
    assert recall.structured_content["context"] == recall.content[0].text
    assert recall.structured_content["tokens"] > 0

    assert "where" in tools["recall"].input_schema["properties"]
    only_chat = out["recall_where"].structured_content["memories"]
    assert [m["content"] for m in only_chat] == ["The user prefers metric units"]
    got = out["get"].structured_content
    assert not out["get"].is_error and "Miso" in got["content"] and got["archived"] is False
    assert out["get_missing"].is_error and "m-00000000000000ff" in text_of(out["get_missing"])
    listed = out["list"].structured_content
    assert listed["total"] == 1 and listed["memories"][0]["metadata"] == {"source": "chat"}

    assert not out["clusters"].is_error
    assert "clusters" in out["clusters"].structured_content

    history = out["history"].structured_content["entries"]
    assert [e["kind"] for e in history][:2] == ["ingest", "ingest"]

    assert not out["revert"].is_error, text_of(out["revert"])
    assert "Miso" not in text_of(out["recall_after"])

    bad = out["bad_revert"]
    assert bad.is_error
    assert "clagd error" in text_of(bad)

    assert not out["forget"].is_error, text_of(out["forget"])
    assert len(out["forget"].structured_content["forgotten"]) == 1
    assert "metric" not in text_of(out["recall_forgot"])
    assert out["bad_forget"].is_error and "not_found" in text_of(out["bad_forget"])

    # the MCP process wrote nothing but protocol to stdout, and logged no traceback
    assert "Traceback" not in (tmp_path / "mcp.err").read_text()


def test_tools_explain_a_stopped_daemon(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-m-") as short:
        missing = Path(short) / "nobody.sock"

        async def body(s: ClientSession) -> Any:
            tools = await s.list_tools()  # the server itself starts without a daemon
            assert {"remember", "update", "recall", "get", "list", "forget"} <= {
                t.name for t in tools.tools
            }
            return await s.call_tool("recall", {"query": "anything"})

        result = run_session(missing, tmp_path / "mcp.err", body)
    assert result.is_error
    message = text_of(result)
    assert "not running" in message
    assert "clagd run <store>" in message


def test_bad_arguments_are_tool_errors(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-m-") as short:

        async def body(s: ClientSession) -> Any:
            return await s.call_tool("memory_history", {"n": "many"})

        result = run_session(Path(short) / "x.sock", tmp_path / "mcp.err", body)
    assert result.is_error


def run_session_info(params: StdioServerParameters, errlog: Path, body: Any) -> tuple[Any, Any]:
    """Like run_session, for any server parameters; also returns the initialize result."""

    async def main() -> tuple[Any, Any]:
        with open(errlog, "w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                init = await session.initialize()
                with anyio.fail_after(60):
                    return init, await body(session)

    return anyio.run(main)


def test_server_info_descriptions_and_output_schemas(tmp_path: Path) -> None:
    import inspect

    from clagd import __version__

    with tempfile.TemporaryDirectory(prefix="clagd-m-") as short:

        async def body(s: ClientSession) -> Any:
            return (await s.list_tools()).tools

        init, tools = run_session_info(_params(Path(short) / "x.sock"), tmp_path / "e", body)
    assert init.server_info.name == "clagd"
    assert init.server_info.version == __version__
    assert {"remember", "update", "recall", "get", "list", "forget"} <= {t.name for t in tools}
    for tool in tools:
        desc = tool.description or ""
        assert desc and desc == inspect.cleandoc(desc), tool.name
        assert not any(line.startswith(" ") for line in desc.splitlines()), tool.name
        assert tool.output_schema is not None, f"{tool.name} has no output schema"
        assert tool.output_schema.get("type") == "object", tool.name
    recall = next(t for t in tools if t.name == "recall")
    props = recall.output_schema["properties"]
    assert set(props) == {"memories", "clusters", "context", "tokens"}
    assert set(recall.output_schema["required"]) == set(props)
    memory_schema = props["memories"]["items"]
    if "$ref" in memory_schema:  # the memory's schema is a definition
        name = memory_schema["$ref"].rsplit("/", 1)[1]
        memory_schema = recall.output_schema["$defs"][name]
    assert {"id", "content", "cluster_id", "score"} <= set(memory_schema["properties"])


def test_stopped_daemon_message_names_the_installed_unit_once(tmp_path: Path) -> None:
    from clagd.serve.units import install_service

    store = tmp_path / "agent-memory"
    # the unit install-service writes for this store: its name is what the message must say
    written, _ = install_service(store, dest=tmp_path / "units", exe="/usr/bin/clagd", force=True)
    unit = written[0].name
    assert unit == "clagd-agent-memory.service"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "clagd", "--store", str(store), "mcp"],
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )

    async def body(s: ClientSession) -> Any:
        return await s.call_tool("recall", {"query": "anything"})

    _, result = run_session_info(params, tmp_path / "mcp.err", body)
    assert result.is_error
    message = text_of(result)
    assert f"systemctl --user start {unit}" in message
    assert f"clagd run {store}" in message
    assert message.count("clagd run") == 1 and message.lower().count("start it") == 1
    assert "systemctl --user start clagd " not in message + " "  # no unit by a made-up name


def test_not_running_message_for_each_kind_of_socket(tmp_path: Path) -> None:
    from clagd.mcp_server import not_running_message
    from clagd.serve.units import render_unit

    # a store's default socket: the store and its user unit
    store = tmp_path / "notes"
    msg = not_running_message(store / ".clagd" / "clagd.sock", None)
    assert f"`clagd run {store}`" in msg and "systemctl --user start clagd-notes.service" in msg
    assert "(no socket file)" in msg
    # a system unit's socket, as render_unit writes it: that unit, with sudo
    units = render_unit("/var/lib/clagd/agent1", user=False, exe="/usr/bin/clagd")
    env = next(ln for ln in units["clagd-agent1.service"].splitlines() if "CLAGD_SOCKET=" in ln)
    system_sock = env.partition("CLAGD_SOCKET=")[2].strip('"')
    msg = not_running_message(system_sock, None)
    assert "sudo systemctl start clagd-agent1.service" in msg
    # a stale socket file: the connection is refused
    stale = tmp_path / "stale.sock"
    stale.touch()
    assert "(connection refused)" in not_running_message(stale, None)


def _bounds(prop: dict[str, Any]) -> dict[str, Any]:
    """minimum/maximum/minLength/maxLength of a property, wherever pydantic put them (on
    the property, or in the non-null branch of an `anyOf` for an optional one)."""
    out = {k: v for k, v in prop.items() if k in ("minimum", "maximum", "minLength", "maxLength")}
    for branch in prop.get("anyOf", []):
        out.update(_bounds(branch))
    return out


def test_every_argument_has_a_description_and_its_bounds(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-m-") as short:

        async def body(s: ClientSession) -> Any:
            return (await s.list_tools()).tools

        tools = {t.name: t for t in run_session(Path(short) / "x.sock", tmp_path / "e", body)}
    for tool in tools.values():
        for name, prop in tool.input_schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    props = {name: t.input_schema["properties"] for name, t in tools.items()}
    assert _bounds(props["recall"]["max_memories"]) == {"minimum": 1, "maximum": 100}
    assert _bounds(props["recall"]["token_budget"]) == {"minimum": 0}
    assert _bounds(props["recall"]["query"]) == {"minLength": 1}
    assert _bounds(props["memory_history"]["n"]) == {"minimum": 1, "maximum": 10000}
    assert _bounds(props["remember"]["content"]) == {"minLength": 1, "maxLength": 65536}
    assert _bounds(props["remember"]["importance"]) == {"minimum": 0, "maximum": 1}
    assert "0 " in props["remember"]["importance"]["description"]  # the scale, in words
    assert "importance 1-5" not in (tools["remember"].description or "")
    assert _bounds(props["revert"]["ref"]) == {"minLength": 1}


def test_argument_errors_name_the_argument_without_library_links(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    calls = {
        "empty query": ("recall", {"query": ""}, "'query'"),
        "blank query": ("recall", {"query": "   "}, "'query'"),
        "k out of range": ("recall", {"query": "x", "max_memories": 0}, "'max_memories'"),
        "negative budget": ("recall", {"query": "x", "token_budget": -5}, "'token_budget'"),
        "n not a number": ("memory_history", {"n": "many"}, "'n'"),
        "importance 5": ("remember", {"content": "x", "importance": 5}, "'importance'"),
        "importance in metadata": (
            "remember",
            {"content": "x", "metadata": {"importance": "high"}},
            "'importance'",
        ),
    }

    async def body(s: ClientSession) -> dict[str, Any]:
        return {what: await s.call_tool(tool, args) for what, (tool, args, _) in calls.items()}

    results = run_session(daemon.socket_path, tmp_path / "mcp.err", body)
    for what, (_tool, _, names) in calls.items():
        res = results[what]
        message = text_of(res)
        assert res.is_error, what
        assert names in message, (what, message)
        assert "pydantic" not in message and "http" not in message, (what, message)
        assert "'text'" not in message and "max_memories' must" not in message, (what, message)


def test_an_unknown_argument_is_refused_never_ignored(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Issue 24: `remember` took an unknown `user_id` and ignored it, so an agent written
    for mem0 stored every user's memories in one place. Every tool refuses an argument it
    does not take, naming it (and, for an owner argument, pointing to `scope`)."""

    async def body(s: ClientSession) -> dict[str, Any]:
        return {
            "user_id": await s.call_tool(
                "remember", {"content": "Ana's PIN is 1", "user_id": "ana"}
            ),
            "filters": await s.call_tool("recall", {"query": "PIN", "filters": {"a": 1}}),
            "namespace": await s.call_tool("list", {"namespace": "ana"}),
            "recall": await s.call_tool("recall", {"query": "PIN"}),
        }

    results = run_session(daemon.socket_path, tmp_path / "mcp.err", body)
    for what in ("user_id", "filters", "namespace"):
        res = results[what]
        assert res.is_error and f"unknown argument '{what}'" in text_of(res), text_of(res)
    assert "goes in 'scope'" in text_of(results["user_id"])
    assert "goes in 'scope'" not in text_of(results["filters"])
    assert not results["recall"].is_error
    assert results["recall"].structured_content["memories"] == []  # nothing was stored


def test_a_clusters_resource_and_a_prompt_with_recalls_context(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    async def body(s: ClientSession) -> dict[str, Any]:
        await s.call_tool("remember", {"content": "Ana is allergic to walnuts", "importance": 1})
        return {
            "resources": (await s.list_resources()).resources,
            "read": await s.read_resource("memory://clusters"),
            "prompts": (await s.list_prompts()).prompts,
            "prompt": await s.get_prompt(
                "answer_with_memory", {"question": "what is Ana allergic to?"}
            ),
        }

    out = run_session(daemon.socket_path, tmp_path / "mcp.err", body)
    assert [str(r.uri) for r in out["resources"]] == ["memory://clusters"]
    listed = json.loads(out["read"].contents[0].text)
    assert listed["unsorted"] == 1 and listed["clusters"] == []  # the memory is not filed yet
    [prompt] = out["prompts"]
    assert prompt.name == "answer_with_memory"
    assert [a.name for a in prompt.arguments or []] == ["question"]
    text = out["prompt"].messages[0].content.text
    assert "Ana is allergic to walnuts" in text  # recall's context, placed before the question
    assert text.index("walnuts") < text.index("Question: what is Ana allergic to?")


def test_mcp_update_replaces_a_fact_and_recall_can_still_show_it(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    async def body(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first = await s.call_tool("remember", {"content": "The user's gym is FitBox in Derby"})
        old = first.structured_content["ids"][0]
        out["old"] = old
        out["update"] = await s.call_tool(
            "update", {"memory_id": old, "content": "The user's gym is IronWorks in Derby"}
        )
        out["recall"] = await s.call_tool("recall", {"query": "which gym does the user use"})
        out["all"] = await s.call_tool(
            "recall", {"query": "which gym does the user use", "superseded": True}
        )
        out["bad"] = await s.call_tool("update", {"memory_id": old, "content": "x y z"})
        return out

    out = run_session(daemon.socket_path, tmp_path / "mcp.err", body)
    upd = out["update"]
    assert not upd.is_error, text_of(upd)
    assert upd.structured_content["supersedes"] == out["old"]
    assert "IronWorks" in text_of(out["recall"]) and "FitBox" not in text_of(out["recall"])
    assert "FitBox" in text_of(out["all"])
    assert out["bad"].is_error and "superseded" in text_of(out["bad"])
