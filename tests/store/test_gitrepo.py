"""A failed git command leaves the store as clagd's own error (`errors.GitFailed`, a
StoreError): git's reason in one line, never its argv, up to the socket and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git

from clagd.client import ClientError
from clagd.errors import GitFailed, StoreError
from clagd.store.gitrepo import GitStore


def test_a_failed_git_command_raises_a_store_error_with_git_s_reason(store: Path) -> None:
    gs = GitStore(store)
    with pytest.raises(GitFailed) as err:
        gs.run("log", "-n1", "no-such-revision")
    assert isinstance(err.value, StoreError) and err.value.code == "store"
    message = str(err.value)
    assert message.startswith("git log: ") and "no-such-revision" in message
    assert "\n" not in message and "user.email" not in message  # git's reason, not its argv
    assert "unknown revision" in err.value.stderr and err.value.status == 128


def test_a_broken_repository_reaches_the_socket_and_the_cli_as_one_clear_line(
    daemon: InProcessDaemon,
) -> None:
    """The commit HEAD names is unreadable (a disk error took its object): `log` answers
    the domain error `store` with git's reason, over the socket and from the CLI, and the
    daemon goes on once the object is back."""
    root = daemon.root
    head = git(root, "rev-parse", "HEAD").strip()
    obj = root / ".git" / "objects" / head[:2] / head[2:]
    assert obj.is_file(), "the daemon's commits are loose objects (gc.auto = 0)"
    data = obj.read_bytes()
    obj.unlink()
    try:
        with daemon.client() as c:
            with pytest.raises(ClientError) as err:
                c.log(5)
        assert err.value.code == "store"
        assert str(err.value) == "git log: fatal: bad object HEAD"
        env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        r = subprocess.run(
            [sys.executable, "-m", "clagd", "--socket", str(daemon.socket), "log"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert lines == ["clagd: git log: fatal: bad object HEAD"], r.stderr
    finally:
        obj.write_bytes(data)
    with daemon.client() as c:
        assert c.log(5)["entries"][0]["commit"] == head
