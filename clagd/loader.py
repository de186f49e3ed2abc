"""Loading a whole store from its YAML files (a first start, or a start without a usable
snapshot): the files are parsed and their memories tokenized in parallel processes when the
store is large, then checked as a whole and indexed in this process.

Parsing YAML and tokenizing text are CPU work that holds the GIL, so threads would not help;
each worker process takes a share of the files (balanced by size) and returns the parsed
clusters plus every memory's terms as ids into its own small vocabulary, which this process
maps onto one vocabulary with a single numpy lookup. A worker that fails (it cannot start,
it dies) costs nothing but time: its share is loaded here instead.
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

from .store import CLUSTERS, UNSORTED, FileUpdate, StoreState, apply_update, data_files, parse_files
from .text import word_terms, words

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
    vocab: dict[str, int]
    terms: dict[str, np.ndarray]  # memory id -> its term ids in `vocab`, in text order
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


# the share this process loads itself is this much larger than a worker's: a worker also
# starts Python, imports, and pickles its result, which this process then unpickles
OWN_SHARE_WEIGHT = 1.25


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


def load_store(root: Path, stem: bool = True, stopwords: bool = True, workers: int = 0) -> Loaded:
    """Every data file of the store, parsed, checked (`store.apply_update`: raises
    StoreError naming every problem) and tokenized. `workers` 0 = as many as there are CPUs
    (at most MAX_WORKERS) when the store is large enough to gain from it, 1 = this process
    only."""
    with _gc_paused():
        return _load_store(Path(root), stem, stopwords, workers)


def _load_store(root: Path, stem: bool, stopwords: bool, workers: int) -> Loaded:
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
    parts: list[Part] = []
    if len(shares) > 1:
        # spawn, not fork: the daemon may already run threads (a forked child could inherit
        # a lock some other thread held)
        ctx = multiprocessing.get_context("spawn")
        futures: list[Future[Part] | None] = [None] * (len(shares) - 1)
        pool: ProcessPoolExecutor | None = None
        try:
            pool = ProcessPoolExecutor(max_workers=len(shares) - 1, mp_context=ctx)
            for i, share in enumerate(shares[1:]):
                futures[i] = pool.submit(load_part, str(root), share, stem, stopwords)
        except (OSError, RuntimeError) as exc:
            log.warning("start-up: no loader processes (%s); loading in this one", exc)
        parts.append(load_part(str(root), shares[0], stem, stopwords))
        for share, fut in zip(shares[1:], futures):
            if fut is not None:
                try:
                    parts.append(fut.result())
                    continue
                except Exception as exc:  # noqa: BLE001 - a broken worker: do its share here
                    log.warning(
                        "start-up: a loader process failed (%s); loading its share here", exc
                    )
            parts.append(load_part(str(root), share, stem, stopwords))
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    else:
        parts.append(load_part(str(root), rels, stem, stopwords))

    merged = FileUpdate()
    errors: list[str] = []
    for p in parts:
        merged.clusters.update(p.update.clusters)
        merged.archive.update(p.update.archive)
        merged.shards.update(p.update.shards)
        errors.extend(p.errors)
    state = apply_update(StoreState(), merged, errors)

    vocab: dict[str, int] = {}
    terms: dict[str, np.ndarray] = {}
    for p in parts:
        gmap = np.fromiter(
            (vocab.setdefault(t, len(vocab)) for t in p.vocab), dtype=np.int32, count=len(p.vocab)
        )
        gids = gmap[p.terms] if len(p.terms) else p.terms
        bounds = np.zeros(len(p.lengths) + 1, dtype=np.int64)
        np.cumsum(p.lengths, out=bounds[1:])
        for i, mid in enumerate(p.ids):
            terms[mid] = gids[bounds[i] : bounds[i + 1]]
    return Loaded(state, vocab, terms, workers=len(shares))
