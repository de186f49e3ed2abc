"""Start-up recovery: what a killed daemon left behind is put right before anything loads.

Git's own leftovers (a stale index lock, an interrupted revert, objects written after the
last sync) are `GitStore.recover`'s job; the writer's transaction marker (`.git/clagd-txn`,
written before a change touches the working tree) is handled here. The change it names was
never committed and its inputs are still in the inbox, so the files are put back to HEAD.
"""

from __future__ import annotations

import logging

from clagd.store.files import Paths
from clagd.store.gitrepo import GitStore
from clagd.store.writer import DATA_DIRS, TXN_FILE

log = logging.getLogger("clagd")


def recover(git: GitStore, paths: Paths) -> list[str]:
    """Undo half-done work and return one note per thing done (shown in `status`)."""
    txn = git.gitdir / TXN_FILE  # in .git/: `git clean -fdx` cannot remove it
    # a revert or cherry-pick in progress is abandoned only when it was the daemon's own
    notes = git.recover(own_operation=txn.exists())
    if txn.exists():
        # first line: what the change was; then the files it named (none: every data folder)
        touched = [p for p in txn.read_text(encoding="utf-8").splitlines()[1:] if p.strip()]
        if touched:
            git.restore_paths(touched)
        else:
            git.reset_paths_to_head(DATA_DIRS)
        txn.unlink()
        notes.append("discarded a half-written change left by a stopped daemon")
    for note in notes:
        log.warning("recovery: %s", note)
    return notes
