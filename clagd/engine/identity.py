"""Memory identity after hand edits: a memory's id is the hash of its content, so that
dedup is exact. A memory whose text a person edited in a cluster file gets the id of its
new content (the old id kept in `metadata.previous_ids`); a memory added by hand without
an id gets one. The file is rewritten before it is loaded, and committed with the edit."""

from __future__ import annotations

import logging
from pathlib import Path

from clagd.model import memory_id, normalize_content
from clagd.scopes import DEFAULT_SCOPE, SCOPE_RE
from clagd.store.durable import atomic_write_text
from clagd.yamlio import YamlError, dumps, load_yaml_file

log = logging.getLogger("clagd")


def fix_identities(root: Path, rel_paths: list[str], known: dict[str, str]) -> list[str]:
    """Give edited and id-less memories in these files the id of their content. `known`:
    each stored memory's id -> its content before the edit. Returns the files rewritten;
    a file that does not parse is left alone (the loader reports it)."""
    fixed = []
    taken = set(known)
    for rel in rel_paths:
        path = Path(root) / rel
        try:
            data = load_yaml_file(path)
        except (OSError, YamlError, ValueError, RecursionError):
            continue
        mems = data.get("memories") if isinstance(data, dict) else None
        if not isinstance(mems, list):
            continue
        outer = data.get("scope")
        if any([_fix(m, known, taken, outer) for m in mems if isinstance(m, dict)]):
            atomic_write_text(path, dumps(data), sync_dir=False)
            fixed.append(rel)
    return fixed


def _fix(m: dict[str, object], known: dict[str, str], taken: set[str], outer: object) -> bool:
    """`outer`: the file's `scope:` (a cluster's), the scope of a memory that names none."""
    content = m.get("content")
    if not isinstance(content, str) or not normalize_content(content):
        return False
    scope = m.get("scope", outer)
    scope = DEFAULT_SCOPE if scope is None else scope
    if not isinstance(scope, str) or not SCOPE_RE.fullmatch(scope):
        return False  # the loader names the bad scope
    new = memory_id(content, scope)
    old = m.get("id")
    if old is None or old == "":
        if new in taken:
            return False  # the same text is stored already: left to the duplicate check
        m["id"] = new
        taken.add(new)
        log.info("a memory added by hand got the id %s", new)
        return True
    old = str(old)
    before = known.get(old)
    if before is None or before == normalize_content(content) or new == old or new in taken:
        return False
    meta = m.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    previous = meta.get("previous_ids")
    previous = list(previous) if isinstance(previous, list) else []
    meta["previous_ids"] = previous + [old]
    m["id"], m["metadata"] = new, meta
    taken.add(new)
    log.info("memory %s edited by hand: now %s", old, new)
    return True
