"""Outside moves of the daemon's branch that took memories out of HEAD.

A person may reset, rebase, amend or revert the store's history: that is their decision,
but never a silent one. Every move of the branch that the daemon did not make and that
removed memories is recorded here (in `.git/`, so `git clean -fdx` and `rm -rf .clagd`
keep it) with how many left HEAD and where they can still be found (the old commit, which
`git reflog` also lists). `clagd status` and `clagd log` show them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypedDict

from clagd.store.gitcmd import git_env
from clagd.yamlio import YamlError, loads

log = logging.getLogger("clagd.history")

HISTORY_FILE = "clagd-history.jsonl"
KEEP = 200  # events kept in memory for status and log (the file keeps them all)
MAX_IDS = 5000  # removed ids listed per event (the count is always exact)
DATA_DIRS = ("clusters", "archive", "unsorted")


def _ids_in_text(text: str) -> set[str]:
    try:
        data = loads(text)
    except (YamlError, ValueError, RecursionError):
        return set()
    mems = data.get("memories") if isinstance(data, dict) else None
    if not isinstance(mems, list):
        return set()
    return {str(m["id"]) for m in mems if isinstance(m, dict) and "id" in m}


def ids_at(root: Path, commit: str, rel_paths: list[str]) -> set[str]:
    """The memory ids that the given files hold in `commit` (a missing file holds none)."""
    if not rel_paths:
        return set()
    req = "".join(f"{commit}:{p}\n" for p in rel_paths).encode()
    out = subprocess.run(
        ["git", "cat-file", "--batch"],
        cwd=root,
        input=req,
        capture_output=True,
        check=False,
        env=git_env(),
    ).stdout
    ids: set[str] = set()
    pos = 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        header = out[pos:nl].split()
        pos = nl + 1
        if len(header) < 3 or header[-1] == b"missing":
            continue
        size = int(header[2])
        ids |= _ids_in_text(out[pos : pos + size].decode("utf-8", "replace"))
        pos += size + 1
    return ids


def removed_between(root: Path, old: str, new: str | None) -> set[str] | None:
    """Memory ids in `old`'s data files that `new` no longer holds; None when `old` is not
    in the repository any more (pruned)."""
    probe = subprocess.run(
        ["git", "cat-file", "-e", f"{old}^{{commit}}"],
        cwd=root,
        capture_output=True,
        check=False,
        env=git_env(),
    )
    if probe.returncode != 0:
        return None
    if new is None:
        files = _ls(root, old)
        return ids_at(root, old, files)
    diff = subprocess.run(
        ["git", "diff", "--name-status", "--no-renames", old, new, "--", *DATA_DIRS],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env=git_env(),
    ).stdout.split("\n")
    changed = [line.split("\t", 1) for line in diff if line.endswith(".yaml") and "\t" in line]
    files = [p for _status, p in changed]
    # a file the move added held nothing before it (a bulk import adds thousands)
    before = ids_at(root, old, [p for status, p in changed if status != "A"])
    if not before:  # nothing to lose (e.g. a bulk import committed onto a new store): the
        return before  # new side, possibly the whole store, need not be parsed at all
    return before - ids_at(root, new, files)


def _ls(root: Path, commit: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", commit, "--", *DATA_DIRS],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env=git_env(),
    ).stdout
    return [p for p in out.split("\n") if p.endswith(".yaml")]


# One recorded move of the branch (a line of .git/clagd-history.jsonl; `from` is a keyword,
# hence the functional form). Every key may be missing from a line written by hand.
HistoryEvent = TypedDict(
    "HistoryEvent",
    {
        "at": str,  # when it was noticed, ISO 8601
        "from": str,  # the commit before
        "to": "str | None",  # the commit after
        "kind": str,  # "rewrite" (history rewritten) or "commit"
        "noticed": str,  # how ("while running", "at start-up", ...)
        "removed": int,  # memories that left HEAD
        "ids": "list[str]",  # up to MAX_IDS of them
        "where": str,  # where they still are
    },
    total=False,
)


@dataclass(frozen=True)
class HistoryStatus:
    """The `history` section of `status`: outside moves of the branch that took memories
    out of HEAD (`last`: the newest events, as the history file holds them), the moves
    taken in and the commits retried after one."""

    events: int
    memories_removed: int
    file: str
    last: tuple[HistoryEvent, ...]
    outside_moves: int
    retried_commits: int


class HistoryLog:
    """The recorded outside moves that removed memories (append-only JSON lines)."""

    def __init__(self, gitdir: Path) -> None:
        self.path = Path(gitdir) / HISTORY_FILE
        self.events: list[HistoryEvent] = []
        try:
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue
        except OSError:
            pass
        self.events = self.events[-KEEP:]

    def record(
        self, old: str, new: str | None, removed: set[str], rewrite: bool, when: str
    ) -> HistoryEvent:
        """Note that moving the branch from `old` to `new` took `removed` out of HEAD."""
        event: HistoryEvent = {
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "from": old,
            "to": new,
            "kind": "rewrite" if rewrite else "commit",
            "noticed": when,
            "removed": len(removed),
            "ids": sorted(removed)[:MAX_IDS],
            "where": f"still in commit {old[:12]} (git show {old[:12]}; git reflog lists it)",
        }
        self.events.append(event)
        self.events = self.events[-KEEP:]
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, (json.dumps(event) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:  # the event is still shown while the daemon runs
            log.error("cannot record the history event in %s: %s", self.path, exc)
        log.warning(
            "branch moved outside clagd (%s..%s, %s): %d memor%s left HEAD; %s",
            old[:10],
            str(new)[:10],
            event["kind"],
            len(removed),
            "y" if len(removed) == 1 else "ies",
            event["where"],
        )
        return event

    def recent(self, n: int, ids: int = 20) -> list[HistoryEvent]:
        """The last `n` events, each listing at most `ids` of its removed ids (the whole
        list is in .git/clagd-history.jsonl)."""
        out = []
        for e in self.events[-n:]:
            short = e.copy()
            short["ids"] = list(e.get("ids", []))[:ids]
            out.append(short)
        return out

    def status(self, outside_moves: int, retried_commits: int) -> HistoryStatus:
        return HistoryStatus(
            len(self.events),
            sum(int(e.get("removed", 0)) for e in self.events),
            str(self.path),
            tuple(self.recent(5)),
            outside_moves,
            retried_commits,
        )
