"""Query processes (`server.query_processes`): queries answered outside the daemon's GIL
from a copy of the index that the daemon keeps in step, everything else handed to the
daemon; a client never sees the difference (its writes are in its next query), a process
that dies is replaced while the daemon serves, and none outlives the daemon."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from helpers import DaemonProcess, InProcessDaemon, git, make_store, wait_for

from clagd.client import Client
from clagd.config import load_config


def qstatus(c: Client) -> dict[str, Any]:
    return c.status()["query_processes"]


def serving(c: Client) -> dict[str, Any] | None:
    st = qstatus(c)
    return st if st["serving"] == st["configured"] and st["serving"] > 0 else None


def comparable(reply: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(m["id"], m["cluster_id"], m["score"]) for m in reply["memories"]]


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_queries_come_from_a_query_process_that_serves_every_write(
    daemon: InProcessDaemon,
) -> None:
    eng = daemon.engine
    with daemon.client() as c:
        st = wait_for(lambda: serving(c), 60, "the query process to serve")
        pid = st["processes"][0]["pid"]
        assert pid != os.getpid() and not gone(pid)
        asked, rounds = st["processes"][0]["queries"], eng.rounds_since_session
        words = ["kayak", "zither", "quinoa", "falcon", "origami", "tundra", "saffron", "violin"]
        for i, w in enumerate(words):
            added = c.add(f"Entry {i}: the user keeps a {w} in the garage")
            # a write is answered only once the query process serves it
            got = c.query(f"where is the {w}", max_memories=3)
            assert got.memories and got.memories[0].id == added["ids"][0], w
        after = qstatus(c)["processes"][0]
        assert after["pid"] == pid
        # answered there, not by the daemon, and counted by the daemon before it answers
        # the next request that came through that process
        assert after["queries"] == asked + len(words)
        assert eng.rounds_since_session == rounds + len(words)
        assert eng.stats.memories  # and its access statistics
        for n in range(5):
            total = c.status()["counters"]["queries"]
            c.query(f"garage {n}")
            assert c.status()["counters"]["queries"] == total + 1
        # the copy answers exactly as the daemon's own index (a query of the archive is
        # the daemon's: the store has no archive, so the answers must be the same)
        for text in ["garage", "user keeps", "falcon tundra", "nothing matches this"]:
            mine = c.call("query", text=text, max_memories=5)
            theirs = c.call("query", text=text, max_memories=5, include_archive=True)
            assert comparable(mine) == comparable(theirs) and mine["context"] == theirs["context"]
        # revert and a session change the index wholesale: still the same answers
        c.revert(git(daemon.root, "rev-parse", "HEAD").strip())
        gone_now = c.query("where is the violin", max_memories=3)
        assert all("violin" not in m.content for m in gone_now.memories)
        c.call("recluster")
        for text in ["garage", "saffron", "kayak zither"]:
            mine = c.call("query", text=text)
            theirs = c.call("query", text=text, include_archive=True)
            assert comparable(mine) == comparable(theirs)


def test_organizing_runs_nicer_than_the_query_processes(daemon: InProcessDaemon) -> None:
    """On a busy CPU a query must not wait behind a session or a route pass: the daemon's
    organizing threads run `server.background_nice` nicer than the query processes."""
    with daemon.client() as c:
        pid = wait_for(lambda: serving(c), 60, "the query process to serve")["processes"][0]["pid"]
    writer = daemon.engine.writer._thread.native_id
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert os.getpriority(os.PRIO_PROCESS, pid) == mine  # the query process: as the caller
    assert daemon.daemon.config.server.background_nice == 10
    assert os.getpriority(os.PRIO_PROCESS, writer) == min(19, mine + 10)
    # registered where they start: the writer, the inbox watcher, the scheduler's job threads
    organizing = daemon.daemon.organizing
    assert len(organizing.threads()) >= 3
    for t in organizing.threads():
        if t.native_id is not None:
            assert os.getpriority(os.PRIO_PROCESS, t.native_id) == min(19, mine + 10), t.name


def test_ingested_memories_are_found_once_status_says_they_are_in(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        wait_for(lambda: serving(c), 60, "the query process to serve")
        before = c.status()["inbox"]["files_ingested"]
        tmp = daemon.root / "inbox" / ".tmp"
        tmp.mkdir(exist_ok=True)
        (tmp / "a.json").write_text(json.dumps([{"content": "The boiler code is 4471"}]))
        os.rename(tmp / "a.json", daemon.root / "inbox" / "a.json")
        wait_for(
            lambda: c.status()["inbox"]["files_ingested"] > before, 30, "the file to be ingested"
        )
        got = c.query("boiler code")
        assert got.memories and got.memories[0].content == "The boiler code is 4471"


def test_other_requests_and_bad_ones_are_answered_by_the_daemon(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        wait_for(lambda: serving(c), 60, "the query process to serve")
        assert c.ping()["pid"] == os.getpid()  # the daemon's, through the query process
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(daemon.socket))
    s.sendall(b'not json\n{"op": "nope", "id": 7}\n{"op": "query", "text": "", "id": 8}\n')
    s.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    replies = [json.loads(line) for line in data.splitlines()]
    assert [r["error"]["code"] for r in replies] == ["bad_json", "unknown_op", "bad_request"]
    assert [r.get("id") for r in replies[1:]] == [7, 8]
    with daemon.client() as c:
        assert c.add("still serving")["added"] == 1


def test_a_query_process_that_dies_is_replaced_while_the_daemon_serves(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        c.add("The spare key is under the blue pot")
        st = wait_for(lambda: serving(c), 60, "the query process to serve")
        pid = st["processes"][0]["pid"]
    os.kill(pid, 9)
    answered = 0

    def replaced() -> bool:
        nonlocal answered
        with daemon.client() as c:  # a new connection each time: whoever accepts it answers
            got = c.query("spare key")
            assert got.memories and "blue pot" in got.memories[0].content
            answered += 1
            st = qstatus(c)
        return st["restarts"] >= 1 and st["serving"] == 1 and st["processes"][0]["pid"] != pid

    wait_for(replaced, 60, "a new query process")
    assert answered >= 1 and daemon.daemon.healthy()


def test_a_connection_the_daemon_holds_goes_to_the_process_that_serves_again(
    daemon: InProcessDaemon,
) -> None:
    """A client that connected while no query process served keeps its connection: once a
    process serves again, the daemon answers what that connection had sent and passes it
    to the process (SCM_RIGHTS). A client that never reconnects (a raw socket, one request
    line after another) goes on on the same connection, an `add` included, and its
    queries are answered by the process."""
    with daemon.client() as c:
        c.add("The spare key is under the blue pot")
        pid = wait_for(lambda: serving(c), 60, "the query process to serve")["processes"][0]["pid"]
    os.kill(pid, 9)
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.settimeout(60)
    held.connect(str(daemon.socket))
    lines = held.makefile("rb")
    n = 0

    def ask(op: str, **params: Any) -> Any:
        nonlocal n
        n += 1
        held.sendall(json.dumps({"id": n, "op": op, **params}).encode() + b"\n")
        reply = json.loads(lines.readline())
        assert reply["id"] == n and reply["ok"], reply
        return reply["result"]

    def new_serving() -> dict[str, Any] | None:
        with daemon.client() as c:
            return serving(c)

    try:
        # accepted by the daemon: no process serves until the new one has caught up
        wait_for(
            lambda: ask("status")["query_processes"]["processes"][0]["pid"] != pid, 60, "a restart"
        )
        asked = wait_for(new_serving, 60, "the new query process to serve")["processes"][0][
            "queries"
        ]
        assert "blue pot" in ask("query", text="spare key")["memories"][0]["content"]
        added = ask("add", content="The bike lock code is 4312")
        got = ask("query", text="bike lock code", max_memories=3)
        assert got["memories"] and got["memories"][0]["id"] == added["ids"][0]

        def answered_there() -> bool:
            return ask("status")["query_processes"]["processes"][0]["queries"] > asked

        wait_for(answered_there, 10, "the query process to answer the held connection")
    finally:
        lines.close()
        held.close()


def test_no_query_process_outlives_the_daemon(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "store")
    d = DaemonProcess(store, short_tmp / "k.sock").start()
    with d.client() as c:
        c.add("The wifi password is hunter2")
        pid = wait_for(lambda: serving(c), 60, "the query process to serve")["processes"][0]["pid"]
    d.kill()  # SIGKILL: no shutdown code runs
    wait_for(lambda: gone(pid), 10, "the query process to die with the daemon")
    d.start()  # and nothing holds the socket: a new daemon serves it
    with d.client() as c:
        assert "hunter2" in c.query("wifi password").memories[0].content
        wait_for(lambda: serving(c), 60, "the new daemon's query process")
    assert d.terminate() == 0


def test_without_query_processes_the_daemon_answers_queries_itself(
    tmp_path: Path, short_tmp: Path
) -> None:
    store = make_store(tmp_path / "store", {"server": {"query_processes": 0}})
    d = InProcessDaemon(store, short_tmp / "z.sock", load_config(store))
    try:
        with d.client() as c:
            c.add("The car is parked on level 3")
            assert c.query("car parked").memories
            assert qstatus(c) == {"configured": 0, "serving": 0}
        assert d.engine.counters["queries"] == 1
    finally:
        d.stop()


def test_a_deleted_socket_is_served_again_by_new_query_processes(
    daemon: InProcessDaemon,
) -> None:
    """`rm` of the socket (or a `git clean` of the runtime folder): the daemon re-creates
    it, and its query processes start again at once on the new one."""
    with daemon.client() as c:
        c.add("The passport is in the top drawer")
        wait_for(lambda: serving(c), 60, "the query process to serve")
    daemon.socket.unlink()
    daemon.daemon._check_socket()  # what its main loop does every second

    def back() -> dict[str, Any] | None:
        with daemon.client() as c:
            st = qstatus(c)
        return st if st["replaced"] >= 1 and st["serving"] == 1 else None

    st = wait_for(back, 30, "query processes on the new socket")
    assert st["restarts"] == 0  # not a failure: no back-off
    with daemon.client() as c:
        assert "top drawer" in c.query("passport").memories[0].content
        assert qstatus(c)["processes"][0]["queries"] >= 1
