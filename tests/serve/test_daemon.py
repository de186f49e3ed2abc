from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import DaemonProcess, InProcessDaemon, git, head_contents, make_store, wait_for

from clagd.cli import main
from clagd.client import Client, ClientError, DaemonNotRunning
from clagd.errors import StoreLocked


def raw(sock_path: Path, payload: bytes, timeout: float = 10) -> list[dict]:
    """Send raw bytes, read reply lines until the server closes or goes quiet."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(sock_path))
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    s.close()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_protocol_round_trip(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        assert c.ping()["pong"] is True
        res = c.add_many(
            [
                {"content": "Alice prefers tea over coffee", "metadata": {"importance": 0.9}},
                {"content": "Bob's birthday is on 3 March"},
            ]
        )
        assert res["added"] == 2 and res["commit"]
        again = c.add("Alice prefers tea over coffee")
        assert again["added"] == 0 and again["duplicates"] == 1
        q = c.query("what does alice drink", max_memories=3)
        assert q.memories and q.memories[0].content == "Alice prefers tea over coffee"
        assert q.memories[0].metadata == {"importance": 0.9}
        assert "[Memory ·" in q.context and q.tokens > 0
        raw_q = c.call("query", text="birthday")
        assert set(raw_q) >= {"memories", "clusters", "context", "tokens"}
        assert set(raw_q["memories"][0]) >= {
            "id",
            "content",
            "cluster_id",
            "cluster_name",
            "score",
            "created_at",
            "metadata",
        }
        st = c.status()
        assert st["counts"]["memories"] == 2 and st["counters"]["queries"] == 2
        assert st["backend"]["active"] == "none"
        cl = c.clusters()
        assert cl["unsorted"] == 2
        entries = c.log(5)["entries"]
        assert [e["kind"] for e in entries] == ["ingest", "init"]
        assert c.round(3)["rounds_since_session"] >= 3
    assert sorted(head_contents(daemon.root)) == [
        "Alice prefers tea over coffee",
        "Bob's birthday is on 3 March",
    ]


def test_bad_requests_get_error_replies_and_the_daemon_keeps_serving(
    daemon: InProcessDaemon,
) -> None:
    replies = raw(
        daemon.socket,
        b"{not json\n"
        b'"a string"\n'
        b'{"id": 1, "op": "fly"}\n'
        b'{"id": 2}\n'
        b'{"id": 3, "op": "query"}\n'
        b'{"id": 4, "op": "add", "items": [{"content": 5}]}\n'
        b'{"id": 5, "op": "query", "text": "x", "max_memories": "lots"}\n'
        b'{"id": 6, "op": "log", "n": -1}\n'
        b'{"id": 7, "op": "ping"}\n',
    )
    codes = [(r["id"], r["ok"], r.get("error", {}).get("code")) for r in replies]
    assert codes == [
        (None, False, "bad_json"),
        (None, False, "bad_request"),
        (1, False, "unknown_op"),
        (2, False, "bad_request"),
        (3, False, "bad_request"),
        (4, False, "invalid_memory"),
        (5, False, "bad_request"),
        (6, False, "bad_request"),
        (7, True, None),
    ]
    with daemon.client() as c:
        assert c.ping()["pong"]


def test_oversized_request_is_refused(store: Path, short_tmp: Path) -> None:
    make_store(store, {"server": {"max_request_bytes": 1000}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        replies = raw(d.socket, b'{"op": "add", "content": "' + b"x" * 5000 + b'"}\n')
        assert replies[0]["error"]["code"] == "too_large"
        with d.client() as c:
            assert c.ping()["pong"]
    finally:
        d.stop()


def test_slow_client_times_out_and_others_are_served(store: Path, short_tmp: Path) -> None:
    make_store(store, {"server": {"read_timeout": 0.5}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(str(d.socket))
        slow.sendall(b'{"op": "pi')  # and then nothing
        with d.client() as c:
            assert c.ping()["pong"]
        slow.settimeout(10)
        assert slow.recv(100) == b""  # the server hung up on the idle client
        slow.close()
    finally:
        d.stop()


def test_many_concurrent_clients(daemon: InProcessDaemon) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with daemon.client() as c:
                c.add(f"concurrent memory number {i} about topic {i % 7}")
                for _ in range(5):
                    c.query(f"topic {i % 7}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(head_contents(daemon.root)) == 40


def test_client_of_another_uid_is_refused(daemon: InProcessDaemon) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    os.chmod(daemon.socket, 0o666)  # so that only the uid check stands in the way
    os.chmod(daemon.socket.parent, 0o755)
    code = (
        "import os, socket, json, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({str(daemon.socket)!r})\n"
        's.sendall(b\'{"id": 1, "op": "status"}\\n\')\n'
        "print(s.makefile().readline())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and reply["error"]["code"] == "forbidden"


def test_socket_is_private(daemon: InProcessDaemon) -> None:
    assert daemon.socket.stat().st_mode & 0o777 == 0o600


def test_second_daemon_on_the_same_store_is_refused(
    daemon: InProcessDaemon, short_tmp: Path
) -> None:
    with pytest.raises(StoreLocked):
        InProcessDaemon(daemon.root, short_tmp / "other.sock")


def test_sigterm_finishes_the_batch_removes_socket_and_releases_lock(
    daemon_proc: DaemonProcess,
) -> None:
    daemon_proc.start()
    with daemon_proc.client() as c:
        c.add("committed before the signal")
    (daemon_proc.root / "inbox" / "late.txt").write_text("dropped just before shutdown")
    assert daemon_proc.terminate() == 0
    assert not daemon_proc.socket.exists()
    assert "dropped just before shutdown" in head_contents(daemon_proc.root)
    assert not (daemon_proc.root / "inbox" / "late.txt").exists()
    # lock released: a new daemon starts
    daemon_proc.start()
    assert daemon_proc.terminate() == 0


def test_restart_after_kill_recovers_lock_socket_and_index_lock(daemon_proc: DaemonProcess) -> None:
    daemon_proc.start()
    with daemon_proc.client() as c:
        c.add("survives a kill")
    daemon_proc.kill()
    assert daemon_proc.socket.exists()  # left behind by SIGKILL
    (daemon_proc.root / ".git" / "index.lock").write_text("")
    os.utime(daemon_proc.root / ".git" / "index.lock", (0, 0))
    daemon_proc.start()
    with daemon_proc.client() as c:
        c.add("after the restart")
        assert c.status()["counts"]["memories"] == 2
    assert daemon_proc.terminate() == 0
    assert sorted(head_contents(daemon_proc.root)) == ["after the restart", "survives a kill"]
    assert git(daemon_proc.root, "fsck", "--no-progress").strip() == ""


def test_half_written_change_is_discarded_at_start(store: Path, short_tmp: Path) -> None:
    (store / "unsorted" / "u-20260101T000000-abcdef.yaml").write_text(
        "memories:\n- {id: m-0000000000000001, content: half}\n"
    )
    (store / ".git" / "clagd-txn").write_text("ingest\n")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        assert not (store / "unsorted" / "u-20260101T000000-abcdef.yaml").exists()
        with d.client() as c:
            assert c.status()["counts"]["memories"] == 0
            assert any("half-written" in n for n in c.status()["recovery"])
    finally:
        d.stop()


def test_cli_commands_against_a_real_daemon(daemon: InProcessDaemon) -> None:
    r = CliRunner()
    base = ["--socket", str(daemon.socket), "--store", str(daemon.root)]
    out = r.invoke(main, [*base, "add", "The garage code is 4512", "-m", "importance=0.9"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("added m-")
    out = r.invoke(main, [*base, "query", "garage code"])
    assert out.exit_code == 0 and "The garage code is 4512" in out.output
    out = r.invoke(main, [*base, "query", "garage code", "--json"])
    assert json.loads(out.output)["memories"][0]["metadata"] == {"importance": 0.9}
    for cmd in (["status"], ["clusters"], ["log"]):
        text = r.invoke(main, [*base, *cmd])
        assert text.exit_code == 0, text.output
        js = r.invoke(main, [*base, *cmd, "--json"])
        assert js.exit_code == 0 and isinstance(json.loads(js.output), dict)
    assert "ingest" in r.invoke(main, [*base, "log"]).output


def test_cli_says_clearly_when_no_daemon_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "clagd", "--store", str(tmp_path / "none"), "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clagd: ") and "clagd run" in lines[0]
    with pytest.raises(DaemonNotRunning):
        Client(tmp_path / "x.sock").ping()


def test_error_reply_surfaces_in_cli(daemon: InProcessDaemon) -> None:
    out = CliRunner().invoke(main, ["--socket", str(daemon.socket), "revert", "0123abcd"])
    assert out.exit_code == 1 and "no commit" in out.output
    with daemon.client() as c, pytest.raises(ClientError) as exc:
        c.revert("0123abcd")
    assert exc.value.code == "not_found"


def test_cli_init_and_run_creates_store(tmp_path: Path, short_tmp: Path) -> None:
    out = CliRunner().invoke(main, ["init", str(tmp_path / "s")])
    assert out.exit_code == 0 and "created" in out.output
    assert (tmp_path / "s" / ".git").is_dir()
    p = DaemonProcess(tmp_path / "fresh", short_tmp / "f.sock").start()
    try:
        assert (tmp_path / "fresh" / "clagd.yaml").exists()
        wait_for(lambda: "init" in git(tmp_path / "fresh", "log", "--format=%s"))
    finally:
        assert p.terminate() == 0
