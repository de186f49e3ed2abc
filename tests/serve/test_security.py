"""Security: no name can make clagd write outside its store, no client of another uid is
served, and nothing in a memory is executed, expanded or interpreted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from competent import pass_gate
from fake_ollama import FakeOllama, _plan
from helpers import InProcessDaemon, git, head_contents, make_store, wait_for

from clagd.errors import InboxRejected
from clagd.ingest.inbox import parse_text


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if ".git" not in p.parts}


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """The store sits two levels down; anything written next to it is an escape."""
    return tmp_path


def _outside(sandbox: Path, store: Path) -> set[Path]:
    return {p for p in sandbox.rglob("*") if not p.is_relative_to(store) and p.is_file()} - {
        p for p in sandbox.rglob("*-daemon.log")
    }


# -- path traversal -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cid",
    ["../../escaped", "c-1234abcd/../../../escaped", "/tmp/escaped-abs", "c-../../x", "c-zz"],
)
def test_hand_edited_cluster_id_cannot_escape(sandbox: Path, short_tmp: Path, cid: str) -> None:
    store = make_store(sandbox / "a" / "memory")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add("a memory before the bad edit")
        doc = {
            "id": cid,
            "name": "evil cluster here",
            "memories": [{"id": "../../m-escape", "content": "x", "created_at": "2025-01-01"}],
        }
        (store / "clusters" / "c-1234abcd.yaml").write_text(yaml.safe_dump(doc))
        with d.client() as c:
            st = wait_for(
                lambda: (s := c.status())["outside_edit_error"] and s, 20, "the edit rejected"
            )
            assert "c-1234abcd" in st["outside_edit_error"]
            c.add("a memory after the bad edit")  # still serving and writing
            assert all(x["id"] != cid for x in c.clusters()["clusters"])
    finally:
        d.stop()
    assert _outside(sandbox, store) == set()
    assert not Path("/tmp/escaped-abs.yaml").exists()


def test_shard_and_memory_ids_from_disk_are_checked(tmp_path: Path) -> None:
    from clagd.errors import StoreError
    from clagd.store.files import ignored_files, load_state

    store = make_store(tmp_path / "memory")
    # a file whose name is not a shard name is never read (and listed as ignored)
    (store / "unsorted" / "u-..%2f..%2fx.yaml").write_text(
        yaml.safe_dump({"memories": [{"id": "m-0000000000000001", "content": "x"}]})
    )
    assert load_state(store).memory_ids() == set()
    assert ignored_files(store) == ["unsorted/u-..%2f..%2fx.yaml"]
    (store / "unsorted" / "u-..%2f..%2fx.yaml").unlink()
    (store / "unsorted" / "u-ok.yaml").write_text(
        yaml.safe_dump({"memories": [{"id": "../../etc/passwd", "content": "x"}]})
    )
    with pytest.raises(StoreError, match="invalid memory id"):
        load_state(store)


def test_slm_plan_cannot_name_paths(sandbox: Path, short_tmp: Path, fake: FakeOllama) -> None:
    """The model proposes ids and names that are paths: ids are aliases enumerated in the
    schema (anything else is rejected), names are only text."""
    store = make_store(
        sandbox / "a" / "memory",
        {"backend": {"kind": "ollama", "ollama": {"host": fake.url, "timeout": 5.0}}},
    )

    def traversal_ids(req: dict) -> dict:
        plan = _plan(req)
        plan["clusters"][0]["id"] = "../../../escaped"
        plan["assign"] = {m: "../../../escaped" for m in plan["assign"]}
        return {"content": plan}

    def traversal_names(req: dict) -> dict:
        return {"content": _plan(req, ("../../../escaped dir", "/etc/cron.d/x y"))}

    fake.script += [traversal_ids, traversal_names]
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client(timeout=60) as c:
            c.add_many([{"content": f"memory {i} about the garden and tea"} for i in range(6)])
            out = c.call("recluster")
            assert out["status"] in ("accepted", "fallback"), out
            assert any("escaped" in r for r in out["reasons"]) or out["status"] == "accepted"
    finally:
        d.stop()
    assert _outside(sandbox, store) == set()
    for f in (store / "clusters").glob("*.yaml"):
        assert f.stem.startswith("c-") and all(ch in "0123456789abcdef" for ch in f.stem[2:])
    assert len(head_contents(store)) == 6


@pytest.mark.parametrize(
    "ref",
    [
        "../../etc/passwd",
        "--help",
        "-n1",
        "HEAD; touch /tmp/clagd-pwned",
        "$(touch /tmp/clagd-pwned)",
        "HEAD:../../x",
        "HEAD~1000",
        "a" * 5000,
    ],
)
def test_revert_ref_is_only_a_ref(daemon: InProcessDaemon, sandbox: Path, ref: str) -> None:
    with daemon.client() as c:
        c.add("a memory to keep")
        head = git(daemon.root, "rev-parse", "HEAD")
        with pytest.raises(Exception) as err:
            c.revert(ref)
        assert getattr(err.value, "code", None) in ("not_found", "bad_request", "conflict")
    assert git(daemon.root, "rev-parse", "HEAD") == head
    assert not Path("/tmp/clagd-pwned").exists()
    assert head_contents(daemon.root) == ["a memory to keep"]


# -- other uids ---------------------------------------------------------------------------


def test_socket_is_private_and_other_uids_are_refused(daemon: InProcessDaemon) -> None:
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o600
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid")
    os.chmod(daemon.socket, 0o666)  # only the peer uid check stands in the way now
    os.chmod(daemon.socket.parent, 0o755)
    code = """
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
try:
    s.sendall(b'{"id": 1, "op": "add", "content": "from nobody"}\\n')
except OSError:
    pass  # refused and closed before the request went out
f = s.makefile("rb")
print(f.readline().decode().strip())
print(repr(f.readline()))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(daemon.socket)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    reply = json.loads(first)
    assert reply["ok"] is False and reply["error"]["code"] == "forbidden"
    assert second in ("b''", "")  # the connection is closed after the refusal
    assert "from nobody" not in head_contents(daemon.root)


# -- nothing is executed or expanded ------------------------------------------------------

LITERALS = [
    "Template {{ 7*7 }} and {% for x in y %}loop{% endfor %}",
    "Shell $(touch /tmp/clagd-pwned) and `touch /tmp/clagd-pwned` and $HOME ${HOME}",
    "Format %(secret)s and {0.__class__} and $memories ${clusters}",
    "Env %PATH% and ~ and ~root and *.yaml",
]


@pytest.mark.parametrize(
    "doc",
    [
        "content: !!python/object/apply:os.system ['touch /tmp/clagd-pwned']\n",
        "!!python/object/new:os.system [touch /tmp/clagd-pwned]\n",
        "content: hello\nmetadata: !!python/name:os.system\n",
        "content: !<tag:yaml.org,2002:python/object/apply:subprocess.call> [[touch, /tmp/x]]\n",
        "content: !custom hi\n",
    ],
)
def test_yaml_tags_are_never_constructed(doc: str) -> None:
    with pytest.raises(InboxRejected):
        parse_text("evil.yaml", doc)
    assert not Path("/tmp/clagd-pwned").exists()


def test_memory_text_stays_literal_everywhere(
    store: Path, short_tmp: Path, fake: FakeOllama
) -> None:
    cfg = yaml.safe_load((store / "clagd.yaml").read_text())
    cfg["backend"] = {"kind": "ollama", "recheck_seconds": 0, "ollama": {"host": fake.url}}
    (store / "clagd.yaml").write_text(yaml.safe_dump(cfg))
    inbox = store / "inbox"
    (inbox / "a.txt").write_text(LITERALS[0])
    (inbox / "b.md").write_text(f"---\nsource: $(id)\n---\n{LITERALS[1]}\n")
    (inbox / "c.json").write_text(json.dumps({"content": LITERALS[2], "metadata": {"t": "{{x}}"}}))
    (inbox / "d.yaml").write_text(yaml.safe_dump({"content": LITERALS[3]}))
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        # the model passed the competence gate, so the session asks it for a plan
        pass_gate(fake, d.daemon.backends.recheck(), d.daemon.config, store)
        gate_calls = len(fake.chats)
        wait_for(lambda: not any(p.is_file() for p in inbox.iterdir()), 20, "ingest")
        assert sorted(head_contents(store)) == sorted(LITERALS)
        with d.client(timeout=60) as c:
            q = c.query("template shell format env", max_memories=10)
            got = {m.content for m in q.memories}
            assert got == set(LITERALS)
            for text in LITERALS:
                assert text in q.context
            md = next(m for m in q.memories if m.content == LITERALS[1])
            assert md.metadata.get("source") == "$(id)"
            c.call("recluster")
        prompt = " ".join(str(m["content"]) for m in fake.chats[gate_calls]["messages"])
        for text in LITERALS:
            assert " ".join(text.split())[:60] in prompt
    finally:
        d.stop()
    assert not Path("/tmp/clagd-pwned").exists()
