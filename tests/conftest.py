from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_ollama import FakeOllama
from helpers import REPO, DaemonProcess, InProcessDaemon, make_store


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if "qwen" not in request.keywords:  # the user-wide caches (gate verdicts, answers)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    for var in (
        "CLAGD_BACKEND",
        "CLAGD_STORE",
        "CLAGD_SOCKET",
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "WATCHDOG_USEC",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short folder for sockets (AF_UNIX paths are limited to ~107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="clagd-t-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "memory")


@pytest.fixture
def daemon(store: Path, short_tmp: Path) -> Iterator[InProcessDaemon]:
    d = InProcessDaemon(store, short_tmp / "s.sock")
    yield d
    d.stop()


@pytest.fixture
def daemon_proc(store: Path, short_tmp: Path) -> Iterator[DaemonProcess]:
    p = DaemonProcess(store, short_tmp / "s.sock")
    yield p
    if p.proc is not None and p.proc.poll() is None:
        p.kill()


@pytest.fixture
def fake() -> Iterator[FakeOllama]:
    """A loopback server speaking Ollama's API, answering from `fake.script`."""
    with FakeOllama() as srv:
        yield srv


@pytest.fixture
def shell_env(daemon_proc: DaemonProcess, tmp_path: Path) -> Iterator[dict[str, str]]:
    daemon_proc.start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "clagd"  # what `pip install` puts on PATH, for this checkout
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m clagd "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    env.update(
        PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(REPO),
        CLAGD_STORE=str(daemon_proc.root),
        CLAGD_SOCKET=str(daemon_proc.socket),
    )
    yield env
