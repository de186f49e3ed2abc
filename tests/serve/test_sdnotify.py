"""sd_notify, the watchdog and socket activation, driven with plain sockets (no systemd)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO

from clagd.serve import sdnotify


class NotifyListener:
    """The service manager's side of NOTIFY_SOCKET: a datagram socket the test reads."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)

    def recv(self, timeout: float = 5.0) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def pending(self) -> list[str]:
        """Datagrams already queued, without waiting."""
        out = []
        self.sock.setblocking(False)
        try:
            while True:
                out.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return out
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifyListener]:
    with tempfile.TemporaryDirectory(prefix="clagd-n-") as d:
        path = os.path.join(d, "notify.sock")
        lst = NotifyListener(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield lst
        lst.close()


def test_notify_is_a_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready() is False
    assert sdnotify.watchdog_ping() is False


def test_ready_status_stopping(listener: NotifyListener) -> None:
    assert sdnotify.ready("serving 3 clusters") is True
    assert listener.recv() == "READY=1\nSTATUS=serving 3 clusters"
    assert sdnotify.status("clustering\nsession 4") is True
    assert listener.recv() == "STATUS=clustering session 4"
    assert sdnotify.watchdog_ping() is True
    assert listener.recv() == "WATCHDOG=1"
    assert sdnotify.extend_timeout(2.5) is True
    assert listener.recv() == "EXTEND_TIMEOUT_USEC=2500000"
    assert sdnotify.stopping("shutting down") is True
    assert listener.recv() == "STOPPING=1\nSTATUS=shutting down"


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"clagd-test-{secrets.token_hex(6)}"
    lst = NotifyListener(b"\0" + name.encode())
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready() is True
        assert lst.recv() == "READY=1"
    finally:
        lst.close()


def test_unreachable_notify_socket_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sdnotify.notify("READY=1") is False
    assert "sd_notify" in caplog.text
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert sdnotify.notify("READY=1") is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "bad"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "200000"}) == 0.1


def test_watchdog_pings_only_while_healthy(listener: NotifyListener) -> None:
    interval = 0.05
    healthy = threading.Event()
    healthy.set()
    checks_while_sick = 0
    sick_enough = threading.Event()

    def check() -> bool:
        nonlocal checks_while_sick
        if healthy.is_set():
            return True
        checks_while_sick += 1
        if checks_while_sick >= 4:
            sick_enough.set()
        return False

    wd = sdnotify.Watchdog(check, interval=interval)
    assert wd.enabled
    with wd:
        assert wd.running
        stamps = []
        for _ in range(3):
            assert listener.recv() == "WATCHDOG=1"
            stamps.append(time.monotonic())
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        assert all(g >= interval * 0.8 for g in gaps), gaps

        healthy.clear()
        listener.pending()  # a ping may have raced with clear()
        assert sick_enough.wait(5)
        assert listener.pending() == []  # four checks failed, no ping went out

        healthy.set()
        assert listener.recv() == "WATCHDOG=1"
    assert not wd.running
    listener.pending()
    pings = wd.pings
    # stopped: no more pings (nothing left to wait for: the thread has been joined)
    assert listener.pending() == [] and wd.pings == pings


def test_watchdog_takes_interval_from_environment(
    monkeypatch: pytest.MonkeyPatch, listener: NotifyListener
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    wd = sdnotify.Watchdog(lambda: True)
    assert wd.interval == 0.05
    with wd:
        assert listener.recv() == "WATCHDOG=1"


def test_watchdog_disabled_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    wd = sdnotify.Watchdog(lambda: True)
    assert not wd.enabled
    wd.start()
    assert not wd.running
    wd.stop()


def test_watchdog_treats_a_raising_check_as_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    pinged = []

    def boom() -> bool:
        raise RuntimeError("writer thread gone")

    wd = sdnotify.Watchdog(boom, interval=1.0, ping=lambda: pinged.append(1))
    assert wd.beat() is False
    assert pinged == []
    assert "health check failed" in caplog.text


CHILD = r"""
import json, os, sys
from clagd.serve import sdnotify
socks = sdnotify.listen_fds()
info = {
    "n": len(socks),
    "fds": [s.fileno() for s in socks],
    "family": [int(s.family) for s in socks],
    "type": [int(s.type) for s in socks],
    "inheritable": [os.get_inheritable(s.fileno()) for s in socks],
    "env_left": sorted(k for k in os.environ if k.startswith("LISTEN_")),
}
print(json.dumps(info), flush=True)
for s in socks:
    conn, _ = s.accept()
    with conn:
        conn.sendall(b"hello from fd %d\n" % s.fileno())
    s.close()
"""


def _spawn_activated(listening: socket.socket, listen_pid: str = "") -> subprocess.Popen[str]:
    """Start the child as systemd would: the socket on fd 3, LISTEN_PID = the child's pid."""
    fd = listening.fileno()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["LISTEN_FDS"] = "1"
    env["LISTEN_FDNAMES"] = "clagd.socket"
    # Like systemd between fork and exec: move the socket to fd 3, set LISTEN_PID, exec.
    launcher = (
        "import os, sys\n"
        f"if {fd} != 3:\n    os.dup2({fd}, 3)\n    os.close({fd})\n"
        f"os.environ['LISTEN_PID'] = {listen_pid!r} or str(os.getpid())\n"
        "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", launcher, CHILD],
        pass_fds=(fd,),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_socket_activation_hands_over_fd_3(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-a-") as d:
        path = os.path.join(d, "clagd.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
            listening.bind(path)
            listening.listen(4)
            proc = _spawn_activated(listening)
        # only the child holds the listening socket now
        try:
            assert proc.stdout is not None
            info = json.loads(proc.stdout.readline())
            assert info["n"] == 1
            assert info["fds"] == [3]
            assert info["family"] == [int(socket.AF_UNIX)]
            assert info["type"] == [int(socket.SOCK_STREAM)]
            assert info["inheritable"] == [False]
            assert info["env_left"] == []
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(10)
                c.connect(path)
                assert c.makefile("rb").readline() == b"hello from fd 3\n"
            assert proc.wait(10) == 0
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]


def test_socket_activation_ignores_fds_meant_for_another_pid(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="clagd-a-") as d:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
            listening.bind(os.path.join(d, "x.sock"))
            listening.listen(1)
            proc = _spawn_activated(listening, listen_pid="1")
        try:
            out, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
            proc.wait()
        info = json.loads(out)
        assert info["n"] == 0
        assert info["env_left"] == []  # unset anyway, so that children do not take them


def test_listen_fds_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    monkeypatch.delenv("LISTEN_PID", raising=False)
    assert sdnotify.listen_fds() == []


def test_journal_stream_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert sdnotify.journal_stream_connected() is False
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert sdnotify.journal_stream_connected() is True
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
    assert sdnotify.journal_stream_connected() is False
    monkeypatch.setenv("JOURNAL_STREAM", "garbage")
    assert sdnotify.journal_stream_connected() is False
