"""`forget --purge`, the engine's side: run on the writer thread right after the forget
commit (so the daemon's writes wait for it; queries go on), rewrite history
(`store/purge.py`), move the daemon's view onto the rewritten branch, save the warm start
again, and push to `replication.remote` only when asked (`--force-remote`, with a lease on
what the remote held: one of the commits this store had before the rewrite)."""

from __future__ import annotations

import json
import logging
import time

from clagd.engine.results import Purged, Rewritten
from clagd.errors import Conflict, StoreError
from clagd.model import Memory, iso_utc
from clagd.store.history import HISTORY_FILE
from clagd.store.purge import PurgeSpec, rewrite_history
from clagd.store.writer import WriteContext

log = logging.getLogger("clagd.purge")


def purge_spec(mems: list[Memory], ids: list[str]) -> PurgeSpec:
    """Every form a forgotten memory's text takes in history: its content, the first 72
    characters an ingest commit's body quotes, and its id. (Not a `--match` text: it only
    found the memories, and may be a word other memories and commits hold.)"""
    texts = {m.content for m in mems} | {m.content[:72] for m in mems} | set(ids)
    return PurgeSpec(
        tuple(sorted(ids)),
        tuple(sorted(t for t in texts if t.strip())),
        tuple(m.content for m in mems),
    )


def purge_history(ctx: WriteContext, spec: PurgeSpec) -> list[Rewritten]:
    """Rewrite history without `spec` (writer thread) and move the daemon's view onto it.
    The working tree is left as it is: HEAD's tree holds none of the forgotten memories
    already (the forget commit took them out), so only commit ids change."""
    git = ctx.git
    old_head = git.head()
    changed = rewrite_history(git.root, spec)
    new_head = git.branch_head()
    git.base = new_head  # the daemon's own move: nothing to take in, nothing to report
    _scrub_history_log(ctx, spec.ids)
    order = {c: i for i, c in enumerate(git.run("rev-list", "--reverse", "--all").split())}
    rewritten = [Rewritten(o, n) for o, n in changed]
    rewritten.sort(key=lambda r: order.get(r.new, len(order)))
    _record(ctx, rewritten)
    log.info(
        "purge: %d commit(s) rewritten, head %s -> %s",
        len(rewritten),
        str(old_head)[:10],
        str(new_head)[:10],
    )
    return rewritten


PURGES_FILE = "clagd-purges.jsonl"  # in .git/: each purge's old -> new commit ids


def _record(ctx: WriteContext, rewritten: list[Rewritten]) -> None:
    """Keep each purge's commit map (ids only): a later `--force-remote` leases on a remote
    that still holds a commit of any history before a purge of this store."""
    line = json.dumps({"at": iso_utc(), "rewritten": [[r.old, r.new] for r in rewritten]})
    with open(ctx.git.gitdir / PURGES_FILE, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _before_purges(ctx: WriteContext) -> set[str]:
    """Every commit id some purge of this store rewrote."""
    try:
        lines = (ctx.git.gitdir / PURGES_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return set()
    out: set[str] = set()
    for line in lines:
        try:
            out.update(str(pair[0]) for pair in json.loads(line).get("rewritten", []))
        except (ValueError, AttributeError, TypeError, IndexError):
            continue
    return out


def _scrub_history_log(ctx: WriteContext, ids: tuple[str, ...]) -> None:
    """`.git/clagd-history.jsonl` lists ids of memories that left HEAD: not these."""
    path = ctx.git.gitdir / HISTORY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return
    new = text
    for mid in ids:
        new = new.replace(f'"{mid}"', '"(forgotten)"')
    if new != text:
        path.write_text(new, encoding="utf-8")


def push_rewrite(
    ctx: WriteContext, remote: str, branch: str, rewritten: list[Rewritten], force: bool
) -> tuple[str, str]:
    """(pushed, note): the rewritten branch force-pushed to `remote` with a lease, when
    `force`; else a note that the remote keeps the old history."""
    if not remote:
        return "", ""
    if not force:
        return "", (
            f"replication.remote {remote} still holds the old history, and refuses the "
            "daemon's pushes until it gets the rewrite: run forget --purge again with "
            "--force-remote, or push with --force-with-lease yourself"
        )
    ref = f"refs/heads/{branch}"
    out = ctx.git.run("ls-remote", "--", remote, ref)
    theirs = out.split()[0] if out.strip() else ""
    olds = {r.old for r in rewritten} | _before_purges(ctx)
    if theirs and theirs not in olds and theirs != ctx.git.head():
        raise Conflict(
            f"forgotten, and history rewritten here; not pushing the rewrite: {remote} "
            f"holds {theirs[:10]} on {branch}, a commit this store did not have before the "
            "purge (someone else pushed there)"
        )
    lease = f"--force-with-lease={ref}:{theirs}" if theirs else f"--force-with-lease={ref}:"
    try:
        ctx.git.run("push", "-q", lease, "--", remote, f"HEAD:{ref}")
    except StoreError as exc:
        raise StoreError(
            f"the rewrite is done here, but the push to {remote} failed: {exc}"
        ) from None
    return remote, ""


def timed(started: float) -> float:
    return round(time.monotonic() - started, 3)


def run_purge(ctx: WriteContext, mems: list[Memory], remote: tuple[str, str, bool]) -> Purged:
    """The purge of `mems` (forgotten by the commit just made): history, then the remote
    (`remote`: its name or URL, the branch, whether to force-push)."""
    t0 = time.monotonic()
    ids = [m.id for m in mems]
    rewritten = purge_history(ctx, purge_spec(mems, ids))
    pushed, note = push_rewrite(ctx, remote[0], remote[1], rewritten, remote[2])
    return Purged(tuple(rewritten), timed(t0), pushed, note)
