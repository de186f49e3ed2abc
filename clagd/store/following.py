"""Following the person's git: the store is also their repository.

Before every write operation the writer asks `BranchFollower.sync`: while the person's git
holds the store (another branch checked out, a merge or rebase in progress) it raises
`Paused`; when the daemon's branch moved outside clagd (reset, rebase, amend, pull, a
person's commit) it reads the files that changed between the two commits, from the new
commit's objects, and gives the writer the new state and its index changes. A move that
took memories out of HEAD is recorded in `.git/clagd-history.jsonl`, also one made while no
daemon ran.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from clagd.errors import Paused, StoreError
from clagd.store.changes import DATA_DIRS, StoreChange, read_changes
from clagd.store.files import StoreState, load_state, memories_in
from clagd.store.gitrepo import GitStore
from clagd.store.history import HistoryLog, removed_between

log = logging.getLogger("clagd.writer")


class BranchFollower:
    """The writer's view of the person's git: why writes wait, and the moves taken in."""

    def __init__(self, root: Path, git: GitStore) -> None:
        self.root = root
        self.git = git
        self.history = HistoryLog(git.gitdir)
        self.paused = ""  # why writes wait now (empty: they do not)
        self.outside_moves = 0  # moves of the branch taken in (reset, rebase, a person's commit)
        # files of a move of the branch that hold memories edited by hand and committed by
        # the person (an old id on new content), and each such id's content before: the
        # engine gives them the id of their content in an edit commit (engine/identity.py)
        self.reidentify: dict[str, str] = {}
        self.reidentify_paths: set[str] = set()
        self._check_moved_while_stopped()

    def _check_moved_while_stopped(self) -> None:
        """A move of the branch made while no daemon ran (or before it noticed) that took
        memories out of HEAD is reported like one seen while running."""
        prev, now = self.git.saved_base(), self.git.branch_head()
        if prev is None or now is None or prev == now:
            return
        removed = removed_between(self.root, prev, now)
        if removed:
            self.history.record(
                prev, now, removed, not self.git.is_ancestor(prev, now), "at start-up"
            )

    def sync(self, state: StoreState) -> tuple[StoreState, StoreChange] | None:
        """Before any write: refuse (Paused) while the person's git holds the store; when
        the branch moved outside clagd, the state at its new head and the changes to it
        (None: it did not move)."""
        reason = self.git.pause_reason(wait=True)
        if reason:
            self.paused = reason
            raise Paused(reason)
        head = self.git.branch_head()
        moved = self._reload_from(state, head) if head != self.git.base else None
        self.paused = ""
        return moved

    def _reload_from(self, state: StoreState, head: str | None) -> tuple[StoreState, StoreChange]:
        old = self.git.base
        removed = removed_between(self.root, old, head) if old else None
        try:
            if old is not None and head is not None and removed is not None:
                changed = sorted(set(self.git.changed_between(old, head, DATA_DIRS)))
                # from the new commit's objects, not the working tree: a git command of the
                # person's may be rewriting (or have just restored) the files, and a state
                # read from such a passing tree is never read again (served != HEAD)
                texts = self.git.texts_at(head, changed)
                new, changes = read_changes(self.root, state, changed, texts)
                self._note_edited(state, new, changed)
            else:  # unknown or pruned history: everything
                new = load_state(self.root)
                changes = StoreChange.whole(new, None)
            self.git.check_not_paused()  # no git command of the person's ran meanwhile
            if self.git.branch_head() != head:
                raise Paused("the branch moved again while clagd read it; it reads it again")
        except StoreError as exc:
            self.paused = (
                f"HEAD ({str(head)[:10]}) holds an invalid store: {exc}; fix it with a commit "
                f"or git reset (writes resume by themselves)"
            )
            raise Paused(self.paused) from None
        self.git.base = head
        self.outside_moves += 1
        if removed and old is not None:
            rewrite = head is None or not self.git.is_ancestor(old, head)
            self.history.record(old, head, removed, rewrite, "while running")
        log.info("branch moved outside clagd (%s -> %s): reloaded", str(old)[:10], str(head)[:10])
        return new, replace(changes, commit=head, reloaded=True)

    def _note_edited(self, old: StoreState, new: StoreState, changed: list[str]) -> None:
        """Remember the files of a move whose memories keep an old id on new content."""
        before = {m.id: m.content for m in memories_in(old, changed)}
        for rel in changed:
            if any(before.get(m.id, m.content) != m.content for m in memories_in(new, [rel])):
                self.reidentify_paths.add(rel)
                self.reidentify.update(before)

    def take_reidentify(self) -> tuple[list[str], dict[str, str]]:
        """The files noted by `_note_edited` since the last call, and the contents before."""
        paths, known = sorted(self.reidentify_paths), self.reidentify
        self.reidentify_paths, self.reidentify = set(), {}
        return paths, known
