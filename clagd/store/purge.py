"""`forget --purge`: forgotten memories taken out of every commit of the store's history.

`rewrite_history` runs git-filter-repo (the PyPI package `git-filter-repo`) in a child
process (`python -m clagd.store.purge`, the spec on its stdin: the text never touches a
file) over every ref: each store file (a YAML mapping with a `memories` list) that holds a
forgotten id loses that memory and every supersedes link to it; any other file, and every
commit message (an ingest's body quotes the first 72 characters of each memory), has each
forgotten text and id replaced by `(forgotten)`. Then every reflog is expired and every object no
ref reaches is pruned (`git gc --prune=now`), so neither `git log -p --all`, `git grep`
over `git rev-list --all`, loose objects nor packs hold a trace. Returns which commits got
new ids (old -> new, from filter-repo's commit map, which is removed after it is read).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clagd.errors import StoreError
from clagd.store.drop import label_words
from clagd.yamlio import YamlError, dumps, loads

REDACTED = "(forgotten)"
LINK_KEYS = ("supersedes", "superseded_by")  # a memory's metadata naming another's id
TIMEOUT = 3600.0


@dataclass(frozen=True)
class PurgeSpec:
    """What to purge: memory ids (their items leave every store file) and texts (replaced
    wherever else they appear, in any case)."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]
    contents: tuple[str, ...] = ()  # the memories' texts: their words leave cluster labels

    def to_json(self) -> str:
        return json.dumps(
            {"ids": list(self.ids), "texts": list(self.texts), "contents": list(self.contents)}
        )


def _pattern(texts: list[str]) -> re.Pattern[bytes] | None:
    parts = sorted({t.encode("utf-8") for t in texts if t.strip()}, key=len, reverse=True)
    if not parts:
        return None
    return re.compile(b"|".join(re.escape(p) for p in parts), re.IGNORECASE)


def scrub_store_file(data: Any, ids: set[str], contents: list[str] | None = None) -> bool:
    """Drop the memories `ids` (and supersedes links to them) from a parsed store file, in
    place, and from its labels the words only `contents` had. Returns whether it is a store
    file (a mapping with a `memories` list)."""
    if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
        return False
    before = len(data["memories"])
    data["memories"] = [
        m for m in data["memories"] if not (isinstance(m, dict) and str(m.get("id")) in ids)
    ]
    _drop_links(data["memories"], ids)
    if contents and len(data["memories"]) != before and isinstance(data.get("name"), str):
        texts = [str(m.get("content", "")) for m in data["memories"] if isinstance(m, dict)]
        tags = [str(t) for t in data.get("tags") or []]
        labels = (data["name"], str(data.get("description") or ""), tags)
        name, description, new_tags = label_words(labels, texts, contents)
        if (name, description, new_tags) != labels:
            data["name"], data["description"], data["tags"] = name, description, new_tags
    links = data.get("supersedes")
    if isinstance(links, dict):
        kept = {k: v for k, v in links.items() if str(k) not in ids and str(v) not in ids}
        if kept:
            data["supersedes"] = kept
        else:
            data.pop("supersedes")
    return True


def _drop_links(memories: list[Any], ids: set[str]) -> None:
    """A link to a forgotten memory names its id (a hash of its text): out of every
    remaining memory's metadata (`supersedes`, `superseded_by`)."""
    for m in memories:
        meta = m.get("metadata") if isinstance(m, dict) else None
        if not isinstance(meta, dict):
            continue
        for key in LINK_KEYS:
            if str(meta.get(key)) in ids:
                del meta[key]
        if not meta:
            del m["metadata"]


def scrub_blob(
    raw: bytes,
    ids: set[str],
    pattern: re.Pattern[bytes] | None,
    contents: list[str] | None = None,
) -> bytes:
    """One blob without the forgotten memories and texts. A store file loses the forgotten
    memories by id, and the texts from its labels; another scope's memory of the same text
    (another id) is not touched. Any other file has the texts replaced."""
    hit_id = any(i.encode() in raw for i in ids)
    if not hit_id and (pattern is None or not pattern.search(raw)):
        return raw
    try:
        data = loads(raw.decode("utf-8"))
    except (YamlError, ValueError, UnicodeDecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("memories"), list):
        before = json.dumps(data, sort_keys=True, default=str)
        scrub_store_file(data, ids, contents)
        if pattern is not None:
            _redact_labels(data, pattern)
        if json.dumps(data, sort_keys=True, default=str) == before:
            return raw
        return dumps(data).encode("utf-8")
    if pattern is not None:
        raw = pattern.sub(REDACTED.encode(), raw)
    return raw


def _redact_labels(data: dict[str, Any], pattern: re.Pattern[bytes]) -> None:
    def red(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        return pattern.sub(REDACTED.encode(), text.encode("utf-8")).decode("utf-8")

    for key in ("name", "description"):
        if key in data:
            data[key] = red(data[key])
    if isinstance(data.get("tags"), list):
        data["tags"] = [red(t) for t in data["tags"]]


def _worker() -> None:
    """The child process: read the spec from stdin and run git-filter-repo in the cwd."""
    import git_filter_repo as fr  # the PyPI package `git-filter-repo`

    spec = json.loads(sys.stdin.read())
    ids = set(spec["ids"])
    pattern = _pattern(spec["texts"])
    contents = list(spec.get("contents") or [])

    def blob_callback(blob: Any, _meta: Any) -> None:
        blob.data = scrub_blob(blob.data, ids, pattern, contents)

    def message_callback(message: bytes) -> bytes:
        return pattern.sub(REDACTED.encode(), message) if pattern is not None else message

    # --partial: no migration of refs/remotes/origin, the remote kept, no automatic gc (the
    # caller expires reflogs and prunes itself, and reads the commit map first)
    # --prune-empty never: a commit left without a change stays (its subject, its trailers,
    # the ids in them replaced: the history keeps that something was added and forgotten)
    args = fr.FilteringOptions.parse_args(
        ["--force", "--partial", "--quiet", "--prune-empty", "never"]
    )
    fr.RepoFilter(args, blob_callback=blob_callback, message_callback=message_callback).run()


def rewrite_history(root: Path, spec: PurgeSpec) -> list[tuple[str, str]]:
    """Rewrite every ref of the repository at `root` without `spec`'s memories and texts,
    then expire every reflog and prune every unreachable object. Returns (old, new) of each
    commit that changed, in the commit map's order. StoreError when git-filter-repo is
    missing or fails (the repository is then as git-filter-repo left it: its refs either
    all old or all new, fast-import updating them at its end)."""
    try:
        import git_filter_repo  # noqa: F401 - only whether it is installed
    except ImportError:
        raise StoreError(
            "forget --purge needs the git-filter-repo package: pip install git-filter-repo"
        ) from None
    meta = _git_dir(root) / "filter-repo"  # where git-filter-repo writes its commit map
    shutil.rmtree(meta, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-m", "clagd.store.purge"],
        cwd=root,
        input=spec.to_json(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise StoreError(f"history rewrite (git-filter-repo) failed: {why[:300]}")
    changed = _commit_map(meta / "commit-map")
    shutil.rmtree(meta, ignore_errors=True)
    for args in (
        ["reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all"],
        ["gc", "-q", "--prune=now"],
    ):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            raise StoreError(f"git {args[0]} after the rewrite failed: {done.stderr.strip()}")
    return changed


def _git_dir(root: Path) -> Path:
    """The repository's git dir (`.git` may be a file: a linked worktree, a submodule, a
    separate git dir), as git-filter-repo finds it (`git rev-parse --git-dir`)."""
    out = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"], cwd=root, capture_output=True, text=True
    )
    found = out.stdout.strip() if out.returncode == 0 else ""
    return Path(found) if found else root / ".git"


def _commit_map(path: Path) -> list[tuple[str, str]]:
    try:
        lines = path.read_text(encoding="ascii").splitlines()[1:]  # after the header
    except OSError:
        return []
    out = []
    for line in lines:
        old, _, new = line.partition(" ")
        new = new.strip()
        if old and new and old != new:
            out.append((old, new))
    return out


if __name__ == "__main__":
    _worker()
