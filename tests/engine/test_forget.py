"""Issue 24, forgetting: `forget` takes memories out of HEAD and every copy the daemon keeps,
no revert brings them back, and a revert of a commit whose memories moved on is never a
silent no-op. Real daemons on real sockets, real git repositories."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import DaemonProcess, InProcessDaemon, git, head_contents, wait_for

from clagd.cli import main
from clagd.client import ClientError

PIN = "The user's PIN is 4321"


def _cli(d: InProcessDaemon | DaemonProcess, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["--store", str(d.root), "--socket", str(d.socket), *args])
    return res.exit_code, res.output


def _served(d: InProcessDaemon | DaemonProcess, text: str) -> bool:
    with d.client() as c:
        return any(text in m.content for m in c.query(text, max_memories=100).memories)


def _commit_of(root: Path, grep: str) -> str:
    return git(root, "log", "--format=%H", "-F", f"--grep={grep}").split()[-1]


def test_revert_of_an_ingest_a_session_moved_takes_the_memory_out(
    daemon_proc: DaemonProcess,
) -> None:
    """The issue's repro: `clagd add` a PIN, `clagd recluster`, `clagd revert <that commit>`
    said it worked and the PIN was still served. Now the revert takes it out of the cluster
    the session moved it to, in the revert commit."""
    d = daemon_proc.start()
    code, out = _cli(d, "add", PIN)
    assert code == 0, out
    _cli(d, "add", "The user likes green tea")
    code, out = _cli(d, "recluster")
    assert code == 0 and "accepted" in out, out
    pin_commit = _commit_of(d.root, "ingest")  # the oldest ingest: the PIN's
    assert _served(d, "PIN is 4321")
    code, out = _cli(d, "revert", pin_commit)
    assert code == 0, out
    assert not _served(d, "PIN is 4321")
    assert PIN not in head_contents(d.root)
    assert "The user likes green tea" in head_contents(d.root)
    # reverting it again says so, and changes nothing
    head = git(d.root, "rev-parse", "HEAD")
    code, out = _cli(d, "revert", pin_commit)
    assert code != 0 and "already reverted" in out, out
    assert git(d.root, "rev-parse", "HEAD") == head
    assert d.terminate() == 0


def test_forget_removes_every_copy(daemon: InProcessDaemon) -> None:
    eng = daemon.engine
    with daemon.client() as c:
        c.add_many([{"content": PIN}, {"content": "The user's bank is Nordbank"}])
        c.recluster()
        c.add("The user's PIN reminder is the cat's birthday")
        assert "4321" in c.query("PIN").context  # counted in the access statistics
        eng.stats.save()
        eng.writer.call(eng._save_warmstart_op)  # a warm start that holds the PIN
        assert b"4321" in eng.warmstart.path.read_bytes()
        res = c.forget(match="pin is 4321")
        assert len(res["forgotten"]) == 1 and res["scope"] == "default"
        pin_id = res["forgotten"][0]
        assert "4321" not in c.query("PIN").context
        assert c.status()["counters"]["forgotten"] == 1
    msg = git(daemon.root, "log", "-1", "--format=%B")
    assert "Clagd-Kind: forget" in msg and f"Clagd-Forgotten: {pin_id}" in msg
    assert "4321" not in msg  # a forget commit never quotes the text
    assert PIN not in head_contents(daemon.root)
    assert "The user's bank is Nordbank" in head_contents(daemon.root)
    # no copy in the daemon: index (a whole new one), its pickle, the warm start, the
    # access statistics, the writer's file-text cache, the dedupe set
    assert b"4321" not in pickle.dumps(eng.index)
    assert b"4321" not in eng.warmstart.path.read_bytes()
    stats = json.loads((daemon.root / ".git" / "clagd-stats.json").read_text())
    assert pin_id not in stats["memories"]
    assert eng.fragments.get(pin_id) is None and pin_id not in eng.known
    # the cluster's name and tags do not keep a word only the forgotten memory had
    for cl in eng.state.clusters.values():
        assert "4321" not in f"{cl.name} {cl.description} {cl.tags}"
    # dropping the same text again is a new, explicit add
    with daemon.client() as c:
        again = c.add(PIN)
        assert again["added"] == 1 and again["ids"] == [pin_id]
        assert "4321" in c.query("PIN").context


def test_a_warm_start_a_forget_cannot_save_again_is_removed(daemon: InProcessDaemon) -> None:
    """After a forget the warm start is saved again, or removed when it cannot be (the
    working tree differs from HEAD: a stray file in a memory folder), whatever head the
    file was saved at: no older file keeps what was forgotten."""
    eng = daemon.engine
    with daemon.client() as c:
        c.add(PIN)
    eng.writer.call(eng._save_warmstart_op)
    assert b"4321" in eng.warmstart.path.read_bytes()
    (daemon.root / "clusters" / "notes.txt").write_text("a person's notes\n")  # untracked
    eng.writer.call(lambda ctx: eng.warmstart.save_or_drop(ctx, eng.index))
    assert not eng.warmstart.path.exists()


def test_no_revert_brings_a_forgotten_memory_back(daemon: InProcessDaemon) -> None:
    garden = "The user's garden has three apple trees"
    with daemon.client() as c:
        batch = c.add_many([{"content": PIN}, {"content": garden}])
        undo = c.revert(batch["commit"])["commits"][0]
        c.add(PIN)
        forgot = c.forget(match="PIN is 4321")
        # git applies this revert of the revert cleanly: it would put the PIN back
        c.revert(undo)
        assert head_contents(daemon.root) == [garden]
        assert not _served(daemon, "4321") and _served(daemon, "apple trees")
        msg = git(daemon.root, "log", "-1", "--format=%B")
        assert "Clagd-Kind: revert" in msg
        # a forget itself is not reverted
        with pytest.raises(ClientError) as exc:
            c.revert(forgot["commit"])
        assert exc.value.code == "forgotten" and "add it again" in exc.value.message
        assert not _served(daemon, "4321")


def test_a_session_revert_a_forget_conflicts_with_names_the_reason(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        c.add_many([{"content": PIN}, {"content": "The user's garden shed is green"}])
        session = c.recluster()
        forgot = c.forget(match="PIN is 4321")
        with pytest.raises(ClientError) as exc:
            c.revert(session["session_id"])
        assert exc.value.code == "conflict"
        assert forgot["commit"][:10] in exc.value.message, exc.value.message
        assert not _served(daemon, "4321") and _served(daemon, "shed is green")


def test_a_revert_that_would_change_nothing_is_refused(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        added = c.add("The user's locker number is 77")
        c.forget(ids=added["ids"])
        head = git(daemon.root, "rev-parse", "HEAD")
        with pytest.raises(ClientError) as exc:
            c.revert(added["commit"])
        assert exc.value.code == "nothing_to_revert", exc.value
        assert "changes nothing" in exc.value.message
        assert git(daemon.root, "rev-parse", "HEAD") == head
        assert git(daemon.root, "status", "--porcelain", "--", "clusters", "unsorted") == ""


def test_forget_refuses_what_it_cannot_find_and_forgets_nothing(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        kept = c.add("The user's car is blue")["ids"][0]
        head = git(daemon.root, "rev-parse", "HEAD")
        for kwargs, code, words in (
            ({"ids": [kept, "m-0000000000000000"]}, "not_found", "m-0000000000000000"),
            ({"match": "no memory says this"}, "not_found", "'no memory says this'"),
            ({"ids": ["not-an-id"]}, "bad_request", "'not-an-id' is not a memory id"),
            ({"ids": [kept], "match": "car"}, "bad_request", "'ids'"),
            ({"ids": [kept], "scope": "bob"}, "not_found", "in scope bob"),
        ):
            with pytest.raises(ClientError) as exc:
                c.forget(**kwargs)  # type: ignore[arg-type]
            assert exc.value.code == code and words in exc.value.message, (kwargs, exc.value)
        assert git(daemon.root, "rev-parse", "HEAD") == head
        assert _served(daemon, "car is blue")
    code, out = _cli(daemon, "forget")
    assert code == 2 and "memory ids or --match" in out
    code, out = _cli(daemon, "forget", "--match", "car", "--force-remote")
    assert code == 2 and "with --purge" in out


def test_forget_redacts_rejected_inbox_copies(daemon: InProcessDaemon) -> None:
    rejected = daemon.root / "inbox" / "rejected"
    rejected.mkdir(parents=True, exist_ok=True)
    (rejected / "broken.yaml").write_text(f"- content: {PIN}\n- [unclosed\n- other note\n")
    (rejected / "other.yaml").write_text("nothing to forget here\n")
    with daemon.client() as c:
        c.add(PIN)
        res = c.forget(match="pin is 4321")
    assert res["rejected_redacted"] == ["broken.yaml"]
    text = (rejected / "broken.yaml").read_text()
    assert "4321" not in text and "[forgotten]" in text and "other note" in text
    assert (rejected / "other.yaml").read_text() == "nothing to forget here\n"


def test_forget_redacts_rejected_copies_however_the_file_wrote_the_text(
    daemon: InProcessDaemon,
) -> None:
    """A rejected file holds the text as its format wrote it (YAML single quotes double
    the apostrophe, JSON escapes non-ASCII and quotes), and `.clagd/rejected/` holds the
    files when inbox/rejected/ was another account's: all are redacted, forgotten by id."""
    text = 'Zo\u00eb\'s "door" PIN is 4321'
    rejected = daemon.root / "inbox" / "rejected"
    private = daemon.root / ".clagd" / "rejected"
    for folder in (rejected, private):
        folder.mkdir(parents=True, exist_ok=True)
    yaml_form = text.replace("'", "''")
    (rejected / "a.yaml").write_text(f"- content: '{yaml_form}'\n- [unclosed\n")
    (rejected / "b.json").write_text(json.dumps([{"content": text}, {"oops": 1}]))
    (private / "c.json").write_text(
        json.dumps({"content": text, "created_at": 5}, ensure_ascii=False)
    )
    with daemon.client() as c:
        mid = c.add(text)["ids"][0]
        res = c.forget([mid])
    assert sorted(res["rejected_redacted"]) == [".clagd/rejected/c.json", "a.yaml", "b.json"]
    for path in (rejected / "a.yaml", rejected / "b.json", private / "c.json"):
        body = path.read_text()
        assert "4321" not in body and "[forgotten]" in body, (path, body)


def test_query_processes_forget_too(daemon_proc: DaemonProcess) -> None:
    """A query process keeps its own copy of the index: it must drop the memory too."""
    d = daemon_proc.start()
    with d.client() as c:
        c.add_many([{"content": PIN}, {"content": "The user plays chess on Sundays"}])
        wait_for(lambda: c.status()["query_processes"]["serving"] >= 1, 20, "a query process")
        assert "4321" in c.query("PIN").context
        c.forget(match="4321")
        assert "4321" not in c.query("PIN").context
        assert "chess" in c.query("chess").context
    assert d.terminate() == 0
    assert b"4321" not in (d.root / ".clagd" / "warmstart.pickle").read_bytes()


def test_forget_works_in_one_scope(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.add("The user's PIN is 1111", scope="alice")
        c.add("The user's PIN is 1111", scope="bob")
        res = c.forget(match="PIN is 1111", scope="alice")
        assert res["scope"] == "alice" and len(res["forgotten"]) == 1
        assert "1111" in c.query("PIN", scope="bob").context
        assert "1111" not in c.query("PIN", scope="alice").context
    code, out = _cli(daemon, "forget", "--scope", "bob", "--match", "PIN is 1111")
    assert code == 0 and "forgot 1 memory" in out, out
    code, out = _cli(daemon, "forget", "--scope", "Bob!", "--match", "PIN")
    assert code != 0 and "invalid scope 'Bob!'" in out, out


def test_forget_reaches_an_archived_memory(tmp_path: Path, short_tmp: Path) -> None:
    """A memory in archive/ is forgotten like any other: out of its archived cluster's
    file, the archive's index (include_archive, get) and what a thaw would bring back."""
    from helpers import make_store

    # no thaw: the query that finds the PIN would bring its cluster back to clusters/
    root = make_store(tmp_path / "m", {"archive": {"cold_after_days": 0, "thaw_on_hit": False}})
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add_many(
                [
                    {"content": PIN},
                    {"content": "The user's PIN reminder is the cat's birthday"},
                    {"content": "The user changes the PIN every spring"},
                ]
            )
            c.recluster()
            archived = c.archive()
            assert archived["clusters"]
            hit = c.call("query", text="PIN 4321", include_archive=True)
            pin = next(m["id"] for m in hit["memories"] if "4321" in m["content"])
            assert hit["memories"][0]["archived"] is True
            c.forget([pin])
            again = c.call("query", text="PIN 4321", include_archive=True, max_memories=20)
            assert again["memories"] and all("4321" not in m["content"] for m in again["memories"])
            with pytest.raises(ClientError) as gone:
                c.get(pin)
            assert gone.value.code == "not_found"
            assert git(root, "show", "--name-only", "--format=", "HEAD").split() == [
                f"archive/{archived['clusters'][0]}.yaml"
            ]
            # reverting the archive brings its cluster back to clusters/, without the PIN
            c.revert(archived["commit"])
            assert sorted(head_contents(root)) == [
                "The user changes the PIN every spring",
                "The user's PIN reminder is the cat's birthday",
            ]
            assert not (root / "archive" / f"{archived['clusters'][0]}.yaml").exists()
            assert all("4321" not in m.content for m in c.query("PIN 4321").memories)
        assert PIN not in head_contents(root)
        assert "4321" not in "".join(p.read_text() for p in (root / "archive").glob("*.yaml"))
    finally:
        d.stop()
