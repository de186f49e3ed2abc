"""Undo through git: `clagd revert` of one commit or of every commit of a session."""

from __future__ import annotations

from clagd.errors import Conflict, StoreError
from clagd.store.gitrepo import GitStore
from clagd.store.writer import DATA_DIRS, WriteContext

MEMORY_DIRS = set(DATA_DIRS)


def commits_for(git: GitStore, ref: str) -> list[str]:
    """The commits `ref` names: a session id's commits (newest first), else one commit.
    Refused (Conflict, one line) when one changes anything outside the memory folders:
    undoing the store's first commit would delete clagd.yaml, prompts/ and .gitignore, a
    config or prompt commit is the person's to revert with git."""
    shas = git.find_by_trailer("session", ref) if not looks_like_sha(ref) else []
    shas = shas or [git.resolve(ref)]
    for sha in shas:
        outside = [p for p in git.changed_files(sha) if p.split("/")[0] not in MEMORY_DIRS]
        if outside:
            more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
            raise Conflict(
                f"cannot revert {sha[:10]}: it changes {outside[0]}{more}, outside "
                "clusters/, archive/ and unsorted/ (revert it with git itself if you mean it)"
            )
    return shas


def revert_commits(ctx: WriteContext, shas: list[str]) -> list[str]:
    """Revert `shas` in order, one revert commit each (writer thread). All or nothing: when
    one of several fails, HEAD goes back to where it was and the state is reloaded."""
    done: list[str] = []
    start_head = ctx.git.head()
    try:
        for sha in shas:
            entry = ctx.git.log(1, sha)[0]
            if entry.kind == "revert" and sha != shas[0]:
                continue  # a session's own revert (a rolled-back plan) is not undone again
            new = ctx.revert(
                sha,
                f"revert: {entry.subject}"[:200],
                {"kind": "revert", "reverts": sha, "session": entry.trailers.get("session")},
            )
            done.append(new)
    except (Conflict, StoreError):
        if done and start_head:
            ctx.git.run("reset", "-q", "--hard", start_head)
            ctx.git.base = start_head  # the daemon's own move: nothing to report
            ctx.reload_all()
        raise
    return done


def looks_like_sha(ref: str) -> bool:
    return 4 <= len(ref) <= 40 and all(c in "0123456789abcdef" for c in ref.lower())
