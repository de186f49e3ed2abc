"""Scopes: every memory belongs to one (`clagd.scopes`); a query sees only its own and the
ones it names. Real stores, real daemons on real sockets, real inbox files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import InProcessDaemon, git, wait_for

from clagd.client import ClientError
from clagd.errors import BadScope, StoreError
from clagd.model import Cluster, Memory, memory_id
from clagd.scopes import DEFAULT_SCOPE, check_scope, visible_scopes
from clagd.store.files import load_state


@pytest.mark.parametrize("name", ["alice", "bob-2", "a", "team_x", "0", "a" * 63])
def test_a_good_scope_name_is_itself(name: str) -> None:
    assert check_scope(name) == name


@pytest.mark.parametrize(
    "name", ["", "Alice", "-x", "_x", "a b", "a/b", "../x", "a" * 64, "é", None, 3, "x\n"]
)
def test_a_bad_scope_name_is_refused_naming_it(name: object) -> None:
    with pytest.raises(BadScope) as got:
        check_scope(name)
    assert got.value.code == "bad_scope"
    assert repr(name)[:40] in str(got.value)


def test_visible_scopes_default_and_extra() -> None:
    assert visible_scopes() == {DEFAULT_SCOPE}
    assert visible_scopes("alice", ["team", "alice"]) == {"alice", "team"}


def test_ids_differ_per_scope_and_the_default_id_is_the_old_one() -> None:
    text = "Alice is allergic to peanuts"
    assert memory_id(text) == memory_id(text, DEFAULT_SCOPE)
    ids = {memory_id(text, s) for s in (DEFAULT_SCOPE, "alice", "bob")}
    assert len(ids) == 3
    assert Memory.new(text, scope="alice").id == memory_id(text, "alice")


def test_yaml_leaves_out_the_default_scope_and_keeps_any_other() -> None:
    m = Memory.new("tea at noon", "2026-01-01T00:00:00Z")
    assert "scope" not in m.to_dict()
    a = Memory.new("tea at noon", "2026-01-01T00:00:00Z", scope="alice")
    assert a.to_dict()["scope"] == "alice"
    c = Cluster("c-0000aaaa", "Tea Times", memories=[a], scope="alice")
    back = Cluster.from_dict(yaml.safe_load(yaml.safe_dump(c.to_dict())))
    assert back.scope == "alice" and back.memories[0].scope == "alice"
    assert "scope" not in Cluster("c-0000aaab", "Tea Times").to_dict()
    # a memory written into a scoped cluster without a scope of its own takes the cluster's
    d = c.to_dict()
    del d["memories"][0]["scope"]
    assert Cluster.from_dict(d).memories[0].scope == "alice"


def test_a_cluster_file_mixing_scopes_is_refused_by_the_loader(store: Path) -> None:
    a = Memory.new("Alice likes tea", scope="alice")
    b = Memory.new("Bob likes coffee", scope="bob")
    c = Cluster("c-0000abcd", "Hot Drinks", memories=[a, b], scope="alice")
    (store / "clusters" / "c-0000abcd.yaml").write_text(yaml.safe_dump(c.to_dict()))
    with pytest.raises(StoreError, match="holds memories of scope 'bob'"):
        load_state(store)


def test_add_and_query_stay_inside_their_scope(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.add("Alice is allergic to peanuts", scope="alice")
        c.add("Bob is allergic to peanuts and shellfish", scope="bob")
        c.add("The office is allergic to noise", metadata={"user_id": "alice"})
        alice = c.query("allergic peanuts", scope="alice")
        assert [h.content for h in alice.memories] == ["Alice is allergic to peanuts"]
        assert alice.memories[0].scope == "alice"
        bob = c.query("allergic peanuts", scope="bob")
        assert [h.content for h in bob.memories] == ["Bob is allergic to peanuts and shellfish"]
        plain = c.query("allergic peanuts")
        assert [h.content for h in plain.memories] == ["The office is allergic to noise"]
        both = c.query("allergic peanuts", scope="alice", scopes=["bob"])
        assert {h.scope for h in both.memories} == {"alice", "bob"}
        with pytest.raises(BadScope, match="Alice!"):
            c.query("peanuts", scope="Alice!")  # refused by the client before it is sent
        for params in ({"scope": "Alice!"}, {"scopes": ["bob", "../x"]}):
            with pytest.raises(ClientError) as got:  # and by the daemon
                c.request("query", {"text": "peanuts", **params})
            assert got.value.code == "bad_scope"
            assert str(params.get("scope") or "../x") in str(got.value)


def test_same_text_in_two_scopes_is_two_memories_and_dedupe_is_per_scope(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        first = c.add("I live in Berlin", scope="alice")
        again = c.add("I live in Berlin", scope="alice")
        other = c.add("I live in Berlin", scope="bob")
    assert first["added"] == 1 and again["duplicates"] == 1 and other["added"] == 1
    assert first["ids"] != other["ids"]
    files = load_state(daemon.root)
    assert sorted(m.scope for m, _a, _k in files.all_memories()) == ["alice", "bob"]


def test_an_item_naming_another_scope_than_its_request_is_refused(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        with pytest.raises(ClientError) as got:
            c.add_many([{"content": "sneaky", "scope": "bob"}], scope="alice")
        assert got.value.code == "bad_scope"
        assert "'bob'" in str(got.value) and "'alice'" in str(got.value)
        assert c.query("sneaky", scope="bob").memories == []


def test_an_existing_store_reads_unchanged(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.add("Plain memories keep their old files")
    tracked = git(daemon.root, "ls-files", "unsorted", "clusters").split()
    text = "".join((daemon.root / f).read_text() for f in tracked if f.endswith(".yaml"))
    assert "scope" not in text
    assert "Plain memories keep their old files" in text


def test_inbox_scope_key_and_subfolder(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    (inbox / "a.yaml").write_text("content: Alice drinks oolong\nscope: alice\n")
    (inbox / "bob").mkdir()
    (inbox / "bob" / "b.md").write_text("Bob drinks espresso\n")
    (inbox / "bob" / "e.json").write_text('{"content": "Eve drinks gin", "scope": "eve"}')
    (inbox / "c.md").write_text("---\nscope: carol\n---\nCarol drinks matcha\n")
    (inbox / "d.json").write_text('{"content": "Dan drinks chai", "scope": "Not Valid"}')

    def stored() -> dict[str, str]:
        return {m.content: m.scope for m, _a, _k in load_state(daemon.root).all_memories()}

    wait_for(lambda: len(stored()) == 3, 20, "three inbox files to be stored")
    assert stored() == {
        "Alice drinks oolong": "alice",
        "Bob drinks espresso": "bob",
        "Carol drinks matcha": "carol",
    }
    rejected = inbox / "rejected"
    wait_for(lambda: (rejected / "d.json.error").exists(), 20, "the bad scope's rejection")
    assert "Not Valid" in (rejected / "d.json.error").read_text()
    # a file in inbox/bob/ naming another scope is rejected, kept whole, with both names
    wait_for(lambda: (rejected / "bob_e.json.error").exists(), 20, "the mismatch's rejection")
    why = (rejected / "bob_e.json.error").read_text()
    assert "'eve'" in why and "'bob'" in why
    assert "Eve drinks gin" in (rejected / "bob_e.json").read_text()
    with daemon.client() as c:

        def bobs() -> list[str]:
            return [h.content for h in c.query("drinks", scope="bob").memories]

        wait_for(lambda: bobs() != [], 20, "the inbox batch to be served")
        assert bobs() == ["Bob drinks espresso"]


def test_a_session_and_routing_never_mix_scopes(daemon: InProcessDaemon) -> None:
    facts = [
        "loves hiking in the alps every summer",
        "hiking boots size 42 for the alps",
        "alps hiking trail near the lake",
        "summer hiking plans for the alps trip",
    ]
    with daemon.client() as c:
        for who in ("alice", "bob"):
            c.add_many([{"content": f"{who} {f}"} for f in facts], scope=who)
        c.recluster()
        state = load_state(daemon.root)
        assert state.clusters, "the session made clusters"
        for cl in state.clusters.values():
            assert {m.scope for m in cl.memories} == {cl.scope}
        # a new memory routes only into a cluster of its own scope
        c.add("alice more alps hiking in summer with boots", scope="alice")
        c.add("bob more alps hiking in summer with boots", scope="bob")
        state = load_state(daemon.root)
        for cl in state.clusters.values():
            assert {m.scope for m in cl.memories} == {cl.scope}
        for who, other in (("alice", "bob"), ("bob", "alice")):
            got = c.query("alps hiking summer boots", scope=who, max_memories=20)
            assert got.memories and all(h.scope == who for h in got.memories)
            assert not any(h.content.startswith(other) for h in got.memories)
            named = {cl.id for cl in state.clusters.values() if cl.scope == who}
            assert {cs.id for cs in got.clusters} <= named


def test_get_list_clusters_log_status_and_export_per_scope(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    from clagd.store.export import export_markdown

    with daemon.client() as c:
        a = c.add("Alice keeps her passport in the desk", scope="alice")["ids"][0]
        b = c.add("Bob keeps his passport in the car", scope="bob")["ids"][0]
        assert c.get(a, scope="alice").content.startswith("Alice")
        for wrong in (None, "bob"):  # another scope's id is not found, with the same words
            with pytest.raises(ClientError) as got:
                c.get(a, scope=wrong)
            assert got.value.code == "not_found"
        with pytest.raises(ClientError) as missing:
            c.get("m-00000000000000ff", scope="bob")
        assert str(missing.value).replace("m-00000000000000ff", a) == str(got.value)
        listed = c.list_memories(scope="bob")
        assert [m.id for m in listed.memories] == [b] and listed.total == 1
        assert listed.memories[0].scope == "bob"
        assert c.list_memories().total == 0
        assert c.clusters(scope="alice")["unsorted"] == 1
        assert c.clusters()["unsorted"] == 2  # the owner's view: every scope
        logged = c.log(5, scope="bob")["entries"]
        assert [e["trailers"].get("scopes") for e in logged] == ["bob"]
        assert all(e["trailers"].get("scopes") != "bob" for e in c.log(5, scope="alice")["entries"])
        per = c.status()["counts"]["scopes"]
        assert per["alice"]["memories"] == 1 and per["bob"]["unsorted"] == 1
        assert c.status().counts.scopes == per  # the typed reply has them too
        assert {x.scope for x in c.clusters().clusters} <= {"alice", "bob"}
    files = export_markdown(daemon.root, tmp_path / "out", scope="alice")
    text = "".join(p.read_text() for p in files)
    assert "Alice keeps" in text and "Bob keeps" not in text


def test_cli_scope_option_and_env(daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from clagd.cli import main

    base = ["--socket", str(daemon.socket)]
    run = CliRunner().invoke
    out = run(main, [*base, "add", "--scope", "alice", "Alice rides a red bike"])
    assert out.exit_code == 0, out.output
    monkeypatch.setenv("CLAGD_SCOPE", "bob")
    assert run(main, [*base, "add", "Bob rides a blue bike"]).exit_code == 0
    bob = run(main, [*base, "query", "--json", "bike"])
    assert [m["content"] for m in json.loads(bob.output)["memories"]] == ["Bob rides a blue bike"]
    alice = run(main, [*base, "query", "--scope", "alice", "--json", "bike"])
    assert [m["scope"] for m in json.loads(alice.output)["memories"]] == ["alice"]
    listed = run(main, [*base, "--scope", "alice", "list", "--json"])
    assert json.loads(listed.output)["total"] == 1
    monkeypatch.delenv("CLAGD_SCOPE")  # `status` of the whole store (with one: its own)
    status = run(main, [*base, "status"])
    assert "scopes     alice 1 (1 unsorted), bob 1 (1 unsorted)" in status.output
    bad = run(main, [*base, "query", "--scope", "Bad Name", "bike"])
    assert bad.exit_code == 2 and "Bad Name" in bad.output
    monkeypatch.setenv("CLAGD_SCOPE", "../etc")
    env_bad = run(main, [*base, "query", "bike"])
    assert env_bad.exit_code == 2 and "../etc" in env_bad.output


def test_cli_update_and_revert_keep_to_their_scope(daemon: InProcessDaemon) -> None:
    from click.testing import CliRunner

    from clagd.cli import main

    base = ["--socket", str(daemon.socket)]
    run = CliRunner().invoke
    added = json.loads(
        run(main, [*base, "add", "--scope", "alice", "--json", "Alice: 0151 111"]).output
    )
    mid, commit = added["ids"][0], added["commit"]
    other = run(main, [*base, "update", "--scope", "bob", mid, "Alice: 0151 222"])
    assert other.exit_code == 1 and mid in other.output  # bob cannot see alice's memory
    refused = run(main, [*base, "revert", "--scope", "bob", commit])
    assert refused.exit_code == 1 and "outside scope 'bob'" in refused.output
    own = run(main, [*base, "update", "--scope", "alice", "--json", mid, "Alice: 0151 222"])
    assert own.exit_code == 0, own.output
    assert json.loads(own.output)["supersedes"] == mid


def test_archive_per_scope_and_an_archived_cluster_stays_in_its_scope(
    tmp_path: Path, short_tmp: Path
) -> None:
    """`archive --scope`: only that scope's cold clusters move (one commit naming it); an
    archived cluster is searched (`include_archive`) and thawed for its own scope only."""
    from helpers import make_store

    root = make_store(tmp_path / "m", {"archive": {"cold_after_days": 0, "thaw_on_hit": True}})
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        facts = [
            "tomatoes in the garden need water every morning",
            "planted basil next to the garden tomatoes",
            "the garden hose leaks near the tomatoes",
        ]
        with d.client() as c:
            for who in ("alice", "bob"):
                c.add_many([{"content": f"{who}: {f}"} for f in facts], scope=who)
            c.recluster()
            mine = {w: {x.id for x in c.clusters(scope=w).clusters} for w in ("alice", "bob")}
            assert mine["alice"] and mine["bob"]
            dry = c.archive(dry_run=True, scope="alice")
            assert set(dry["clusters"]) == mine["alice"]
            res = c.archive(scope="alice")
            assert set(res["clusters"]) == mine["alice"]
            assert "Clagd-Scopes: alice" in git(root, "log", "-1", "--format=%B")
            assert {x.id for x in c.clusters(scope="bob").clusters} == mine["bob"]  # still hot
            assert all(not x.archived for x in c.clusters(scope="bob").clusters)
            # bob, searching the archive too, sees none of alice's archived memories
            got = c.query("garden tomatoes water", include_archive=True, scope="bob")
            assert got.memories and {h.scope for h in got.memories} == {"bob"}
            assert not got.thawing and not any(h.archived for h in got.memories)
            cold = c.query("garden tomatoes water", include_archive=True, scope="alice")
            assert cold.memories and {h.scope for h in cold.memories} == {"alice"}
            assert all(h.archived for h in cold.memories)
            assert cold.thawing and set(cold.thawing) <= mine["alice"]
    finally:
        d.stop()


def test_a_bad_scope_is_refused_on_every_op(daemon: InProcessDaemon) -> None:
    """Also on the store-wide ops that do not read a scope (status, recluster, round,
    ping): a typo'd or hostile name is an error there too, never silently ignored."""
    with daemon.client() as c:
        head = git(daemon.root, "rev-parse", "HEAD")
        ops = sorted(daemon.daemon.server.dispatcher.ops)
        assert {"status", "recluster", "round", "query", "forget", "add"} <= set(ops)
        for op in ops:
            for bad in ({"scope": "../alice"}, {"scopes": ["Bob"]}, {"scopes": "bob"}):
                with pytest.raises(ClientError) as refused:
                    c.request(op, {"text": "x", "content": "x", "ref": "HEAD", **bad})
                code = "bad_request" if bad == {"scopes": "bob"} else "bad_scope"
                assert refused.value.code == code, (op, bad, refused.value)
        assert c.status()["counts"]["memories"] == 0
        assert git(daemon.root, "rev-parse", "HEAD") == head


def test_cli_also_scope_names_the_scopes_seen_besides(daemon: InProcessDaemon) -> None:
    """A query sees its scope plus the scopes it names: `--also-scope` on query, get and
    list (the socket's `scopes`); a scope not named stays unseen, a bad name is refused."""
    from click.testing import CliRunner

    from clagd.cli import main

    base = ["--socket", str(daemon.socket)]
    run = CliRunner().invoke
    with daemon.client() as c:
        ids = {
            w: c.add(f"{w} keeps a spare key under the mat", scope=w)["ids"][0]
            for w in ("team", "alice", "bob")
        }

    def shown(*args: str) -> set[str]:
        out = run(main, [*base, *args, "--json"])
        assert out.exit_code == 0, out.output
        data = json.loads(out.output)
        return {m["scope"] for m in data.get("memories", [data] if "id" in data else [])}

    assert shown("query", "--scope", "alice", "spare key") == {"alice"}
    assert shown("query", "--scope", "alice", "--also-scope", "team", "spare key") == {
        "alice",
        "team",
    }
    assert shown("list", "--scope", "alice", "--also-scope", "team") == {"alice", "team"}
    assert shown("get", ids["team"], "--scope", "alice", "--also-scope", "team") == {"team"}
    missing = run(main, [*base, "get", ids["bob"], "--scope", "alice", "--also-scope", "team"])
    assert missing.exit_code == 1 and ids["bob"] in missing.output
    bad = run(main, [*base, "query", "--also-scope", "Team", "spare key"])
    assert bad.exit_code == 2 and "--also-scope" in bad.output and "'Team'" in bad.output


def test_an_owner_parameter_on_the_socket_is_refused_not_ignored(daemon: InProcessDaemon) -> None:
    """`{"op": "add", "content": ..., "user_id": "bob"}` (mem0's word) stored the memory in
    the default scope; it is refused, pointing to `scope`, and nothing is stored."""
    with daemon.client() as c:
        for key in ("user_id", "agent_id", "run_id", "namespace"):
            with pytest.raises(ClientError) as refused:
                c.request("add", {"content": "Bob's PIN is 1", key: "bob"})
            assert refused.value.code == "bad_request"
            assert f"'{key}'" in refused.value.message and "'scope'" in refused.value.message
        assert c.status()["counts"]["memories"] == 0
