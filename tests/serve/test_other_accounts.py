"""No other account can answer for clagd or write through it (issue 25, findings 1 and 2),
tried by a real second OS user: the socket hijack in a private mount namespace (so nothing
of the machine's /tmp or /run is touched), the peer check of the client and the MCP server
against her socket, and her links in a shared inbox."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import InProcessDaemon, make_store, wait_for

from clagd.client import Client, ClientError
from clagd.mcp_server import build_server

EVE = "clagd-eve"
SCENARIO = Path(__file__).with_name("hijack_scenario.py")


@pytest.fixture(scope="session")
def eve() -> Iterator[pwd.struct_passwd]:
    """A second OS user (created, and removed after, when missing)."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second user")
    try:
        yield pwd.getpwnam(EVE)
        return
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed: no second user to attack with")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", EVE],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd {EVE} failed: {made.stderr.strip()}")
    try:
        yield pwd.getpwnam(EVE)
    finally:
        subprocess.run(["userdel", EVE], capture_output=True)


HIDDEN = (Path("/tmp"), Path("/run"))  # the namespace mounts an empty tmpfs on each


def _namespace_command() -> list[str]:
    """A private mount namespace with an empty /tmp and a /run holding only root's runtime
    directory; skip where the machine does not allow one."""
    setup = (
        "mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=0755 tmpfs /run "
        '&& mkdir -m 0755 /run/user && mkdir -m 0700 /run/user/0 && exec "$@"'
    )
    probe = ["unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh", "true"]
    for what, path in (("the interpreter", Path(sys.executable)), ("the scenario", SCENARIO)):
        if any(path.is_relative_to(d) or path.resolve().is_relative_to(d) for d in HIDDEN):
            pytest.skip(f"{what} is under {path.parts[1]}/, which the namespace empties: {path}")
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed: no private mount namespace")
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    return probe[:-1]


def test_another_user_cannot_answer_for_the_daemon(eve: pwd.struct_passwd) -> None:
    cmd = [*_namespace_command(), sys.executable, str(SCENARIO), eve.pw_name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # the real daemon's socket is in root's runtime directory, not where eve waits
    assert out["socket"].startswith("/run/user/0/clagd/")
    # before the daemon runs, the client says so (exit 69), with and without XDG_RUNTIME_DIR
    assert out["before"]["rc"] == 69 and "not running" in out["before"]["err"]
    assert out["before_xdg"]["rc"] == 69
    assert out["daemon_exit"] is None, out["daemon_stderr"]  # it started despite her traps
    assert out["add"]["rc"] == 0 and "m-fakefake" not in out["add"]["out"]
    assert out["query_xdg"]["rc"] == 0 and "PIN is 4711" in out["query_xdg"]["out"]
    assert "SYSTEM" not in out["query_xdg"]["out"]
    # pointed at her socket, the client refuses before sending, naming who answered
    assert out["explicit"]["rc"] == 1 and EVE in out["explicit"]["err"]
    assert "refusing" in out["explicit"]["err"]
    # a configured socket in her directory: the daemon refuses to start, naming it
    assert out["configured"]["rc"] != 0 and "/tmp/eve-shared" in out["configured"]["err"]
    assert EVE in out["configured"]["err"]
    # her one connection was the refused one, and not one byte reached her
    assert out["eve_got"] == [{"path": "/tmp/eve-shared/clagd.sock", "got": ""}]


# started as root, each drops to her uid before anything (she may not read the interpreter)
AS_HER = "import json, os, socket, sys; os.setgroups([]); os.setgid({gid}); os.setuid({uid})\n"

SERVE_AS_EVE = r"""
srv = socket.socket(socket.AF_UNIX); srv.bind(sys.argv[1]); srv.listen(4)
print("listening", flush=True)
while True:
    conn, _ = srv.accept()
    line = conn.makefile("rb").readline()
    if line:  # a client that connected and left at once sent nothing
        print(line.decode().strip(), flush=True)
        conn.sendall(b'{"id": 1, "ok": true, "result": {"pong": true}}\n')
    conn.close()
"""


def test_client_and_mcp_refuse_a_peer_of_another_uid(
    eve: pwd.struct_passwd, short_tmp: Path
) -> None:
    short_tmp.chmod(0o777)  # only for this test: her socket sits beside ours
    path = short_tmp / "eve.sock"
    code = AS_HER.format(uid=eve.pw_uid, gid=eve.pw_gid) + SERVE_AS_EVE
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        with pytest.raises(ClientError, match=f"answered by uid {eve.pw_uid} \\({EVE}\\)") as err:
            Client(path, timeout=5).ping()
        assert err.value.code == "untrusted_peer"
        server = build_server(path, timeout=5)
        with pytest.raises(ClientError, match="refusing to talk"):
            server.clagd_client.status()
        with socket.socket(socket.AF_UNIX) as probe:  # she is really there, and answers
            probe.connect(str(path))
            probe.sendall(b'{"id": 1, "op": "ping"}\n')
            assert b'"pong"' in probe.recv(4096)
    finally:
        proc.kill()
        received = proc.communicate(timeout=10)[0].splitlines()
    assert received == ['{"id": 1, "op": "ping"}']  # only the probe's line ever reached her


ATTACK_INBOX = r"""
inbox, target = sys.argv[1], sys.argv[2]
os.rename(f"{inbox}/rejected", f"{inbox}/rejected-old")  # the daemon's folder, moved away
os.mkdir(f"{inbox}/rejected", 0o777)
os.symlink(target, f"{inbox}/rejected/evil.json.error")
doc = {"content": "a memory", "created_at": "/bin/touch " + target + "\n/bin/touch " + target}
with open(f"{inbox}/.evil.json", "w") as f:
    json.dump(doc, f)
os.rename(f"{inbox}/.evil.json", f"{inbox}/evil.json")
"""


def test_shared_inbox_links_are_never_followed(
    eve: pwd.struct_passwd, tmp_path: Path, short_tmp: Path
) -> None:
    store = make_store(short_tmp / "memory")
    for folder in (short_tmp, store):
        os.chmod(folder, 0o711)  # she may reach the drop folder, and nothing else
    inbox = store / "inbox"
    os.chown(inbox, -1, eve.pw_gid)
    os.chmod(inbox, 0o2770)  # a group-writable drop folder, her group's
    target = tmp_path / "profile.d" / "clagd-pwned.sh"
    target.parent.mkdir()
    d = InProcessDaemon(store, short_tmp / "s.sock")
    code = AS_HER.format(uid=eve.pw_uid, gid=eve.pw_gid) + ATTACK_INBOX
    try:
        attack = subprocess.run(
            [sys.executable, "-I", "-c", code, str(inbox), str(target)],
            capture_output=True,
            text=True,
        )
        assert attack.returncode == 0, attack.stderr
        wait_for(lambda: not (inbox / "evil.json").exists(), 20, "the bad file rejected")

        def reported() -> str:  # the watcher notes why once the file is moved
            with d.client() as c:
                return c.status()["inbox"]["rejected_refused"]

        refused = wait_for(reported, 20, "the refusal in status")
    finally:
        d.stop()
    assert not target.exists() and not os.path.lexists(target)  # nothing written through it
    assert sorted(p.name for p in (inbox / "rejected").iterdir()) == ["evil.json.error"]
    assert (inbox / "rejected" / "evil.json.error").is_symlink()  # hers, untouched
    assert f"{inbox / 'rejected'} is owned by uid {eve.pw_uid} ({EVE})" in refused
    kept = store / ".clagd" / "rejected"
    assert (kept / "evil.json").is_file()  # the file is kept, where only the daemon writes
    error = kept / "evil.json.error"
    st = error.lstat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o600
    text = error.read_text()
    assert "is not an ISO 8601 time" in text and f"/bin/touch {target}" in text  # readable
    assert all(line.startswith("# ") for line in text.splitlines()), text
    ran = subprocess.run(["sh", str(error)], capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 0 and not target.exists()  # a shell made to read it runs nothing
