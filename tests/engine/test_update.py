"""Facts that change: `update` and the supersede found at ingest, against a real daemon on a
real socket over a real git store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from clagd.client import Client, ClientError
from clagd.engine.core import Engine
from clagd.store.files import load_state
from tests.helpers import InProcessDaemon, assert_same_as_files, git, make_store, wait_for

PHONE_OLD = "Alice's phone number is 0151 111"
PHONE_NEW = "Alice's phone number is 0151 222"


def _stored(root: Path) -> dict[str, dict]:
    """Every memory of the store's files (clusters, archive, unsorted) by id, as written."""
    out: dict[str, dict] = {}
    for d in ("clusters", "archive", "unsorted"):
        for f in sorted((root / d).glob("*.yaml")):
            for m in yaml.safe_load(f.read_text()).get("memories", []):
                out[m["id"]] = m
    return out


def _ids(c: Client, text: str, superseded: bool = False) -> list[str]:
    return [m.id for m in c.query(text, max_memories=10, superseded=superseded).memories]


@pytest.mark.parametrize("clustered", [False, True])
def test_update_supersedes_the_old_memory_linked_both_ways(
    daemon: InProcessDaemon, clustered: bool
) -> None:
    with daemon.client() as c:
        old = c.add("The user's dentist is Dr. Weber in Hamburg", {"source": "chat"})["ids"][0]
        c.add("The user likes hiking in the Alps on weekends")
        if clustered:
            c.recluster()
        res = c.update(old, "The user's dentist is Dr. Novak in Hamburg")
        assert res.supersedes == old and res.id != old and res.commit
        hidden = _ids(c, "dentist Hamburg")
        assert hidden[0] == res.id and old not in hidden
        shown = _ids(c, "dentist Hamburg", superseded=True)
        assert shown[:2] == [res.id, old]  # asked for: the old one too, below the new
    files = _stored(daemon.root)
    assert files[old]["metadata"]["superseded_by"] == res.id
    assert files[res.id]["metadata"] == {"source": "chat", "supersedes": old}
    assert files[old]["content"] == "The user's dentist is Dr. Weber in Hamburg"
    log = git(daemon.root, "log", "-1", "--format=%B")
    assert f"update: {res.id} supersedes {old}" in log and "Clagd-Kind: update" in log
    assert_same_as_files(daemon.engine)


def test_a_restart_keeps_the_old_memory_out(store: Path, short_tmp: Path) -> None:
    d = InProcessDaemon(store, short_tmp / "a.sock")
    try:
        with d.client() as c:
            old = c.add(PHONE_OLD)["ids"][0]
            new = c.update(old, "Alice's phone number is 0160 999").id
    finally:
        d.stop()
    eng = Engine(store)  # the index built again from the files
    try:
        assert [m.id for m in eng.query("Alice phone number").memories] == [new]
        assert eng.state.memory(old) is not None  # still in the store
    finally:
        eng.close()


def test_update_errors_name_what_was_given(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        old = c.add(PHONE_OLD)["ids"][0]
        with pytest.raises(ClientError) as e:
            c.update("m-0000000000000000", "x y z")
        assert e.value.code == "not_found" and "m-0000000000000000" in e.value.message
        with pytest.raises(ClientError) as e:
            c.update("Alice", "x y z")
        assert e.value.code == "bad_request" and "'Alice'" in e.value.message
        with pytest.raises(ClientError) as e:
            c.update(old, PHONE_OLD)
        assert e.value.code == "bad_request"
        new = c.update(old, "Alice's phone number is 0170 333").id
        with pytest.raises(ClientError) as e:
            c.update(old, "Alice's phone number is 0170 444")
        assert e.value.code == "conflict" and new in e.value.message
        with pytest.raises(ClientError) as e:
            c.update(new, "")
        assert e.value.code == "invalid_memory"
    assert len(_stored(daemon.root)) == 2  # nothing half-done


@pytest.fixture
def auto(tmp_path: Path, short_tmp: Path) -> Iterator[InProcessDaemon]:
    """A daemon whose store has `ingest.auto_supersede` on."""
    root = make_store(tmp_path / "auto", {"ingest": {"auto_supersede": True}})
    d = InProcessDaemon(root, short_tmp / "u.sock")
    yield d
    d.stop()


def test_ingest_supersedes_a_changed_value(auto: InProcessDaemon) -> None:
    with auto.client() as c:
        old = c.add(PHONE_OLD)["ids"][0]
        bob = c.add("Bob's phone number is 0151 333")["ids"][0]
        res = c.add(PHONE_NEW)
        new = res["ids"][0]
        assert res["supersedes"] == {new: old}
        hidden = _ids(c, "Alice phone number")
        assert hidden[0] == new and bob in hidden and old not in hidden
        assert old in _ids(c, "Alice phone number", superseded=True)
        # a batch: the later of two statements of one fact supersedes the earlier
        got = c.add_many(
            [
                {"content": "The team meeting is on Monday at 10am"},
                {"content": "The team meeting is on Tuesday at 11am"},
            ]
        )
        first, second = got["ids"]
        assert got["supersedes"] == {second: first}
    files = _stored(auto.root)
    assert files[old]["metadata"]["superseded_by"] == new
    assert files[first]["metadata"]["superseded_by"] == second
    assert "superseded_by" not in files[bob].get("metadata", {})
    assert_same_as_files(auto.engine)


def test_auto_supersede_off_keeps_both(tmp_path: Path, short_tmp: Path) -> None:
    root = make_store(tmp_path / "off", {"ingest": {"auto_supersede": False}})
    d = InProcessDaemon(root, short_tmp / "o.sock")
    try:
        with d.client() as c:
            old = c.add(PHONE_OLD)["ids"][0]
            res = c.add(PHONE_NEW)
            assert res["supersedes"] == {}
            assert set(_ids(c, "Alice phone number")) == {old, res["ids"][0]}
    finally:
        d.stop()


def test_an_inbox_file_cannot_set_the_link(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        with pytest.raises(ClientError) as e:
            c.add("Alice lives in Porto", {"superseded_by": "m-0000000000000000"})
        assert e.value.code == "invalid_memory" and "superseded_by" in e.value.message
    inbox = daemon.root / "inbox"
    (inbox / "x.json").write_text(json.dumps({"content": "Alice lives in Faro", "supersedes": 1}))
    reason = inbox / "rejected" / "x.json.error"
    wait_for(reason.exists, 20, "the file to be rejected")
    assert "supersedes" in reason.read_text()
    assert load_state(daemon.root).memory_ids() == set()


def test_the_cli_updates_and_shows_superseded(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        old = c.add("The office is in Leeds")["ids"][0]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    base = [sys.executable, "-m", "clagd", "--socket", str(daemon.socket)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=60)

    out = run("update", old, "The office is in York", "--json")
    assert out.returncode == 0, out.stderr
    new = json.loads(out.stdout)["id"]
    assert json.loads(out.stdout)["supersedes"] == old
    hidden = run("query", "office", "--json")
    assert [m["id"] for m in json.loads(hidden.stdout)["memories"]] == [new]
    shown = run("query", "office", "--superseded", "--json")
    assert [m["id"] for m in json.loads(shown.stdout)["memories"]] == [new, old]
    bad = run("update", "m-0000000000000000", "The office is in Hull")
    assert bad.returncode != 0 and "m-0000000000000000" in bad.stderr


def test_update_stays_in_its_scope(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        old = c.add("Alice's phone number is 0151 111", scope="alice")["ids"][0]
        for other in (None, "bob"):
            with pytest.raises(ClientError) as e:
                c.update(old, "Alice's phone number is 0151 999", scope=other)
            assert e.value.code == "not_found"
        new = c.update(old, "Alice's phone number is 0151 222", scope="alice").id
        got = c.query("Alice phone number", scope="alice", max_memories=10)
        assert [m.id for m in got.memories] == [new]
        assert not c.query("Alice phone number", scope="bob").memories
    files = _stored(daemon.root)
    assert files[new].get("scope") == "alice" and files[old].get("scope") == "alice"


def test_forgetting_the_newer_memory_makes_the_older_current_again(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        old = c.add("The user's locker code is 1357")["ids"][0]
        new = c.update(old, "The user's locker code is 2468").id
        assert old not in _ids(c, "locker code")
        c.forget([new])
        assert _ids(c, "locker code") == [old]
    files = _stored(daemon.root)
    assert new not in files and "superseded_by" not in files[old].get("metadata", {})
    assert_same_as_files(daemon.engine)


@pytest.mark.parametrize("how", ["update", "update, clustered", "ingest"])
def test_reverting_an_update_makes_the_old_memory_current_again(
    daemon: InProcessDaemon, how: str
) -> None:
    """An update (by `update`, or found at ingest) is a commit like any other: its revert
    takes the new memory out and the old one is current again (no superseded_by left), in
    queries and in its file."""
    with daemon.client() as c:
        old = c.add(PHONE_OLD)["ids"][0]
        c.add("The user likes hiking in the Alps on weekends")
        clustered = how == "update, clustered"
        if clustered:
            c.recluster()
        if how == "ingest":
            added = c.add(PHONE_NEW)
            assert added["supersedes"] == {added["ids"][0]: old}
            res = SimpleNamespace(id=added["ids"][0], commit=added["commit"])
        else:
            res = c.update(old, PHONE_NEW)
        if clustered:
            c.recluster()  # the new memory filed since
        undone = c.revert(res.commit)
        assert undone["commits"], undone
        assert _ids(c, "Alice phone number")[:1] == [old]
        assert res.id not in _ids(c, "Alice phone number", superseded=True)
        assert c.get(old).metadata.get("superseded_by") is None
        with pytest.raises(ClientError) as again:
            c.revert(res.commit)
        assert again.value.code == "already_reverted"
    files = _stored(daemon.root)
    assert res.id not in files and "superseded_by" not in files[old].get("metadata", {})
    assert_same_as_files(daemon.engine)


def test_auto_supersede_never_crosses_scopes(auto: InProcessDaemon) -> None:
    """A restatement in another scope supersedes nothing of this one: Bob storing "Alice's
    phone number is 0151 222" in his scope leaves Alice's own memory current in hers (an
    adversary cannot hide another user's fact by restating it)."""
    with auto.client() as c:
        alice = c.add(PHONE_OLD, scope="alice")["ids"][0]
        res = c.add(PHONE_NEW, scope="bob")
        assert res["supersedes"] == {}
        assert _ids_in(c, "alice") == [alice]
        again = c.add(PHONE_NEW, scope="alice")  # in her own scope it does
        assert again["supersedes"] == {again["ids"][0]: alice}
        assert _ids_in(c, "bob") == res["ids"]
    files = _stored(auto.root)
    assert "superseded_by" not in files[res["ids"][0]].get("metadata", {})


def _ids_in(c: Client, scope: str) -> list[str]:
    return [m.id for m in c.query("Alice phone number", max_memories=10, scope=scope).memories]
