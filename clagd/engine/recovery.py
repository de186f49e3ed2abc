"""Start-up recovery: what a killed daemon left behind is put right before anything loads.

Git's own leftovers (a stale index lock, an interrupted revert, objects written after the
last sync) are `GitStore.recover`'s job; the writer's transaction marker (`.git/clagd-txn`,
written before a change touches the working tree) is handled here. The change it names was
never committed and its inputs are still in the inbox, so the files are put back to HEAD.
"""

from __future__ import annotations

import logging
import os
import re

from clagd.store.files import Paths, is_data_path
from clagd.store.gitrepo import GitStore
from clagd.store.writer import DATA_DIRS, TXN_FILE

log = logging.getLogger("clagd")
# the writer's temporary files (`durable._write_and_replace`: ".<file name>.<random>.tmp");
# one a kill left holds a half-written new version or, after the exchange, the old one
WRITER_TMP = re.compile(r"^\.(?P<name>[^/]+\.yaml)\.[A-Za-z0-9_]+\.tmp$")


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
        removed = _remove_writer_tmp(paths)
        txn.unlink()
        notes.append(
            "discarded a half-written change left by a stopped daemon"
            + (f" ({removed} temporary files removed)" if removed else "")
        )
    for note in notes:
        log.warning("recovery: %s", note)
    return notes


def _remove_writer_tmp(paths: Paths) -> int:
    """Remove the temporary files of the change a kill interrupted (never committed, never
    read: git would show them as untracked files); how many."""
    removed = 0
    for area in DATA_DIRS:
        try:
            names = os.listdir(paths.root / area)
        except OSError:
            continue
        for name in names:
            m = WRITER_TMP.match(name)
            if m and is_data_path(f"{area}/{m.group('name')}"):
                try:
                    os.unlink(paths.root / area / name)
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed
