"""Loading a whole store from its YAML files (a first start, or a start without a usable
snapshot): the files are parsed and their memories tokenized in parallel processes when the
store is large, indexed share by share in this process, then checked as a whole.

Parsing YAML and tokenizing text are CPU work that holds the GIL, so threads would not help;
each worker process takes a share of the files (balanced by size) and returns the parsed
clusters plus every memory's terms as ids into its own small vocabulary, which this process
maps onto the index's vocabulary with a single numpy lookup. This process loads and indexes
its own share while the workers parse theirs, then adds each worker's share to the index
(`Index.apply` with the given terms). A worker that fails (it cannot start, it dies) costs
nothing but time: its share is loaded here instead.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clagd.config import Config
from clagd.retrieval.index import Index
from clagd.store.files import (
    CLUSTERS,
    UNSORTED,
    FileUpdate,
    StoreState,
    apply_update,
    data_files,
    parse_files,
)
from clagd.text import word_terms, words

log = logging.getLogger(__name__)

# below this many bytes of YAML a second process costs more than it saves (starting a Python
# process and importing numpy/yaml takes ~0.3 s; parsing and tokenizing ~1 MB takes ~0.15 s)
PARALLEL_MIN_BYTES = 4 << 20
MAX_WORKERS = 4


@dataclass
class Part:
    """One share of the files: what they hold, and their indexed memories' terms."""

    update: FileUpdate = field(default_factory=FileUpdate)
    errors: list[str] = field(default_factory=list)
    vocab: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # memory ids, in the order of `lengths`
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    terms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))


@dataclass
class Loaded:
    state: StoreState
    index: Index
    workers: int = 1


def load_part(root: str, rel_paths: list[str], stem: bool, stopwords: bool) -> Part:
    """Parse these files and tokenize the memories that go into the hot index (clusters and
    unsorted shards; archived clusters are indexed only when searched)."""
    with _gc_paused():
        part = Part()
        part.update = parse_files(Path(root), rel_paths, part.errors)
        vocab: dict[str, int] = {}
        word_id: dict[str, int] = {}  # word -> local term id, -1 when the word is dropped
        get = word_id.get
        ids: list[int | None] = []
        counts: list[int] = []
        groups = [c.memories for c in part.update.clusters.values() if c is not None]
        groups += [ms for ms in part.update.shards.values() if ms is not None]
        for mems in groups:
            for m in mems:
                ws = words(m.content)
                got = list(map(get, ws))
                if None in got:  # words not seen yet in this part
                    for i, t in enumerate(word_terms(ws, stem, stopwords)):
                        if got[i] is None:
                            got[i] = word_id[ws[i]] = vocab.setdefault(t, len(vocab)) if t else -1
                ids.extend(got)
                counts.append(len(got))
                part.ids.append(m.id)
        raw = np.asarray(ids, dtype=np.int32)
        keep = raw >= 0
        kept = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        part.lengths = np.diff(kept[ends], prepend=0)
        part.terms = raw[keep]
        part.vocab = list(vocab)
        return part


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while loading: the load allocates millions of containers and holds on to
    all of them, so every collection would scan a growing heap for nothing (~10% of it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# the weight of the share this process loads itself, relative to a worker's: it also indexes
# its share while the workers parse theirs, but a worker also starts Python, imports, and
# pickles its result (which this process then unpickles); 0.9 measured best at 100k memories
# on 2 CPUs (3.5 s; 1.25: 3.8 s, 0.75: 3.85 s, 0.6: 4.1 s)
OWN_SHARE_WEIGHT = 0.9


def _shares(root: Path, rels: list[str], n: int) -> list[list[str]]:
    """`rels` in `n` shares balanced by size in bytes (largest files first, each to the
    least loaded share); the first share, loaded by this process, weighs OWN_SHARE_WEIGHT."""
    sizes = []
    for rel in rels:
        try:
            sizes.append((os.path.getsize(root / rel), rel))
        except OSError:
            sizes.append((0, rel))
    shares: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    weight = [OWN_SHARE_WEIGHT] + [1.0] * (n - 1)
    for size, rel in sorted(sizes, reverse=True):
        i = min(range(n), key=lambda j: (load[j] + size) / weight[j])
        shares[i].append(rel)
        load[i] += size
    return shares


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_store(root: Path, config: Config | None = None, workers: int = 0) -> Loaded:
    """Every data file of the store, parsed, indexed and checked (`store.apply_update`:
    raises StoreError naming every problem). `config` is the store's Config, for the index
    (None: the defaults). `workers` 0 = as many processes as there are CPUs (at
    most MAX_WORKERS) when the store is large enough to gain from it, 1 = this one only."""
    with _gc_paused():
        return _load_store(Path(root), config, workers)


def _load_store(root: Path, config: Config | None, workers: int) -> Loaded:
    index = Index.for_config(config) if config is not None else Index()
    stem, stopwords = index.cfg.stemmer, index.cfg.stopwords
    rels = data_files(root)
    if workers <= 0:
        total = 0
        for rel in rels:
            if rel.startswith((CLUSTERS + "/", UNSORTED + "/")):
                try:
                    total += os.path.getsize(root / rel)
                except OSError:
                    pass
        workers = min(_cpus(), MAX_WORKERS) if total >= PARALLEL_MIN_BYTES else 1
    shares = _shares(root, rels, workers) if workers > 1 else [rels]
    futures: list[Future[Part] | None] = [None] * (len(shares) - 1)
    pool: ProcessPoolExecutor | None = None
    if len(shares) > 1:
        # spawn, not fork: the daemon may already run threads (a forked child could inherit
        # a lock some other thread held)
        try:
            pool = ProcessPoolExecutor(
                max_workers=len(shares) - 1, mp_context=multiprocessing.get_context("spawn")
            )
            for i, share in enumerate(shares[1:]):
                futures[i] = pool.submit(load_part, str(root), share, stem, stopwords)
        except (OSError, RuntimeError) as exc:
            log.warning("start-up: no loader processes (%s); loading in this one", exc)
    parts = [load_part(str(root), shares[0], stem, stopwords)]
    index = _add(index, parts[0])
    for share, fut in zip(shares[1:], futures):
        part = None
        if fut is not None:
            try:
                part = fut.result()
            except Exception as exc:  # noqa: BLE001 - a broken worker: do its share here
                log.warning("start-up: a loader process failed (%s); loading its share here", exc)
        if part is None:
            part = load_part(str(root), share, stem, stopwords)
        parts.append(part)
        index = _add(index, part)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)

    merged = FileUpdate()
    errors: list[str] = []
    for p in parts:
        merged.clusters.update(p.update.clusters)
        merged.archive.update(p.update.archive)
        merged.shards.update(p.update.shards)
        errors.extend(p.errors)
    return Loaded(apply_update(StoreState(), merged, errors), index, workers=len(shares))


def _add(index: Index, part: Part) -> Index:
    """`index` with the hot clusters and unsorted memories of this part, from its terms."""
    vocab = index.vocab
    gmap = np.fromiter(
        (vocab.setdefault(t, len(vocab)) for t in part.vocab), dtype=np.int32, count=len(part.vocab)
    )
    gids = gmap[part.terms] if len(part.terms) else part.terms
    bounds = np.zeros(len(part.lengths) + 1, dtype=np.int64)
    np.cumsum(part.lengths, out=bounds[1:])
    terms = {mid: gids[bounds[i] : bounds[i + 1]] for i, mid in enumerate(part.ids)}
    return index.apply(
        upsert_clusters=[c for c in part.update.clusters.values() if c is not None],
        add_unsorted=[m for ms in part.update.shards.values() if ms is not None for m in ms],
        terms=terms,
    )
