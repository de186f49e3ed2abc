"""The store: a git repository of YAML cluster files, and its in-memory state.

`StoreState` is the writer's view of the working tree. Only the writer thread mutates it;
readers use index snapshots instead.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from clagd.errors import BadScope, StoreError
from clagd.model import (
    CLUSTER_ID_RE,
    MEMORY_ID_RE,
    Cluster,
    Memory,
    memory_id,
    new_id,
    one_line,
)
from clagd.store.durable import atomic_write_text
from clagd.store.special import not_regular, special_kind
from clagd.yamlio import YamlError, block_list_texts, dumps, list_items, load_yaml_file, loads

CLUSTERS = "clusters"
ARCHIVE = "archive"
UNSORTED = "unsorted"
PROMPTS = "prompts"
INBOX = "inbox"
RUNTIME = ".clagd"
SHARD_PREFIX = "u-"


def new_shard_name() -> str:
    return new_id(SHARD_PREFIX, stamped=True)


def valid_shard_name(name: str) -> bool:
    return (
        name.startswith(SHARD_PREFIX)
        and len(name) < 80
        and all(c.isalnum() or c in "-_" for c in name)
    )


@dataclass
class Paths:
    root: Path

    @property
    def clusters(self) -> Path:
        return self.root / CLUSTERS

    @property
    def archive(self) -> Path:
        return self.root / ARCHIVE

    @property
    def unsorted(self) -> Path:
        return self.root / UNSORTED

    @property
    def prompts(self) -> Path:
        return self.root / PROMPTS

    @property
    def inbox(self) -> Path:
        return self.root / INBOX

    @property
    def rejected(self) -> Path:
        return self.root / INBOX / "rejected"

    @property
    def runtime(self) -> Path:
        return self.root / RUNTIME

    def cluster_file(self, cid: str, archived: bool = False) -> Path:
        if not CLUSTER_ID_RE.match(cid):
            raise StoreError(f"invalid cluster id {cid!r}")
        return (self.archive if archived else self.clusters) / f"{cid}.yaml"

    def shard_file(self, name: str) -> Path:
        if not valid_shard_name(name):
            raise StoreError(f"invalid unsorted shard name {name!r}")
        return self.unsorted / f"{name}.yaml"

    def ensure_data_dirs(self) -> None:
        """The memory folders, made again when removed (`rm -rf unsorted`, a committed
        `git rm -r clusters`, `git clean`): before every commit of the writer's."""
        for d in (self.clusters, self.archive, self.unsorted):
            if not d.is_dir():
                d.mkdir(parents=True, exist_ok=True)

    def ensure_dirs(self) -> None:
        for d in (self.clusters, self.archive, self.unsorted, self.prompts):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.inbox, self.rejected, self.inbox / ".tmp"):
            d.mkdir(parents=True, exist_ok=True)
        self.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.runtime, 0o700)


@dataclass
class StoreState:
    """Every memory of the store, where it lives, and the files that hold it."""

    clusters: dict[str, Cluster] = field(default_factory=dict)
    archived: dict[str, Cluster] = field(default_factory=dict)
    unsorted: dict[str, list[Memory]] = field(default_factory=dict)
    # where each memory was last seen (area, key): only ever a hint, checked against the
    # place before it is answered (`locate_many`), so a stale entry costs a pass, never a
    # wrong answer; kept up to date by the writer's commits (`note_places`)
    places: dict[str, tuple[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def held(self) -> Iterator[tuple[str, str, list[Memory]]]:
        """Every place and its memories, (area, key, memories): clusters, archive, unsorted."""
        for cid, c in self.clusters.items():
            yield "cluster", cid, c.memories
        for cid, c in self.archived.items():
            yield "archive", cid, c.memories
        for shard, mems in self.unsorted.items():
            yield "unsorted", shard, mems

    def all_memories(self) -> Iterator[tuple[Memory, str, str]]:
        for area, key, mems in self.held():
            for m in mems:
                yield m, area, key

    def locate(self, mid: str) -> tuple[str, str] | None:
        hit = self.locate_many((mid,)).get(mid)
        return None if hit is None else (hit[0], hit[1])

    def memory(self, mid: str) -> Memory | None:
        hit = self.locate_many((mid,)).get(mid)
        return None if hit is None else hit[2]

    def members(self, area: str, key: str) -> list[Memory]:
        """The memories of one place (`cluster`, `archive` or `unsorted`); [] when gone."""
        if area == "unsorted":
            return self.unsorted.get(key) or []
        c = (self.clusters if area == "cluster" else self.archived).get(key)
        return c.memories if c is not None else []

    def locate_many(self, mids: Iterable[str]) -> dict[str, tuple[str, str, Memory]]:
        """Where each of these memories is, and the memory. Each is looked for first where
        `places` last saw it (the members of the places asked, not the store); only ids
        not found there (moved by a change that did not note it, gone, or never seen)
        cost one pass over the store, which notes every place again (issue 26: a
        session's operations held the writer for a pass per call)."""
        wanted = set(mids)
        out: dict[str, tuple[str, str, Memory]] = {}
        if not wanted:
            return out
        by_place: dict[tuple[str, str], list[str]] = {}
        for mid in wanted:
            hint = self.places.get(mid)
            if hint is not None:
                by_place.setdefault(hint, []).append(mid)
        for (area, key), ids in by_place.items():
            held = {m.id: m for m in self.members(area, key)}
            for mid in ids:
                m = held.get(mid)
                if m is not None:
                    out[mid] = (area, key, m)
        if len(out) < len(wanted):
            places: dict[str, tuple[str, str]] = {}
            for m, area, key in self.all_memories():
                places.setdefault(m.id, (area, key))
                if m.id in wanted and m.id not in out:
                    out[m.id] = (area, key, m)
            self.places = places
        return out

    def note_all_places(self) -> None:
        """Note where every memory is: one pass over the store, made when it is loaded (at
        100k memories the first session after a start made it on the writer, 65-130 ms)."""
        places: dict[str, tuple[str, str]] = {}
        for area, key, mems in self.held():  # the first place of an id wins
            where = (area, key)  # one tuple a place, not one a memory
            for m in mems:
                places.setdefault(m.id, where)
        self.places = places

    def note_places(
        self, clusters: Iterable[str] = (), archived: Iterable[str] = (), shards: Iterable[str] = ()
    ) -> None:
        """Note where the members of these places are now (after a change to them), so
        `locate_many` finds them there without a pass over the store."""
        places = self.places
        for area, keys in (("cluster", clusters), ("archive", archived), ("unsorted", shards)):
            for key in keys:
                for m in self.members(area, key):
                    places[m.id] = (area, key)

    def memory_ids(self) -> set[str]:
        ids = {
            m.id
            for area in (self.clusters, self.archived)
            for c in area.values()
            for m in c.memories
        }
        ids.update(m.id for mems in self.unsorted.values() for m in mems)
        return ids

    def content_keys(self) -> set[str]:
        """Ids and content hashes of every memory: what makes a new memory a duplicate."""
        keys: set[str] = set()
        for m, _a, _k in self.all_memories():
            keys.add(m.id)
            keys.add(memory_id(m.content, m.scope))
        return keys

    def unsorted_memories(self) -> list[Memory]:
        return [m for mems in self.unsorted.values() for m in mems]


def _check_memory(m: Memory, where: str, seen: dict[str, str], errors: list[str]) -> None:
    if not MEMORY_ID_RE.match(m.id):
        errors.append(f"{where}: invalid memory id {m.id!r}")
    elif m.id in seen:
        errors.append(f"{where}: memory {m.id} is also in {seen[m.id]}")
    else:
        seen[m.id] = where
    if not m.content.strip():
        errors.append(f"{where}: memory {m.id} has empty content")


def _load_cluster(path: Path, errors: list[str], text: str | None = None) -> Cluster | None:
    try:
        data = load_yaml_file(path) if text is None else loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a mapping")
        c = _one_line_cluster(Cluster.from_dict(data))
    except (YamlError, ValueError, KeyError, TypeError, AttributeError, OSError, BadScope) as exc:
        errors.append(f"{path.name}: {exc}")
        return None
    mixed = sorted({m.scope for m in c.memories} - {c.scope})
    if mixed:
        errors.append(
            f"{path.name}: cluster of scope {c.scope!r} holds memories of scope "
            f"{', '.join(map(repr, mixed))} (a cluster holds one scope: move them out)"
        )
        return None
    if c.id != path.stem:
        errors.append(f"{path.name}: id {c.id!r} does not match the file name")
        return None
    if not CLUSTER_ID_RE.match(c.id):
        errors.append(f"{path.name}: invalid cluster id {c.id!r}")
        return None
    return c


def _load_shard(path: Path, errors: list[str], text: str | None = None) -> list[Memory] | None:
    try:
        data = load_yaml_file(path) if text is None else loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
            raise ValueError("expected a mapping with a 'memories' list")
        return _one_line_memories([Memory.from_dict(m) for m in data["memories"]])
    except (YamlError, ValueError, KeyError, TypeError, AttributeError, OSError, BadScope) as exc:
        errors.append(f"{path.name}: {exc}")
        return None


def _one_line_cluster(c: Cluster) -> Cluster:
    """Whatever wrote the file (a hand edit, a pull, an import), no newline or control
    character of a name, description, tag or content reaches a context line or a terminal."""
    c.name, c.description = one_line(c.name), one_line(c.description)
    c.tags = [one_line(t) for t in c.tags]
    _one_line_memories(c.memories)
    return c


def _one_line_memories(mems: list[Memory]) -> list[Memory]:
    for m in mems:
        m.content = one_line(m.content)
    return mems


# a memory's YAML text as a list item, and what it was made from: (content, created_at,
# metadata as `_meta_key` gives it, text)
Fragment = tuple[str, str, str, str]


@dataclass
class FileUpdate:
    """What re-reading some store files found: per file, the new content or None (gone)."""

    clusters: dict[str, Cluster | None] = field(default_factory=dict)
    archive: dict[str, Cluster | None] = field(default_factory=dict)
    shards: dict[str, list[Memory] | None] = field(default_factory=dict)
    # with `parse_files(..., fragments=True)`: each memory's list item as its file holds
    # it, for the store's fragment cache (`Fragments.remember`)
    fragments: dict[str, Fragment] = field(default_factory=dict)


def is_data_path(rel: str) -> bool:
    """A store file that holds memories: `clusters/` or `archive/` + `<cluster id>.yaml`,
    `unsorted/` + `<shard name>.yaml`. Nothing else there is ever read or committed (an
    editor's swap file, a `*.yaml~` backup, an exported Markdown file). `status` asks it of
    every file in the memory folders, and the change watch of every event there (most of them
    the writer's own temporary dot files), so a path as git and the writer spell it
    ("area/name") is split as a string; any other spelling goes through pathlib."""
    area, sep, name = rel.partition("/")
    if not sep or "/" in name or not name or area in ("", "."):
        return _is_data_path_slow(rel)
    if name[0] == ".":  # a dot file (the writer's `.c-....yaml.tmp`, an editor's swap file)
        return False
    if area not in (CLUSTERS, ARCHIVE, UNSORTED) or not name.endswith(".yaml"):
        return False
    stem = name[:-5]
    return valid_shard_name(stem) if area == UNSORTED else bool(CLUSTER_ID_RE.match(stem))


def _is_data_path_slow(rel: str) -> bool:
    p = Path(rel)
    if len(p.parts) != 2 or p.suffix != ".yaml" or p.parts[0] not in (CLUSTERS, ARCHIVE, UNSORTED):
        return False
    if p.parts[0] == UNSORTED:
        return valid_shard_name(p.stem)
    return bool(CLUSTER_ID_RE.match(p.stem))


def data_files(root: Path) -> list[str]:
    """Every store file that holds memories, relative to the store: regular files only (a
    symlink, FIFO or hard-linked file is never read; `store/special.py`)."""
    return [
        rel
        for d in (CLUSTERS, ARCHIVE, UNSORTED)
        if (Path(root) / d).is_dir()
        for f in sorted((Path(root) / d).glob("*.yaml"))
        if is_data_path(rel := f"{d}/{f.name}") and special_kind(f) is None
    ]


# the name of a cluster file (`is_data_path` of "clusters/" or "archive/" + it), checked in
# one call: `status` lists those folders again after every change to them (11k names: 12 ms
# through `is_data_path`, 2 ms so)
CLUSTER_FILE_RE = re.compile(CLUSTER_ID_RE.pattern.removeprefix("^").removesuffix("$") + r"\.yaml")

# a folder changed this recently is listed every time: two changes within one tick of the
# kernel's coarse file clock (at most 10 ms) leave the same mtime (git's "racy" case)
IGNORED_RACY_NS = 100_000_000


class IgnoredFiles:
    """The files in one store's memory folders that are not memory files (ignored; listed in
    status). `status` asks on every call, and clients poll it: at 100k memories, listing and
    checking 2,000 cluster files was ~2 ms of the daemon's GIL per call, so a folder is
    listed again only when an entry was added, removed or renamed in it since (each changes
    the folder's mtime). One per store (the engine's): stores never share what was seen."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # folder -> ((inode, mtime_ns), its ignored files)
        self._seen: dict[str, tuple[tuple[int, int], list[str]]] = {}

    def files(self, limit: int = 50) -> list[str]:
        out: list[str] = []
        for d in (CLUSTERS, ARCHIVE, UNSORTED):
            found = self._listed(d)
            out.extend(found[: limit - len(out)])
            if len(out) >= limit:
                break
        return out

    def _listed(self, d: str) -> list[str]:
        folder = os.path.join(self.root, d)
        try:
            st = os.stat(folder)
        except OSError:
            return []
        key = (st.st_ino, st.st_mtime_ns)
        got = self._seen.get(folder)
        if got is not None and got[0] == key:
            return got[1]
        try:
            names = os.listdir(folder)
        except OSError:
            return []
        plain = CLUSTER_FILE_RE.fullmatch if d != UNSORTED else None
        found = sorted(
            f"{d}/{name}"
            for name in names
            if not (plain is not None and plain(name))  # a cluster file: one regex call
            and name != ".gitkeep"
            and not is_data_path(f"{d}/{name}")
        )
        if time.time_ns() - st.st_mtime_ns > IGNORED_RACY_NS:
            self._seen[folder] = (key, found)
        else:
            self._seen.pop(folder, None)
        return found


def ignored_files(root: Path, limit: int = 50) -> list[str]:
    """The ignored files of the store at `root`, listed now (see `IgnoredFiles`)."""
    return IgnoredFiles(root).files(limit)


def read_files(
    root: Path, base: StoreState, rel_paths: list[str], texts: dict[str, str] | None = None
) -> tuple[StoreState, FileUpdate]:
    """`base` with the given files re-read from the working tree (a missing file is a
    removal); `base` itself is not modified. Raises StoreError naming every problem: broken
    files, bad ids, a memory in two places. So a broken hand edit is reported whole, and
    nothing half-read is ever served."""
    errors: list[str] = []
    upd = parse_files(root, rel_paths, errors, texts)
    return apply_update(base, upd, errors), upd


def parse_files(
    root: Path,
    rel_paths: list[str],
    errors: list[str],
    texts: dict[str, str] | None = None,
    fragments: bool = False,
) -> FileUpdate:
    """Parse each given store file on its own (no check across files); problems are added
    to `errors`. Paths that are not store data files are skipped. `texts`: the files'
    contents as a commit holds them (a path not in it is absent), instead of the working
    tree, which a person's git command may be rewriting. `fragments`: also keep each hot
    memory's list item as its file's text holds it (`FileUpdate.fragments`)."""
    paths = Paths(Path(root))
    upd = FileUpdate()
    for rel in rel_paths:
        p = Path(rel)
        if not is_data_path(rel):
            continue  # not a memory file: ignored (listed in status)
        full = paths.root / p
        text = texts.get(rel) if texts is not None else None
        there = rel in texts if texts is not None else os.path.lexists(full)
        kind = special_kind(full) if there and texts is None else None
        if kind is not None:
            errors.append(not_regular(rel, kind))  # never opened: a FIFO would block
            continue
        if there and fragments and text is None and p.parts[0] != ARCHIVE:
            try:
                text = full.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                text = None  # read again below, which says what is wrong
        if p.parts[0] == UNSORTED:
            shard = _load_shard(full, errors, text) if there else None
            upd.shards[p.stem] = shard
            mems = shard
        else:
            target = upd.clusters if p.parts[0] == CLUSTERS else upd.archive
            cluster = _load_cluster(full, errors, text) if there else None
            target[p.stem] = cluster
            mems = cluster.memories if cluster is not None else None
        if fragments and mems and text is not None and p.parts[0] != ARCHIVE:
            _file_fragments(text, mems, upd.fragments)
    return upd


def _file_fragments(text: str, mems: list[Memory], out: dict[str, Fragment]) -> None:
    items = block_list_texts(text, "memories", len(mems))
    if items is None:
        return  # not laid out as clagd writes a file: dumped again when it is rewritten
    for m, item in zip(mems, items):
        out[m.id] = (m.content, m.created_at, _meta_key(m), item)


def apply_update(base: StoreState, upd: FileUpdate, errors: list[str]) -> StoreState:
    """`base` with the parsed files in place, checked as a whole (ids, a memory in two
    places, a cluster both hot and archived); raises StoreError naming every problem found
    here or already in `errors`."""
    state = StoreState(dict(base.clusters), dict(base.archived), dict(base.unsorted))
    state.places = base.places  # hints only (`locate_many` checks each): shared
    for area, repl in ((state.clusters, upd.clusters), (state.archived, upd.archive)):
        for k, v in repl.items():
            if v is None:
                area.pop(k, None)
            else:
                area[k] = v
    for name, mems in upd.shards.items():
        if mems is None:
            state.unsorted.pop(name, None)
        else:
            state.unsorted[name] = mems
    seen: dict[str, str] = {}
    for m, area_name, key in state.all_memories():
        _check_memory(m, f"{area_name}/{key}", seen, errors)
    for cid in set(state.clusters) & set(state.archived):
        errors.append(f"cluster {cid} is both hot and archived")
    if errors:
        raise StoreError("invalid store: " + "; ".join(errors[:20]))
    return state


def files_pass_checks(upd: FileUpdate) -> bool:
    """Whether the memories of these files pass `apply_update`'s checks among themselves
    (valid ids, content, no id twice). A store loaded in parts checks each part where it
    was parsed; `merge_loaded` then checks only what lies across the parts."""
    seen: dict[str, str] = {}
    errors: list[str] = []
    state = StoreState(
        {k: v for k, v in upd.clusters.items() if v is not None},
        {k: v for k, v in upd.archive.items() if v is not None},
        {k: v for k, v in upd.shards.items() if v is not None},
    )
    for m, area_name, key in state.all_memories():
        _check_memory(m, f"{area_name}/{key}", seen, errors)
    return not errors


def merge_loaded(updates: Iterable[FileUpdate], errors: list[str], checked: bool) -> StoreState:
    """The state of a store read from nothing but these parts' files, checked as a whole
    like `apply_update` (raises StoreError naming every problem). `checked`: every part
    passed `files_pass_checks` and `errors` is empty; then only the ids across the parts
    and the clusters both hot and archived are checked here, and when anything is wrong
    `apply_update` runs to name it."""
    merged = FileUpdate()
    for u in updates:
        merged.clusters.update(u.clusters)
        merged.archive.update(u.archive)
        merged.shards.update(u.shards)
    if checked and not errors:
        state = StoreState(
            {k: v for k, v in merged.clusters.items() if v is not None},
            {k: v for k, v in merged.archive.items() if v is not None},
            {k: v for k, v in merged.shards.items() if v is not None},
        )
        ids = [m.id for m, _a, _k in state.all_memories()]
        if len(set(ids)) == len(ids) and not state.clusters.keys() & state.archived.keys():
            return state
    return apply_update(StoreState(), merged, errors)


def memories_in(state: StoreState, rel_paths: Iterable[str]) -> Iterator[Memory]:
    """The memories `state` holds in these store files (other paths are skipped)."""
    for rel in rel_paths:
        p = Path(rel)
        if not is_data_path(rel):
            continue
        if p.parts[0] == UNSORTED:
            yield from state.unsorted.get(p.stem, [])
        else:
            area = state.clusters if p.parts[0] == CLUSTERS else state.archived
            c = area.get(p.stem)
            if c is not None:
                yield from c.memories


def load_state(root: Path) -> StoreState:
    """Read every cluster, archived cluster and unsorted shard (see `read_files`)."""
    return read_files(root, StoreState(), data_files(root))[0]


def _meta_key(m: Memory) -> str:
    return json.dumps(m.metadata, sort_keys=True, default=str) if m.metadata else ""


class Fragments:
    """The YAML text of each memory as a list item, reused while the memory is unchanged: a
    cluster file is rewritten whole when one memory joins it, and dumping every member again
    dominated the cost of ingest. The output is byte-identical to dumping the whole file.
    One per store (the engine's, lent to its writer): stores never share texts."""

    MAX = 400_000  # memories' texts kept; beyond it the cache starts again

    def __init__(self, limit: int = MAX) -> None:
        self.limit = limit
        self._items: dict[str, Fragment] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, mid: str) -> Fragment | None:
        return self._items.get(mid)

    def clear(self) -> None:
        """Forget every text (after a history rewrite: none of the removed may stay)."""
        self._items.clear()

    def drop(self, mids: set[str]) -> None:
        """Forget these memories' texts (they were forgotten)."""
        for mid in mids:
            self._items.pop(mid, None)

    def remember(self, fragments: dict[str, Fragment]) -> None:
        """Take the list items that store files hold as they are (`parse_files(...,
        fragments=True)`): after a start from the files, a cluster file that one routed
        memory joins is then rewritten from its own text, not dumped again whole. The
        file's text of a memory is what dumping it gave when clagd wrote it; for a file a
        person wrote another way, text that parses to the same memory."""
        if len(self._items) + len(fragments) > self.limit:
            self._items.clear()
            if len(fragments) > self.limit:
                return
        self._items.update(fragments)

    def texts(self, mems: list[Memory]) -> list[str]:
        """Each memory's list item, from the cache or dumped; the misses (all of a cluster's
        memories after a start from the YAML files) in one dump (`yamlio.list_items`)."""
        metas = [_meta_key(m) for m in mems]
        out = [self._cached(m, meta) for m, meta in zip(mems, metas)]
        miss = [i for i, text in enumerate(out) if text is None]
        if not miss:
            return out  # type: ignore[return-value]
        dumped = list_items([mems[i].to_dict() for i in miss])
        if dumped is None:  # cannot happen for block lists; the slow, sure way all the same
            dumped = [dumps([mems[i].to_dict()]) for i in miss]
        if len(self._items) + len(miss) > self.limit:
            self._items.clear()
        for i, text in zip(miss, dumped):
            m = mems[i]
            self._items[m.id] = (m.content, m.created_at, metas[i], text)
            out[i] = text
        return out  # type: ignore[return-value]

    def _cached(self, m: Memory, meta: str) -> str | None:
        hit = self._items.get(m.id)
        if hit is not None and hit[0] == m.content and hit[1] == m.created_at and hit[2] == meta:
            return hit[3]
        return None


def _memories_yaml(head: dict, mems: list[Memory], fragments: Fragments | None) -> str:
    if not mems:
        return dumps({**head, "memories": []})
    items = (fragments if fragments is not None else Fragments()).texts(mems)
    return (dumps(head) if head else "") + "memories:\n" + "".join(items)


def cluster_yaml(c: Cluster, fragments: Fragments | None = None) -> str:
    """A cluster file's text; `fragments`: the store's cache of its memories' texts."""
    d = c.to_dict()
    d.pop("memories")
    return _memories_yaml(d, c.memories, fragments)


def write_cluster(paths: Paths, c: Cluster, archived: bool = False, fsync: bool = True) -> Path:
    path = paths.cluster_file(c.id, archived)
    atomic_write_text(path, cluster_yaml(c), sync_dir=False, fsync=fsync)
    return path


def shard_yaml(mems: list[Memory], fragments: Fragments | None = None) -> str:
    """An unsorted shard's text; `fragments` as for `cluster_yaml`."""
    return _memories_yaml({}, mems, fragments)


def write_shard(paths: Paths, name: str, mems: list[Memory], fsync: bool = True) -> Path:
    path = paths.shard_file(name)
    atomic_write_text(path, shard_yaml(mems), sync_dir=False, fsync=fsync)
    return path
