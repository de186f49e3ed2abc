"""Outside edits: hand edits of the YAML files and git commands run in the store (a commit,
a reset, a checkout of another commit) are noticed, validated and taken in.

A valid edit is reloaded into the state and index and, when the working tree differs from
HEAD, committed as `kind: edit`. A broken one is refused: the daemon keeps serving the last
good state, reports the error once in `status`, and does not rewrite the files of the
clusters it concerns (`blocked`) until it is fixed or undone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from clagd.engine.identity import fix_identities
from clagd.errors import StoreError
from clagd.store.files import StoreState, data_files, is_data_path, memories_in
from clagd.store.writer import DATA_DIRS, WriteContext

log = logging.getLogger("clagd")


@dataclass
class OutsideChange:
    """One outside change, taken in (`ok`), refused (`error`), or waiting while the
    person's git holds the store (`paused`: why)."""

    ok: bool
    error: str = ""
    files: list[str] = field(default_factory=list)
    commit: str | None = None
    paused: str = ""


class OutsideEdits:
    """The state of outside edits between two checks (runs on the writer thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.error = ""  # the last refused edit, "" when the files are good
        self.blocked: set[str] = set()  # clusters whose file holds a broken hand edit
        self._sig: tuple[str | None, tuple[tuple[str, float], ...]] | None = None

    def take_in(
        self, ctx: WriteContext, known_head: str | None, full: bool = False
    ) -> OutsideChange | None:
        """Compare the files and HEAD with what the daemon last wrote (`known_head`) and
        take in any difference. None when there is none, or it is the same broken state
        already reported. Without `full`, git is asked only when the watch of the memory
        folders and the index (`store/changewatch.py`) saw a change not the daemon's."""
        head = ctx.git.head()
        dirty = self._dirty(ctx, head, known_head, full)
        if dirty is None:
            return None
        moved = head != known_head
        if not moved and not dirty:
            # back in step with HEAD (e.g. a broken edit was undone): nothing to report
            self._clear()
            return None
        sig = (head, tuple(sorted((p, _mtime(self.root / p)) for p in dirty)))
        if sig == self._sig:
            return None
        changed = set(dirty)
        if moved and known_head:
            try:
                changed.update(ctx.git.changed_between(known_head, head or "HEAD", DATA_DIRS))
            except Exception:  # noqa: BLE001 - unrelated history: reload everything
                changed.update(data_files(self.root))
        known: dict[str, str] = {}
        if dirty:
            # an edited memory gets the id of its new content, an id-less one an id
            known = {m.id: m.content for m, _a, _k in ctx.state.all_memories()}
            fix_identities(self.root, dirty, known)
        try:
            # a checkout or reset rewrites the files before it moves HEAD: what is read
            # while the person's git runs is not an edit (Paused: read again later)
            candidate, changes = ctx.read_paths(sorted(changed), settled=True)
        except StoreError as exc:
            self._sig = sig
            self.blocked = {Path(p).stem for p in dirty if p.startswith("clusters/")}
            self.error = str(exc)
            log.error("outside edit rejected, still serving the last good state: %s", exc)
            return OutsideChange(ok=False, error=str(exc))
        sha = None
        if dirty:
            # committed before it is served: when the commit fails (the person's git took
            # the store or the index meanwhile), the last good state stays served, and an
            # edit undone meanwhile (a checkout and back, a reset) is never served at all
            sha = ctx.git.commit(
                dirty,
                f"edit: {len(dirty)} file(s) changed outside clagd",
                "\n".join(dirty),
                {"kind": "edit"},
            )
            removed = set(known) - candidate.memory_ids() - _previous_ids(candidate, dirty)
            if sha and removed and head:
                # memories deleted by hand (or by a git command of the person's): reported
                # like a rewrite, never silent
                ctx.w.branch.history.record(head, sha, removed, False, "edit committed by clagd")
        ctx.adopt(candidate, changes)
        self._clear()
        log.info(
            "outside change loaded (%d files%s)",
            len(changed),
            f", committed {sha[:10]}" if sha else "",
        )
        return OutsideChange(ok=True, files=sorted(changed), commit=sha)

    def _dirty(
        self, ctx: WriteContext, head: str | None, known_head: str | None, full: bool
    ) -> list[str] | None:
        """The memory files that differ from HEAD (from `git status`, which also refuses
        the person's staged changes); None when the watch knows nothing changed."""
        watch = ctx.w.watch
        if ctx.w.branch.reidentify_paths:
            # staged changes are the person's (or a failed git's): no file of theirs is
            # rewritten for new ids while they are
            ctx.check_no_staged()
            self._reidentify_committed_edits(ctx)
        elif not full and head == known_head and watch.quiet():
            ctx.staged_checked()  # the index is the one the last clean check saw, or ours
            return None
        watch.begin_full()
        # only memory files: an editor's swap file or a backup is never read or committed
        listed, staged = ctx.git.dirty_and_staged(DATA_DIRS)
        dirty = [p for p in listed if is_data_path(p)]
        mine = head == known_head and not dirty and not any(is_data_path(p) for p in staged)
        watch.end_full(clean=mine)
        # the status's index column is `git diff --cached HEAD` of the same folders: one git
        # command checks both (the commit later in this operation relies on it)
        settled = ctx.settle_staged(staged)
        ctx.staged_checked()
        return [p for p in dirty if p not in settled]

    def _reidentify_committed_edits(self, ctx: WriteContext) -> None:
        """Memories the person edited by hand and committed (noted when the move of the
        branch was taken in) get the id of their content: their files are rewritten, so
        they are dirty below and committed by the daemon as an edit."""
        edited, before = ctx.w.branch.take_reidentify()
        if edited:
            fix_identities(self.root, edited, before)

    def _clear(self) -> None:
        self._sig = None
        self.error = ""
        self.blocked = set()


def _previous_ids(state: StoreState, rel_paths: list[str]) -> set[str]:
    """The old ids of memories that got the id of their edited content: not removed."""
    out: set[str] = set()
    for m in memories_in(state, rel_paths):
        prev = m.metadata.get("previous_ids") if isinstance(m.metadata, dict) else None
        if isinstance(prev, list):
            out.update(str(x) for x in prev)
    return out


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return 0.0
