"""Unit rendering for `clagd install-service`, the shipped units, and `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO

from clagd.client import Client, default_socket_path
from clagd.protocol import private_runtime_dir
from clagd.serve.units import (
    EX_CONFIG,
    install_service,
    install_service_command,
    render_static_units,
    render_unit,
    unit_name,
)

SYSTEMD_DIR = REPO / "systemd"
EXE = [sys.executable, "-m", "clagd"]


def keys(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def test_user_unit_for_a_store(tmp_path: Path) -> None:
    store = tmp_path / "agent-mem"
    units = render_unit(store, user=True, socket_activation=False, exe="/opt/clagd/bin/clagd")
    assert list(units) == ["clagd-agent-mem.service"]
    k = keys(units["clagd-agent-mem.service"])
    assert k["Type"] == ["notify"]
    assert k["NotifyAccess"] == ["main"]
    assert k["ExecStart"] == [f"/opt/clagd/bin/clagd run {store}"]
    assert f"CLAGD_SOCKET={default_socket_path(store)}" in k["Environment"]
    assert k["WatchdogSec"] == ["60"]
    assert k["Restart"] == ["on-failure"]
    assert k["RestartPreventExitStatus"] == [str(EX_CONFIG)]
    assert k["KillSignal"] == ["SIGTERM"]
    assert k["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP reloads clagd.yaml
    assert k["ReadWritePaths"] == [str(store)]
    for hardening in ("NoNewPrivileges", "PrivateTmp", "LockPersonality"):
        assert k[hardening] == ["yes"]
    assert k["ProtectSystem"] == ["strict"]
    assert k["ProtectHome"] == ["read-only"]
    assert "AF_UNIX" in k["RestrictAddressFamilies"][0]
    assert "MemoryDenyWriteExecute" not in k
    assert k["WantedBy"] == ["default.target"]
    assert "User" not in k


def test_socket_activated_user_units(tmp_path: Path) -> None:
    store = tmp_path / "s"
    units = render_unit(store, user=True, socket_activation=True, exe=EXE, name="clagd-x")
    assert set(units) == {"clagd-x.service", "clagd-x.socket"}
    svc, sock = keys(units["clagd-x.service"]), keys(units["clagd-x.socket"])
    assert svc["Requires"] == ["clagd-x.socket"]
    assert sock["ListenStream"] == [str(default_socket_path(store))]
    assert sock["SocketMode"] == ["0600"]
    assert sock["WantedBy"] == ["sockets.target"]
    assert svc["ExecStart"] == [f"{sys.executable} -m clagd run {store}"]


def test_system_units_run_as_dedicated_user() -> None:
    units = render_unit(
        Path("/var/lib/clagd/agent1"), user=False, socket_activation=True, exe="/usr/bin/clagd"
    )
    svc, sock = keys(units["clagd-agent1.service"]), keys(units["clagd-agent1.socket"])
    assert svc["User"] == ["clagd"] and svc["Group"] == ["clagd"]
    assert svc["StateDirectory"] == ["clagd/agent1"]
    assert svc["ProtectHome"] == ["yes"]
    assert svc["RuntimeDirectory"] == ["clagd"]
    assert "CLAGD_SOCKET=/run/clagd/agent1.sock" in svc["Environment"]
    assert sock["ListenStream"] == ["/run/clagd/agent1.sock"]
    assert sock["SocketUser"] == ["clagd"] and sock["SocketMode"] == ["0660"]
    assert svc["WantedBy"] == ["multi-user.target"]
    assert svc["CapabilityBoundingSet"] == [""]


def test_awkward_paths_are_escaped(tmp_path: Path) -> None:
    store = tmp_path / "my 100% $HOME store"
    units = render_unit(store, user=True, exe=EXE, name="clagd-odd")
    k = keys(units["clagd-odd.service"])
    escaped = str(store).replace("%", "%%").replace("$", "$$")
    assert k["ExecStart"] == [f'{sys.executable} -m clagd run "{escaped}"']
    assert k["ReadWritePaths"] == [f'"{str(store).replace("%", "%%")}"']
    env = f'"CLAGD_SOCKET={str(default_socket_path(store)).replace("%", "%%")}"'
    assert env in k["Environment"]  # Environment= does not expand $: no $$ there
    assert unit_name(store) == "clagd-my-100-HOME-store"


def test_long_store_path_uses_runtime_directory_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4321")  # not consulted
    store = tmp_path / ("long" * 30)
    units = render_unit(store, user=True, socket_activation=True, exe=EXE, name="clagd-long")
    svc, sock = keys(units["clagd-long.service"]), keys(units["clagd-long.socket"])
    path = default_socket_path(store)
    assert path.parent == private_runtime_dir()
    assert sock["ListenStream"] == [str(path)]
    if path.parent == Path(f"/run/user/{os.getuid()}/clagd"):
        assert svc["RuntimeDirectory"] == ["clagd"]
        assert svc["RuntimeDirectoryPreserve"] == ["yes"]
    else:  # no logind runtime directory here: the home one, writable in the sandbox
        assert any(str(path.parent) in v for v in svc["ReadWritePaths"])


def test_deny_write_execute_opt_in(tmp_path: Path) -> None:
    units = render_unit(tmp_path / "s", exe=EXE, deny_write_execute=True, name="clagd-s")
    assert keys(units["clagd-s.service"])["MemoryDenyWriteExecute"] == ["yes"]


def test_install_service_writes_units_and_says_what_next(tmp_path: Path) -> None:
    store = tmp_path / "mem"
    dest = tmp_path / "units"
    # tmp_path is under /tmp, which PrivateTmp=yes hides: force (the check has its own tests)
    written, command = install_service(store, user=True, dest=dest, exe=EXE, force=True)
    assert written == [dest / "clagd-mem.service"]
    assert written[0].read_text() == render_unit(store, exe=EXE)["clagd-mem.service"]
    assert store.is_dir()  # ReadWritePaths= needs it
    assert command == (
        "systemctl --user daemon-reload && systemctl --user enable --now clagd-mem.service"
    )
    written, command = install_service(
        store, user=False, dest=dest, socket_activation=True, exe=EXE, force=True
    )
    assert sorted(p.name for p in written) == ["clagd-mem.service", "clagd-mem.socket"]
    assert command.endswith("sudo systemctl enable --now clagd-mem.socket")


def test_install_service_command_prints(tmp_path: Path) -> None:
    lines: list[str] = []
    written = install_service_command(
        tmp_path / "m", True, tmp_path / "u", lines.append, exe=EXE, force=True
    )
    lines = [ln for ln in lines if not ln.startswith("warning: ")]  # tmp_path is under /tmp
    assert lines[0] == f"wrote {written[0]}"
    assert "systemctl --user enable --now clagd-m.service" in "\n".join(lines)


def test_install_service_default_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    written, _ = install_service(tmp_path / "m", exe=EXE, force=True)
    assert written == [tmp_path / "cfg" / "systemd" / "user" / "clagd-m.service"]


def _unit_files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def test_shipped_units_match_the_renderer() -> None:
    """systemd/ is generated: `python -m clagd.serve.units --write-static systemd`."""
    assert _unit_files(SYSTEMD_DIR) == render_static_units()


def test_the_write_static_command_writes_the_shipped_units(tmp_path: Path) -> None:
    """The command docs/service.md gives packagers, run as they would run it."""
    cmd = [sys.executable, "-m", "clagd.serve.units", "--write-static", str(tmp_path / "units")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert _unit_files(tmp_path / "units") == _unit_files(SYSTEMD_DIR)
    printed = sorted(Path(line).relative_to(tmp_path / "units") for line in done.stdout.split())
    assert [str(p) for p in printed] == sorted(render_static_units())
    bare = subprocess.run(cmd[:3], capture_output=True, text=True, timeout=60, check=False)
    assert bare.returncode == 2 and "python -m clagd.serve.units" in bare.stdout


# --------------------------------------------------------------------------- systemd-analyze


def _analyze(tmp_path: Path, files: dict[str, str], user: bool, names: list[str]) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit_dir = tmp_path / ("user" if user else "system")
    unit_dir.mkdir(parents=True)
    for name, text in files.items():
        (unit_dir / name).write_text(text)
    env = dict(os.environ)
    if user:
        runtime = tmp_path / "xdg"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    cmd = [tool, *(["--user"] if user else []), "verify", *(f"./{n}" for n in names)]
    proc = subprocess.run(cmd, cwd=unit_dir, env=env, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    if "Failed to initialize manager" in out or "Failed to lookup RuntimeDirectory" in out:
        pytest.skip(f"systemd-analyze cannot run here: {out.strip()}")
    # warnings (unknown keys, bad values) do not change the exit code: no output is the bar
    assert proc.returncode == 0 and out.strip() == "", out


def test_verify_rendered_user_units(tmp_path: Path) -> None:
    units = render_unit(tmp_path / "store", user=True, socket_activation=True, exe=EXE)
    _analyze(tmp_path, units, user=True, names=sorted(units))


def test_verify_rendered_system_units(tmp_path: Path) -> None:
    units = render_unit(Path("/var/lib/clagd/agent1"), user=False, socket_activation=True, exe=EXE)
    _analyze(tmp_path, units, user=False, names=sorted(units))


def test_verify_rendered_units_with_awkward_path(tmp_path: Path) -> None:
    units = render_unit(tmp_path / "a 100% $odd store", user=True, exe=EXE, name="clagd-odd")
    _analyze(tmp_path, units, user=True, names=sorted(units))


def test_verify_parses_an_awkward_executable_path(tmp_path: Path) -> None:
    """verify checks that ExecStart's program exists: proof that the quoting round-trips."""
    bindir = tmp_path / "bin dir 50% $x"
    bindir.mkdir()
    exe = bindir / "clagd"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    units = render_unit(tmp_path / "st $y", user=True, exe=str(exe), name="clagd-st")
    _analyze(tmp_path / "one", units, user=True, names=sorted(units))
    exe.unlink()
    with pytest.raises(AssertionError, match="is not executable"):
        _analyze(tmp_path / "two", units, user=True, names=sorted(units))


def _static(kind: str) -> dict[str, str]:
    # The shipped units name the usual install locations of the script; verify checks that
    # ExecStart is executable, so point it at this interpreter's clagd instead.
    real = " ".join(EXE)
    out = {}
    for rel, text in render_static_units(exe_user=real, exe_system=real).items():
        folder, _, name = rel.partition("/")
        if folder == kind and not name.endswith(".conf"):
            out[name] = text
    return out


def test_verify_shipped_user_units(tmp_path: Path) -> None:
    _analyze(
        tmp_path,
        _static("user"),
        user=True,
        names=["clagd.service", "clagd.socket", "clagd@agent1.service", "clagd@agent1.socket"],
    )


def test_verify_shipped_system_units(tmp_path: Path) -> None:
    _analyze(
        tmp_path,
        _static("system"),
        user=False,
        names=["clagd@agent1.service", "clagd@agent1.socket"],
    )


# --------------------------------------------------------------------------- the real daemon


class Notifications:
    """NOTIFY_SOCKET's receiving end: what a Type=notify service tells systemd."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.seen: list[str] = []

    def wait_for(self, line: str, proc: subprocess.Popen[bytes], log: Path) -> str:
        deadline = time.monotonic() + 60
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                msg = self.sock.recv(4096).decode()
            except TimeoutError:
                raise AssertionError(
                    f"no {line!r} (got {self.seen}); exit {proc.poll()}; log:\n{log.read_text()}"
                ) from None
            self.seen.append(msg)
            if line in msg.splitlines():
                return msg

    def close(self) -> None:
        self.sock.close()


LAUNCHER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _spawn_daemon(
    store: Path,
    sock: Path,
    notify: Path,
    log: Path,
    extra_env: dict[str, str],
    fd: int | None = None,
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LISTEN_", "WATCHDOG_"))}
    env.update(PYTHONPATH=str(REPO), CLAGD_BACKEND="none", NOTIFY_SOCKET=str(notify), **extra_env)
    argv = ["-m", "clagd", "--socket", str(sock), "run", str(store)]
    if fd is None:
        cmd, pass_fds = [sys.executable, *argv], ()
    else:  # what systemd does between fork and exec for a socket-activated service
        cmd, pass_fds = [sys.executable, "-c", LAUNCHER, str(fd), *argv], (fd,)
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, pass_fds=pass_fds, cwd=store.parent
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="clagd-s-") as d:
        yield Path(d)


def test_daemon_notifies_ready_status_watchdog_and_stopping(
    tmp_path: Path, short_dir: Path
) -> None:
    notes = Notifications(short_dir / "notify.sock")
    log = tmp_path / "daemon.log"
    sock = short_dir / "clagd.sock"
    proc = _spawn_daemon(tmp_path / "store", sock, notes.path, log, {"WATCHDOG_USEC": "200000"})
    try:
        ready = notes.wait_for("READY=1", proc, log)
        assert any(line.startswith("STATUS=serving") for line in ready.splitlines())
        assert sock.exists()  # READY=1 comes after the socket listens
        with Client(sock) as c:
            assert c.ping()["pong"] is True
        # the watchdog pings at half of WATCHDOG_USEC while every thread is alive
        before = time.monotonic()
        notes.wait_for("WATCHDOG=1", proc, log)
        notes.wait_for("WATCHDOG=1", proc, log)
        assert time.monotonic() - before < 5
        assert _stop(proc) == 0
        notes.wait_for("STOPPING=1", proc, log)
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notes.close()


def test_daemon_serves_a_socket_passed_by_socket_activation(
    tmp_path: Path, short_dir: Path
) -> None:
    notes = Notifications(short_dir / "notify.sock")
    log = tmp_path / "daemon.log"
    activated = short_dir / "activated.sock"
    unused = short_dir / "own.sock"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(activated))
    listening.listen(16)
    with Client(activated, timeout=30) as early:
        # a client may connect before the daemon runs: the kernel queues it (that is the point)
        early.connect()
        proc = _spawn_daemon(tmp_path / "store", unused, notes.path, log, {}, fd=listening.fileno())
        listening.close()  # only the daemon holds it now
        try:
            assert early.add("socket activation works")["added"] == 1
            notes.wait_for("READY=1", proc, log)
            assert not unused.exists()  # it did not bind a socket of its own
            res = early.query("socket activation")
            assert [m.content for m in res.memories] == ["socket activation works"]
            assert _stop(proc) == 0
            assert activated.exists()  # the socket belongs to systemd: not removed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            notes.close()
