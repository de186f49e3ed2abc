"""The "Get, list, filter and conversations" sections of README.md and docs/quickstart.md
run as written, block by block, in one shell with `clagd` on PATH, against a real daemon
on its real socket; then what they did is checked: the filtered query kept to its
memories, the conversation's user turns are memories with `role` and `speaker`."""

from __future__ import annotations

from doc_sections import run_blocks
from helpers import REPO, DaemonProcess, wait_for

from clagd.client import Client

SECTION = "## Get, list, filter and conversations"


def test_the_readme_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    first, turns = run_blocks(REPO / "README.md", SECTION, shell_env, daemon_proc.root.parent)
    shown = [line.split("] ", 1)[1] for line in first.splitlines() if line.startswith("[Memory")]
    assert shown == ["The user wants a window seat"]  # not the web note on window cleaning
    assert first.rstrip().endswith("The user wants a window seat")  # what `clagd get` printed
    assert "source=chat" in first and "task_type=travel" in first
    with Client(daemon_proc.socket) as c:
        wait_for(
            lambda: c.list_memories(where={"role": "user"}).total == 2, 30, "the chat.jsonl file"
        )
        said = {m.content: m.metadata for m in c.list_memories(where={"role": "user"}).memories}
        assert said == {
            "I am flying to Lisbon in May": {"role": "user", "speaker": "user"},
            "Window, always": {"role": "user", "speaker": "alice"},
        }
        assert c.list_memories(where={"role": "assistant"}).total == 0  # off by default


def test_the_quickstart_section_runs_as_written(
    shell_env: dict[str, str], daemon_proc: DaemonProcess
) -> None:
    store = daemon_proc.root
    # the Python block opens "./memory": run it from the store's parent folder
    (store.parent / "memory").exists() or (store.parent / "memory").symlink_to(store)
    (out,) = run_blocks(REPO / "docs" / "quickstart.md", SECTION, shell_env, store.parent)
    lines = out.splitlines()
    # two user turns of one second (no created_at): newest first, ties by id
    assert sorted(lines[:2]) == [
        "carol said: I love the tiles and the river",
        "carol said: I moved to Porto last year",
    ]
    assert lines[2:] == ["I moved to Porto last year"]  # the filtered query, then `get`
