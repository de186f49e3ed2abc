"""What a person does by hand in the store: revert through clagd only memory changes; files
in the memory folders that are not memory files are never read or committed; an edited
memory gets the id of its new content, a hand-added one an id."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from helpers import InProcessDaemon, git, head_contents, idle, wait_for

from clagd.client import ClientError
from clagd.model import memory_id

TEXTS = [
    "User is always cold in the evening",
    "User asked where the heating switch is",
    "Anna is the user's sister",
    "Anna lives in Lyon",
]


def _clustered(daemon: InProcessDaemon):
    with daemon.client() as c:
        c.add_many([{"content": t} for t in TEXTS])
        c.call("recluster", backend="none")
        # the daemon's own organizing is over before the person edits (no commit of its
        # own lands between the person's and the edit commit the tests wait for)
        wait_for(lambda: idle(c.status()), 30, "the daemon's organizing")
    return sorted((daemon.root / "clusters").glob("c-*.yaml"))[0]


def test_revert_of_the_first_commit_is_refused(daemon: InProcessDaemon) -> None:
    root = daemon.root
    first = git(root, "rev-list", "--max-parents=0", "HEAD").strip()
    with daemon.client() as c:
        with pytest.raises(ClientError) as err:
            c.revert(first)
        assert err.value.code == "conflict"
        msg = str(err.value)
        assert "\n" not in msg and "outside clusters/, archive/ and unsorted/" in msg
    assert (root / "clagd.yaml").exists() and (root / ".gitignore").exists()
    assert git(root, "status", "--porcelain", "--", ".gitignore", "prompts") == ""


def test_swap_backup_and_other_files_are_ignored_and_listed(daemon: InProcessDaemon) -> None:
    root = daemon.root
    cluster = _clustered(daemon)
    before = git(root, "rev-parse", "HEAD").strip()
    swap = root / "clusters" / f".{cluster.name}.swp"
    swap.write_bytes(b"b0VIM 8.2\x00\x00user\x00/home/user/secret/path")
    (root / "clusters" / f"{cluster.name}~").write_text(cluster.read_text())
    (root / "clusters" / "notes.md").write_text("# my notes\n")
    (root / "unsorted" / "export.yaml").write_text("memories: []\n")
    with daemon.client() as c:
        st = wait_for(lambda: len((s := c.status())["ignored_files"]) >= 4 and s, 10, "the listing")
        assert "clusters/notes.md" in st["ignored_files"]
        assert "unsorted/export.yaml" in st["ignored_files"]
        c.call("recluster", backend="none")
        assert c.add("a memory after the editor left its files")["added"] == 1
        assert c.status()["outside_edit_error"] == ""
    tracked = git(root, "log", "--name-only", "--format=", f"{before}..HEAD")
    assert ".swp" not in tracked and "~" not in tracked and "notes.md" not in tracked
    assert "export.yaml" not in tracked
    ignore = (root / ".gitignore").read_text()
    for pattern in ("*.swp", "*~", ".*.sw?", "#*#"):
        assert pattern in ignore


def test_an_edited_memory_gets_the_id_of_its_new_content(daemon: InProcessDaemon) -> None:
    root = daemon.root
    cluster = _clustered(daemon)
    data = yaml.safe_load(cluster.read_text())
    old = data["memories"][0]
    old_id, old_text = old["id"], old["content"]
    new_text = old_text + " (edited by hand)"
    data["memories"][0]["content"] = new_text
    data["memories"].append(
        {"content": "Added by hand without an id", "created_at": "2026-01-01T00:00:00Z"}
    )
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    wait_for(lambda: "edit:" in git(root, "log", "-1", "--format=%s"), 15, "the edit commit")
    stored = yaml.safe_load(git(root, "show", f"HEAD:clusters/{cluster.name}"))
    edited = next(m for m in stored["memories"] if m["content"] == new_text)
    assert edited["id"] == memory_id(new_text)
    assert edited["metadata"]["previous_ids"] == [old_id]
    added = next(m for m in stored["memories"] if m["content"] == "Added by hand without an id")
    assert added["id"] == memory_id("Added by hand without an id")
    with daemon.client() as c:
        assert c.add(new_text)["added"] == 0  # dedup is exact: the new text is stored
        assert c.add(old_text)["added"] == 1  # the old text is not any more
    contents = head_contents(root)
    assert contents.count(new_text) == 1 and contents.count(old_text) == 1


def test_an_edit_committed_by_the_person_gets_the_id_of_its_new_content(
    daemon: InProcessDaemon,
) -> None:
    """The person edits a memory's text and commits it themselves: the daemon takes in the
    move of its branch, then gives the memory the id of its content in an edit commit of its
    own, so dedup stays exact and the old id is not reported as a removal."""
    root = daemon.root
    cluster = _clustered(daemon)
    data = yaml.safe_load(cluster.read_text())
    old_id, old_text = data["memories"][0]["id"], data["memories"][0]["content"]
    new_text = old_text + " (edited and committed by the person)"
    data["memories"][0]["content"] = new_text
    start = git(root, "rev-parse", "HEAD").strip()
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    rel = f"clusters/{cluster.name}"
    # the daemon may take the written file in before the person's commit (it reacts to the
    # file within milliseconds): then there is nothing left for the person to commit, and
    # the edit commit below is the same either way
    person = ["git", "-c", "user.name=test", "-c", "user.email=t@example.com"]
    subprocess.run([*person, "commit", "-qm", "fix a memory by hand", "--", rel], cwd=root)
    with daemon.client() as c:
        since = f"{start}..HEAD"
        wait_for(lambda: "edit:" in git(root, "log", "--format=%s", since), 15, "the edit commit")
        stored = yaml.safe_load(git(root, "show", f"HEAD:{rel}"))
        edited = next(m for m in stored["memories"] if m["content"] == new_text)
        assert edited["id"] == memory_id(new_text)
        assert edited["metadata"]["previous_ids"] == [old_id]
        assert c.add(new_text)["added"] == 0
        assert c.add(old_text)["added"] == 1
        assert not any(old_id in e.get("ids", []) for e in c.log(50)["history"])
    contents = head_contents(root)
    assert contents.count(new_text) == 1 and contents.count(old_text) == 1
