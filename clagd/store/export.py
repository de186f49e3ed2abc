"""`clagd export`: the clusters as readable Markdown, one file per cluster, for people and for
other tools. Reads the store's files; no daemon needed."""

from __future__ import annotations

import re
from pathlib import Path

from clagd.model import Cluster, Memory
from clagd.store.durable import atomic_write_text
from clagd.store.files import StoreState, load_state

_SLUG = re.compile(r"[^a-z0-9]+")


def slug(name: str) -> str:
    return _SLUG.sub("-", name.lower()).strip("-")[:48] or "cluster"


def _memory_lines(mems: list[Memory], superseded: set[str]) -> list[str]:
    lines = []
    for m in sorted(mems, key=lambda m: (m.created_at, m.id)):
        meta = ", ".join(f"{k}: {v}" for k, v in sorted(m.metadata.items()))
        note = " *(superseded)*" if m.id in superseded else ""
        lines.append(f"- **{m.created_at}** {m.content}{note}")
        lines.append(f"  <sub>{m.id}{' · ' + meta if meta else ''}</sub>")
    return lines


def cluster_markdown(c: Cluster, archived: bool = False) -> str:
    head = [f"# {c.name}", ""]
    if c.description:
        head += [c.description, ""]
    facts = [f"id `{c.id}`", f"{len(c.memories)} memor{'y' if len(c.memories) == 1 else 'ies'}"]
    if c.tags:
        facts.append("tags: " + ", ".join(c.tags))
    if archived:
        facts.append("archived")
    if c.pinned:
        facts.append("pinned")
    facts.append(f"updated {c.updated_at or c.created_at}")
    head += [" · ".join(facts), "", "## Memories", ""]
    return "\n".join(head + _memory_lines(c.memories, set(c.supersedes.values()))) + "\n"


def export_markdown(
    store: Path, dest: Path, state: StoreState | None = None, scope: str | None = None
) -> list[Path]:
    """The clusters (and the unsorted memories) as Markdown files in `dest`; with `scope`,
    only that scope's (a cluster holds one scope, so whole files are left out)."""
    state = state or load_state(store)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for archived, area in ((False, state.clusters), (True, state.archived)):
        folder = dest / "archive" if archived else dest
        folder.mkdir(exist_ok=True)
        mine = [c for c in area.values() if scope in (None, c.scope)]
        for c in sorted(mine, key=lambda c: c.name.lower()):
            path = folder / f"{slug(c.name)}-{c.id}.md"
            atomic_write_text(path, cluster_markdown(c, archived), sync_dir=False)
            written.append(path)
    unsorted = [m for m in state.unsorted_memories() if scope in (None, m.scope)]
    if unsorted:
        path = dest / "unsorted.md"
        text = "# Unsorted\n\nMemories no cluster holds yet.\n\n## Memories\n\n"
        atomic_write_text(
            path, text + "\n".join(_memory_lines(unsorted, set())) + "\n", sync_dir=False
        )
        written.append(path)
    return written
