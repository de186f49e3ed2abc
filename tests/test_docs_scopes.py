"""The "Scopes, updates and forgetting" sections of README.md and docs/quickstart.md run as
written, block by block, in one shell with `clagd` on PATH, against a real daemon on its
real socket; then what they did is checked: every user's query saw her memories only."""

from __future__ import annotations

import re

from doc_sections import run_blocks
from helpers import REPO, DaemonProcess, wait_for

from clagd.client import Client
from clagd.store.files import load_state

SECTION = "## Scopes, updates and forgetting"


def assert_forgotten(out: str) -> None:
    """The forgetting block: forgot one memory, purged history, the query found nothing."""
    assert re.search(r"^forgot 1 memory \(m-[0-9a-f]{16}\)", out, re.M), out
    assert "commit(s) rewritten (old -> new)" in out
    assert out.rstrip().endswith("4711: no trace in history"), out
    assert "The user's door code" not in out


def assert_updated(out: str) -> None:
    """The update block: one update, the query without the old office and with it, then
    the second gym superseding the first at ingest."""
    assert re.search(r"^m-[0-9a-f]{16} supersedes m-[0-9a-f]{16} \([0-9a-f]{10}\)$", out, re.M)
    assert out.count("The user's office is in York") == 2, out  # both queries
    assert out.count("The user's office is in Leeds") == 1, out  # only with --superseded
    assert re.search(r'"supersedes": \{\s*"m-[0-9a-f]{16}": "m-[0-9a-f]{16}"', out), out


def test_the_quickstart_scopes_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    store = daemon_proc.root
    # the Python block opens "./memory": run the blocks from the store's parent folder
    (store.parent / "memory").exists() or (store.parent / "memory").symlink_to(store)
    outs = run_blocks(REPO / "docs" / "quickstart.md", SECTION, shell_env, store.parent)
    assert len(outs) == 5
    assert_forgotten(outs[3])
    assert_updated(outs[4])
    # each query printed its user's one memory: Alice's, then (CLAGD_SCOPE=bob) Bob's
    shown = [line for line in outs[0].splitlines() if line.startswith("[Memory")]
    assert [line.split("] ", 1)[1] for line in shown] == [
        "Alice is allergic to peanuts",
        "Bob is allergic to shellfish",
    ]
    assert "Alice prefers answers in French" in outs[2]

    def scopes() -> dict[str, str]:
        return {m.content: m.scope for m, _a, _k in load_state(store).all_memories()}

    inboxed = ("Alice runs on Sunday mornings", "Alice's cat is called Miso")
    wait_for(lambda: set(inboxed) <= set(scopes()), 30, "the two inbox files to be stored")
    assert scopes()["Alice runs on Sunday mornings"] == "alice"
    assert scopes()["Alice's cat is called Miso"] == "alice"
    with Client(daemon_proc.socket) as c:
        bob = c.query("allergic cat runs French", scope="bob", max_memories=20)
        assert [h.content for h in bob.memories] == ["Bob is allergic to shellfish"]


def test_the_readme_scopes_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    outs = run_blocks(REPO / "README.md", SECTION, shell_env, daemon_proc.root.parent)
    assert len(outs) == 3
    assert_forgotten(outs[1])
    assert_updated(outs[2])
    shown = [line.split("] ", 1)[1] for line in outs[0].splitlines() if line.startswith("[Memory")]
    assert shown == ["I am allergic to peanuts", "I am allergic to shellfish"]
    with Client(daemon_proc.socket) as c:
        wait_for(lambda: c.list_memories(scope="alice").total == 2, 30, "alice's inbox file")
        assert {m.content for m in c.list_memories(scope="alice").memories} == {
            "I am allergic to peanuts",
            "Alice's cat is called Miso",
        }
