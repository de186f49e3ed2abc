"""systemd integration without systemd libraries: sd_notify, the watchdog and socket activation.

Everything here is a no-op outside systemd (no `NOTIFY_SOCKET`, no `LISTEN_FDS`), so the
daemon calls it unconditionally. The protocols are small and stable (see sd_notify(3),
sd_watchdog_enabled(3) and sd_listen_fds(3)); implementing them directly keeps clagd free of a
C dependency and lets tests drive them with plain sockets.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, MutableMapping

__all__ = [
    "SD_LISTEN_FDS_START",
    "Watchdog",
    "extend_timeout",
    "journal_stream_connected",
    "listen_fds",
    "notify",
    "ready",
    "status",
    "stopping",
    "watchdog_interval",
    "watchdog_ping",
]

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


def _address(value: str) -> str | bytes:
    # "@name" is a socket in the abstract namespace: a leading NUL byte on the wire.
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def notify(*lines: str) -> bool:
    """Send `KEY=value` lines to the service manager; False when there is none or it failed.

    A failure is logged, never raised: a daemon must not die because systemd went away.
    """
    target = os.environ.get("NOTIFY_SOCKET")
    if not target or not lines:
        return False
    if not (target.startswith("/") or target.startswith("@")):
        log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract name; ignored", target)
        return False
    payload = "\n".join(lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(target))
            sock.sendall(payload)
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", target, exc)
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """Start-up is complete (index loaded, socket listening): `Type=notify` units go active."""
    lines = ["READY=1"]
    if status_text:
        lines.append(f"STATUS={_one_line(status_text)}")
    return notify(*lines)


def status(text: str) -> bool:
    """A one-line status shown by `systemctl status`."""
    return notify(f"STATUS={_one_line(text)}")


def stopping(status_text: str | None = None) -> bool:
    lines = ["STOPPING=1"]
    if status_text:
        lines.append(f"STATUS={_one_line(status_text)}")
    return notify(*lines)


def extend_timeout(seconds: float) -> bool:
    """Ask for more start-up (or shut-down) time, e.g. during a long first scan of a store."""
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")


def watchdog_ping() -> bool:
    return notify("WATCHDOG=1")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def watchdog_interval(env: MutableMapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of `WATCHDOG_USEC`), or None when not asked for.

    `WATCHDOG_PID`, when set, must be this process: the variables may have been inherited
    from a parent that is the one being watched.
    """
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not an integer; watchdog disabled", usec)
        return None
    if value <= 0:
        return None
    return value / 2 / 1_000_000


def listen_fds(unset_environment: bool = True) -> list[socket.socket]:
    """Sockets passed by systemd socket activation (fd 3 onwards), as socket objects.

    Only taken when `LISTEN_PID` is this process. The variables are then removed (unless
    `unset_environment` is False) so that child processes, such as the llama.cpp worker, do
    not believe the sockets are theirs. The fds are marked close-on-exec for the same reason.
    """
    env = os.environ
    pid, count = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    if not pid or not count:
        return []
    try:
        mine = int(pid) == os.getpid()
        n = int(count)
    except ValueError:
        log.warning("ignoring malformed LISTEN_PID=%r / LISTEN_FDS=%r", pid, count)
        return []
    if unset_environment:
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(var, None)
    if not mine or n <= 0:
        return []
    socks = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + n):
        os.set_inheritable(fd, False)
        socks.append(socket.socket(fileno=fd))
    return socks


def journal_stream_connected() -> bool:
    """True when stderr goes straight to the journal (`JOURNAL_STREAM` names its device:inode).

    Log lines should then be plain: the journal adds its own timestamps and has no colours.
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    if not value:
        return False
    try:
        dev, ino = (int(x) for x in value.split(":", 1))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return st.st_dev == dev and st.st_ino == ino


class Watchdog:
    """Pings the systemd watchdog while `healthy()` holds; stops pinging when it does not.

    The point is that systemd restarts a daemon that is alive but broken (a dead writer or
    server thread), not only one that crashed. `healthy` is called from the watchdog thread;
    it should be cheap (e.g. `all(t.is_alive() for t in threads)`). When not under a watchdog
    (`interval` is None and `WATCHDOG_USEC` unset) `start()` does nothing.
    """

    def __init__(
        self,
        healthy: Callable[[], bool],
        interval: float | None = None,
        ping: Callable[[], object] = watchdog_ping,
    ) -> None:
        self.healthy = healthy
        self.interval = watchdog_interval() if interval is None else interval
        self.pings = 0
        self._ping = ping
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported_unhealthy = False

    @property
    def enabled(self) -> bool:
        return self.interval is not None and self.interval > 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Watchdog:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="clagd-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        assert self.interval is not None
        while True:
            self.beat()
            if self._stop.wait(self.interval):
                return

    def beat(self) -> bool:
        """One check: ping if healthy. Returns whether it pinged."""
        try:
            ok = bool(self.healthy())
        except Exception:
            log.exception("watchdog health check failed")
            ok = False
        if not ok:
            if not self._reported_unhealthy:
                log.error("daemon unhealthy: not pinging the watchdog (systemd will restart it)")
                self._reported_unhealthy = True
            return False
        self._reported_unhealthy = False
        self._ping()
        self.pings += 1
        return True
