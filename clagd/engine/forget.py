"""Forgetting: memories taken out of HEAD in one `forget` commit, and kept out for good.

A forget commit (trailer `Clagd-Kind: forget`) lists the ids it removed in its
`Clagd-Forgotten` trailer and never quotes their text. That trailer, read back from the
branch's history (`forgotten_ids`), is the record every later `revert` consults: a revert of
an older commit (an ingest, a session, an archive, a route pass) that would put a forgotten
memory back into a file leaves it out. Only a new, explicit add stores the text again.
The engine's side of a forget (the index rebuilt whole, the warm start saved again, the
access statistics and the file-text cache cleared of the ids) is `Engine._forget_op`;
`--purge` (the text out of history too) is `engine/purge.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from clagd.errors import BadRequest, ClagdError, Conflict, NotFound
from clagd.ingest import supersede
from clagd.model import MEMORY_ID_RE, Cluster, Memory
from clagd.scopes import DEFAULT_SCOPE, check_scope, scopes_trailer
from clagd.store.drop import drop_memories, label_words
from clagd.store.gitrepo import GitStore
from clagd.store.writer import WriteContext
from clagd.yamlio import YamlError, loads

MAX_IDS = 10_000  # ids one forget takes (a trailer line, and a request, stay bounded)
MAX_MATCH = 1_000  # characters of a --match text
REDACTED = "[forgotten]"


@dataclass(frozen=True)
class ForgetRequest:
    """What to forget: ids, or every memory whose content contains `match` (case-folded),
    in `scope`. `reverts`: the commit whose memories this forget undoes (a revert that git
    could not apply: the memories moved on since)."""

    ids: tuple[str, ...] = ()
    match: str | None = None
    scope: str = DEFAULT_SCOPE
    reverts: str | None = None
    purge: bool = False
    force_remote: bool = False

    def check(self) -> ForgetRequest:
        check_scope(self.scope)
        if self.force_remote and not self.purge:
            raise BadRequest("'force_remote' pushes a purge: it needs 'purge'")
        if bool(self.ids) == bool(self.match):
            raise BadRequest("'forget' needs 'ids' (a list of memory ids) or 'match' (a text)")
        if len(self.ids) > MAX_IDS:
            raise BadRequest(f"'ids' holds {len(self.ids)} ids; at most {MAX_IDS} per forget")
        for mid in self.ids:
            if not isinstance(mid, str) or not MEMORY_ID_RE.match(mid):
                raise BadRequest(f"'{str(mid)[:80]}' is not a memory id (m- and 16 hex digits)")
        if self.match is not None:
            if not isinstance(self.match, str) or not self.match.strip():
                raise BadRequest("'match' must be a non-empty text")
            if len(self.match) > MAX_MATCH:
                raise BadRequest(f"'match' is {len(self.match)} characters; at most {MAX_MATCH}")
        return self


def select(ctx: WriteContext, req: ForgetRequest) -> list[Memory]:
    """The memories `req` names, in HEAD's state (writer thread). An id that is not there
    (or is another scope's) is refused, naming it; so is a match that finds nothing."""
    state = ctx.state
    if req.ids:
        found = state.locate_many(req.ids)
        missing = [mid for mid in req.ids if mid not in found or found[mid][2].scope != req.scope]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise NotFound(f"no memory {missing[0]} in scope {req.scope}{more}: nothing forgotten")
        seen: dict[str, Memory] = {mid: found[mid][2] for mid in req.ids}
        return list(seen.values())
    needle = str(req.match).casefold()
    out = {
        m.id: m
        for m, _area, _key in state.all_memories()
        if needle in m.content.casefold() and m.scope == req.scope
    }
    if not out:
        raise NotFound(f"no memory in scope {req.scope} contains '{req.match}': nothing forgotten")
    return list(out.values())


def remove_from_state(ctx: WriteContext, mems: list[Memory]) -> None:
    """Take `mems` out of every file that holds them (each file marked first); a cluster
    they leave keeps no word of theirs in its name, description or tags."""
    touch = {
        "cluster": ctx.touch_cluster,
        "archive": ctx.touch_archive,
        "unsorted": ctx.touch_shard,
    }
    marked: list[tuple[str, str]] = []

    def mark(area: str, key: str) -> None:
        touch[area](key)
        marked.append((area, key))

    drop_memories(ctx.state, {m.id for m in mems}, mark)
    state = ctx.state
    for area, key in marked:
        group = state.clusters if area == "cluster" else state.archived
        if area != "unsorted" and key in group:
            group[key] = scrub_labels(group[key], mems)
    # a memory the forgotten one superseded is current again (`ingest.supersede`)
    supersede.release(ctx, {m.id for m in mems})


def scrub_labels(c: Cluster, gone: list[Memory]) -> Cluster:
    """`c` without the words of its labels that only the forgotten memories had (a name
    the lexical organizer made from them would keep them): `store.drop.label_words`."""
    name, description, tags = label_words(
        (c.name, c.description, c.tags),
        [m.content for m in c.memories],
        [m.content for m in gone],
    )
    if (name, description, tags) == (c.name, c.description, c.tags):
        return c
    return replace(c, name=name, description=description, tags=tags)


def commit_forget(ctx: WriteContext, req: ForgetRequest, mems: list[Memory]) -> str | None:
    """The forget commit: ids only, never the text (a purge rewrites the commits that hold
    it; this one must not be one of them)."""
    ids = [m.id for m in mems]
    remove_from_state(ctx, mems)
    n = len(ids)
    body = [f"- {mid}" for mid in ids[:50]]
    if n > 50:
        body.append(f"- ... and {n - 50} more (all in the Clagd-Forgotten trailer)")
    why = f"reverts {req.reverts[:10]} (its memories had moved on)" if req.reverts else ""
    subject = f"forget: {n} memor{'y' if n == 1 else 'ies'}" + (f" ({why})" if why else "")
    return ctx.commit(
        subject,
        "\n".join(body),
        {
            "kind": "forget",
            "reverts": req.reverts,
            **scopes_trailer(m.scope for m in mems),
            "forgotten": " ".join(ids),
        },
    )


def forgotten_ids(git: GitStore) -> set[str]:
    """Every id a forget commit on the branch's history removed: the record `revert`
    consults so that no revert brings one back."""
    if not git.head():
        return set()
    out = git.run(
        "log",
        "-F",
        "--grep=Clagd-Kind: forget",
        "--format=%(trailers:key=Clagd-Forgotten,valueonly,unfold)",
        "HEAD",
    )
    return {t for t in out.split() if MEMORY_ID_RE.match(t)}


def forgotten_memories(git: GitStore) -> dict[str, Memory]:
    """The memories the forget commits on the branch took out, as each one's parent held
    them (what a later `--purge` of an earlier forget needs: the text to take out)."""
    if not git.head():
        return {}
    out = git.run("log", "-F", "--grep=Clagd-Kind: forget", "--format=%H %P", "HEAD")
    found: dict[str, Memory] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        sha, parent = parts
        files = [p for p in git.changed_files(sha) if p.endswith(".yaml")]
        for text in git.texts_at(parent, files).values():
            for m in _memories_in(text):
                found.setdefault(m.id, m)
    gone = forgotten_ids(git)
    return {mid: m for mid, m in found.items() if mid in gone}


def _memories_in(text: str) -> list[Memory]:
    try:
        data = loads(text)
    except (YamlError, ValueError, RecursionError):
        return []
    if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
        return []
    given = data.get("scope")
    scope = given if isinstance(given, str) else DEFAULT_SCOPE
    out = []
    for d in data["memories"]:
        try:
            out.append(Memory.from_dict(d, scope))
        except (KeyError, TypeError, ValueError, ClagdError):
            continue
    return out


def select_forgotten(git: GitStore, req: ForgetRequest) -> list[Memory]:
    """For `--purge` of memories forgotten before (not in HEAD any more): the ones `req`
    names among those the branch's forget commits took out. NotFound as `select`."""
    known = forgotten_memories(git)
    if req.ids:
        missing = [mid for mid in req.ids if mid not in known or known[mid].scope != req.scope]
        if missing:
            raise NotFound(
                f"no memory {missing[0]} in scope {req.scope}, in HEAD or forgotten before: "
                "nothing forgotten"
            )
        return [known[mid] for mid in dict.fromkeys(req.ids)]
    needle = str(req.match).casefold()
    out = [m for m in known.values() if needle in m.content.casefold() and m.scope == req.scope]
    if not out:
        raise NotFound(
            f"no memory in scope {req.scope} contains '{req.match}', in HEAD or forgotten "
            "before: nothing forgotten"
        )
    return out


def rejected_folders(root: Path) -> list[Path]:
    """Where rejected inbox files are: `inbox/rejected/`, and `.clagd/rejected/` when the
    former belonged to another account (`ingest.inbox`)."""
    return [root / "inbox" / "rejected", root / ".clagd" / "rejected"]


def written_forms(texts: list[str]) -> list[str]:
    """Each text as a rejected file may hold it: as given, YAML single-quoted (`'` doubled)
    and JSON-escaped (quotes, backslashes, line breaks; non-ASCII as is or `\\uXXXX`)."""
    out: set[str] = set()
    for t in texts:
        if not t.strip():
            continue
        out |= {t, t.replace("'", "''"), json.dumps(t)[1:-1]}
        out.add(json.dumps(t, ensure_ascii=False)[1:-1])
    return sorted(out, key=len, reverse=True)


def redact_rejected(root: Path, texts: list[str]) -> list[str]:
    """Rejected inbox files (and their `.error` notes) of the store at `root` that hold one
    of `texts` (`written_forms`): each occurrence replaced by `[forgotten]`, the rest of the
    file kept (nothing else the person gave is lost). Returns the names of the files
    changed (relative to the store)."""
    forms = written_forms(texts)
    if not forms:
        return []
    pattern = re.compile("|".join(re.escape(t) for t in forms), re.IGNORECASE)
    changed = []
    for folder in rejected_folders(root):
        if folder.is_dir() and not folder.is_symlink():
            changed += [
                name if folder == root / "inbox" / "rejected" else f".clagd/rejected/{name}"
                for name in _redact_in(folder, pattern)
            ]
    return changed


def _redact_in(rejected: Path, pattern: re.Pattern[str]) -> list[str]:
    changed = []
    for path in sorted(rejected.iterdir()):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
        new = pattern.sub(REDACTED, text)
        if new != text:
            path.write_text(new, encoding="utf-8", errors="surrogateescape")
            changed.append(path.name)
    return changed


def refuse_forget_revert(kind: str, sha: str) -> None:
    if kind == "forget":
        raise Conflict(
            f"{sha[:10]} is a forget: a forgotten memory is not brought back by revert "
            "(add it again if you mean it)",
            "forgotten",
        )


def memory_texts(mems: list[Memory], match: str | None) -> list[str]:
    """What a forget must leave no copy of: each memory's text, and the match."""
    out = [m.content for m in mems]
    if match:
        out.append(match)
    return out
