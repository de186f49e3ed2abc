"""Undo through git: `clagd revert` of one commit or of every commit of a session."""

from __future__ import annotations

from clagd.errors import Conflict, StoreError
from clagd.store.gitrepo import GitStore
from clagd.store.writer import WriteContext


def commits_for(git: GitStore, ref: str) -> list[str]:
    """The commits `ref` names: a session id's commits (newest first), else one commit."""
    shas = git.find_by_trailer("session", ref) if not looks_like_sha(ref) else []
    return shas or [git.resolve(ref)]


def revert_commits(ctx: WriteContext, shas: list[str]) -> list[str]:
    """Revert `shas` in order, one revert commit each (writer thread). All or nothing: when
    one of several fails, HEAD goes back to where it was and the state is reloaded."""
    done: list[str] = []
    start_head = ctx.git.head()
    try:
        for sha in shas:
            entry = ctx.git.log(1, sha)[0]
            if entry["kind"] == "revert" and sha != shas[0]:
                continue  # a session's own revert (a rolled-back plan) is not undone again
            new = ctx.revert(
                sha,
                f"revert: {entry['subject']}"[:200],
                {"kind": "revert", "reverts": sha, "session": entry["trailers"].get("session")},
            )
            done.append(new)
    except (Conflict, StoreError):
        if done and start_head:
            ctx.git.run("reset", "-q", "--hard", start_head)
            ctx.reload_all()
        raise
    return done


def looks_like_sha(ref: str) -> bool:
    return 4 <= len(ref) <= 40 and all(c in "0123456789abcdef" for c in ref.lower())
