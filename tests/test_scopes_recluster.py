"""`recluster --scope` and `status --scope` (issue 24): a session of one scope organizes
that scope's memories and clusters only, and leaves every file of another scope as it was;
`status` counts one scope's memories. Real daemons on real sockets, real git stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import InProcessDaemon, git, make_store, wait_for

from clagd.cli import main
from clagd.client import Client, ClientError
from clagd.errors import ClagdError
from clagd.model import Cluster, Memory

GARDEN = [
    "tomatoes in the garden need water every morning",
    "planted basil next to the garden tomatoes",
    "the garden hose leaks near the tomatoes",
    "bought compost for the garden tomatoes and basil",
]
TRAVEL = [
    "flight to lisbon leaves friday at noon",
    "hotel in lisbon is booked near the river",
    "lisbon tram tickets bought for the weekend trip",
]


def _files_of(root: Path, scope: str) -> dict[str, str]:
    """Every memory file in HEAD holding a memory of `scope`, and its text."""
    out = {}
    for f in git(root, "ls-tree", "-r", "--name-only", "HEAD").split():
        if f.endswith(".yaml") and f.split("/")[0] in ("clusters", "archive", "unsorted"):
            text = git(root, "show", f"HEAD:{f}")
            mems = (yaml.safe_load(text) or {}).get("memories") or []
            if any(m.get("scope") == scope for m in mems) or f"scope: {scope}" in text:
                out[f] = text
    return out


def _trailer_scopes(root: Path, since: str) -> list[str]:
    """The `Clagd-Scopes` trailer of every commit after `since` ("" when it has none)."""
    out = []
    for sha in git(root, "rev-list", f"{since}..HEAD").split():
        body = git(root, "log", "-1", "--format=%B", sha)
        named = [ln.split(":", 1)[1].strip() for ln in body.splitlines()
                 if ln.startswith("Clagd-Scopes:")]  # fmt: skip
        out.append(",".join(named))
    return out


def _loose(c: Client) -> dict[str, int]:
    return {s: row["unsorted"] for s, row in c.status().counts.scopes.items()}


def _two_scopes(c: Client, extra: int = 0) -> None:
    """Loose memories of alice and bob, the same topics in both."""
    for who in ("alice", "bob"):
        c.add_many([{"content": f"{who}: {f}"} for f in GARDEN + TRAVEL[:extra]], scope=who)


def test_recluster_scope_organizes_that_scope_and_leaves_another_byte_identical(
    daemon: InProcessDaemon,
) -> None:
    root = daemon.root
    with daemon.client() as c:
        c.add_many([{"content": f"bob: {f}"} for f in GARDEN], scope="bob")
        c.recluster()  # bob has clusters of his own before
        _two_scopes(c, extra=3)
        before, bob_before = git(root, "rev-parse", "HEAD").strip(), _files_of(root, "bob")
        assert _loose(c)["alice"] == 7 and _loose(c)["bob"] == 3
        out = c.recluster(scope="alice")
        assert out.status == "accepted" and out.commits, out.raw
        assert _loose(c) == {"alice": 0, "bob": 3}
        assert {x.scope for x in c.clusters(scope="alice").clusters} == {"alice"}
    assert _files_of(root, "bob") == bob_before
    assert git(root, "diff", "--name-only", before, "HEAD", "--", *bob_before) == ""
    trailers = _trailer_scopes(root, before)
    assert trailers and set(trailers) == {"alice"}, trailers


def test_recluster_without_a_scope_organizes_every_scope_apart(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        _two_scopes(c)
        c.recluster()
        assert _loose(c) == {"alice": 0, "bob": 0}
        for who in ("alice", "bob"):
            assert {x.scope for x in c.clusters(scope=who).clusters} == {who}


def test_recluster_scope_without_waiting_runs_a_session_of_that_scope(
    daemon: InProcessDaemon,
) -> None:
    root = daemon.root
    with daemon.client() as c:
        _two_scopes(c)
        before, bob_before = git(root, "rev-parse", "HEAD").strip(), _files_of(root, "bob")
        assert c.recluster(wait=False, scope="alice").status == "scheduled"
        wait_for(lambda: _loose(c).get("alice") == 0, what="alice's session")
        assert _loose(c)["bob"] == len(GARDEN)
    assert _files_of(root, "bob") == bob_before
    assert set(_trailer_scopes(root, before)) == {"alice"}


@pytest.mark.parametrize("how", ["global", "command", "env"])
def test_cli_recluster_scope(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    root, base = daemon.root, ["--socket", str(daemon.socket)]
    with daemon.client() as c:
        _two_scopes(c)
    before, bob_before = git(root, "rev-parse", "HEAD").strip(), _files_of(root, "bob")
    args = {
        "global": [*base, "--scope", "alice", "recluster", "--json"],
        "command": [*base, "recluster", "--scope", "alice", "--json"],
        "env": [*base, "recluster", "--json"],
    }[how]
    if how == "env":
        monkeypatch.setenv("CLAGD_SCOPE", "alice")
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["status"] == "accepted"
    assert _files_of(root, "bob") == bob_before
    assert set(_trailer_scopes(root, before)) == {"alice"}
    with daemon.client() as c:
        assert _loose(c) == {"alice": 0, "bob": len(GARDEN)}


def test_status_scope_counts_that_scope_alone(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--socket", str(daemon.socket)]
    with daemon.client() as c:
        _two_scopes(c, extra=3)
        c.add_many([{"content": f"bob: {f}"} for f in ["bob owns a green kayak"]], scope="bob")
        c.recluster(scope="alice")
        whole = c.status().counts
        bob = c.status(scope="bob").counts
        alice = c.status(scope="alice").counts
    assert whole.memories == 15 and whole.scope is None
    assert (bob.scope, bob.memories, bob.clusters, bob.unsorted) == ("bob", 8, 0, 8)
    assert bob.scopes == {"bob": whole.scopes["bob"]}
    assert (alice.memories, alice.unsorted) == (7, 0) and alice.clusters >= 1
    assert alice.clusters == whole.clusters
    got = CliRunner().invoke(main, [*base, "status", "--scope", "bob", "--json"])
    assert got.exit_code == 0, got.output
    counts = json.loads(got.output)["counts"]
    assert (counts["scope"], counts["memories"], counts["unsorted"]) == ("bob", 8, 8)
    monkeypatch.setenv("CLAGD_SCOPE", "bob")
    text = CliRunner().invoke(main, [*base, "status"]).output
    assert "scope      bob" in text and "memories   8 in 0 clusters, 8 unsorted" in text
    monkeypatch.delenv("CLAGD_SCOPE")
    plain = CliRunner().invoke(main, [*base, "status", "--json"]).output
    assert "scope" not in json.loads(plain)["counts"]  # unchanged without a scope


@pytest.mark.parametrize("op", ["recluster", "status"])
def test_a_bad_scope_is_refused_naming_it(daemon: InProcessDaemon, op: str) -> None:
    root, base = daemon.root, ["--socket", str(daemon.socket)]
    with daemon.client() as c:
        _two_scopes(c)
        head = git(root, "rev-parse", "HEAD")
        with pytest.raises(ClientError) as refused:
            c.request(op, {"scope": "../Alice"})
        assert refused.value.code == "bad_scope" and "'../Alice'" in str(refused.value)
        with pytest.raises(ClagdError) as typed:
            getattr(c, op)(scope="Bad Name")
        assert typed.value.code == "bad_scope" and "'Bad Name'" in str(typed.value)
        cli = CliRunner().invoke(main, [*base, op, "--scope", "Bad Name"])
        assert cli.exit_code == 2 and "Bad Name" in cli.output
        assert _loose(c) == {"alice": len(GARDEN), "bob": len(GARDEN)}
    assert git(root, "rev-parse", "HEAD") == head


def test_recluster_scope_runs_the_size_policy_on_that_scope_only(
    tmp_path: Path, short_tmp: Path
) -> None:
    """Bob's cluster is over the size limit (written by hand while no daemon ran): a session
    of alice's splits nothing of his; one without a scope does."""
    root = make_store(tmp_path / "m", {"session": {"min_cluster_size": 2, "max_cluster_size": 4}})
    big = [Memory.new(f"bob: {f}", f"2026-01-0{i + 1}T00:00:00Z", scope="bob")
           for i, f in enumerate(GARDEN + TRAVEL)]  # fmt: skip
    c = Cluster("c-0000b0b0", "Bob Garden Travel", memories=big, scope="bob")
    (root / "clusters" / "c-0000b0b0.yaml").write_text(yaml.safe_dump(c.to_dict()))
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as cl:
            cl.add_many([{"content": f"alice: {f}"} for f in GARDEN[:3]], scope="alice")
            bob_before = _files_of(root, "bob")
            assert list(bob_before) == ["clusters/c-0000b0b0.yaml"]
            assert cl.recluster(scope="alice").status == "accepted"
            assert _loose(cl)["alice"] == 0
            assert _files_of(root, "bob") == bob_before
            cl.recluster()
            assert len(cl.clusters(scope="bob").clusters) > 1  # the whole store's splits it
    finally:
        d.stop()
