"""Loading a whole store from its YAML files (a first start, or a start without a usable
snapshot): the files are parsed and their memories prepared for the index in parallel
processes when the store is large, the index is built once from all of it, and the state is
checked as a whole.

Parsing YAML and tokenizing text are CPU work that holds the GIL, so threads would not help.
The files are cut into runs (chunks); worker processes take chunks from the first on while
this process takes them from the last on, so they meet wherever the machine's load puts
them, and the chunks are smallest around there, so none waits long for the others. For each
chunk a process parses the files and prepares the index's arrays (`retrieval.bulk.prepare`:
term ids in the chunk's own small vocabulary, counted per memory and per cluster, times,
chains), which are cheap to send back; this process then checks the whole state and builds
the index once from every chunk's arrays (`retrieval.bulk.build`), in the files' order. A
worker that fails (it cannot start, it dies) costs nothing but time: its chunks are loaded
here instead.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from clagd.config import Config
from clagd.libc import die_with_parent
from clagd.retrieval.bulk import Prepared, build, prepare
from clagd.retrieval.index import Index
from clagd.store.files import (
    CLUSTERS,
    UNSORTED,
    FileUpdate,
    Fragments,
    StoreState,
    data_files,
    files_pass_checks,
    merge_loaded,
    parse_files,
)
from clagd.store.lock import close_inherited

log = logging.getLogger(__name__)

# below this many bytes of YAML a second process costs more than it saves (starting a Python
# process and importing numpy/yaml takes ~0.3 s; parsing and preparing ~1 MB takes ~0.1 s)
PARALLEL_MIN_BYTES = 4 << 20
MAX_WORKERS = 4
# The smallest chunk of files, around where the processes are expected to meet; farther away
# a chunk is a quarter of its distance from there. A process that finds no chunk left waits
# for the chunk a worker is on and the one queued for it after that, so those are small,
# while the far ones are large, which costs less to send.
MIN_CHUNK_BYTES = 256 << 10


@dataclass
class Part:
    """One chunk of the files: what they hold, and their memories prepared for the index."""

    update: FileUpdate = field(default_factory=FileUpdate)
    errors: list[str] = field(default_factory=list)
    checked: bool = False  # its memories pass the store's checks among themselves
    prepared: Prepared = field(default_factory=Prepared)


@dataclass
class Loaded:
    state: StoreState
    index: Index
    workers: int = 1


def load_part(root: str, rel_paths: list[str], stem: bool, stopwords: bool) -> Part:
    """Parse these files and prepare the memories that go into the hot index (clusters and
    unsorted shards; archived clusters are indexed only when searched)."""
    with gc_paused():
        part = Part()
        part.update = parse_files(Path(root), rel_paths, part.errors, fragments=True)
        part.checked = files_pass_checks(part.update)
        clusters = [c for c in part.update.clusters.values() if c is not None]
        unsorted = [m for ms in part.update.shards.values() if ms is not None for m in ms]
        part.prepared = prepare(clusters, unsorted, stem, stopwords)
        return part


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while loading: the load allocates millions of containers and holds on to
    all of them, so every collection would scan a growing heap for nothing (~10% of it;
    for the engine's whole start, `Engine.__init__`, 0.3-0.9 s of 1.3-2.2 s at 100k)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _sizes(root: Path, rels: list[str]) -> list[int]:
    out = []
    for rel in rels:
        try:
            out.append(os.path.getsize(root / rel))
        except OSError:
            out.append(0)
    return out


def _chunks(rels: list[str], sizes: list[int], procs: int) -> list[list[str]]:
    """`rels` cut into runs, in order, for `procs` processes: the workers take runs from
    the first on, this process from the last on. It starts first and meets them a little
    past its share: runs are smallest from a bit before that point to a bit after, and
    grow with the distance from there."""
    total = sum(sizes)
    meet = total * (procs - 1) / procs
    lo, hi = meet - 0.2 * total, meet + 0.05 * total
    least = min(MIN_CHUNK_BYTES, total / (4 * procs))  # a small store: still 4 per process
    chunks: list[list[str]] = [[]]
    start = done = 0
    for rel, size in zip(rels, sizes):
        target = max(least, (lo - start) / 4, (start - hi) / 4)
        if chunks[-1] and done - start >= target:
            chunks.append([])
            start = done
        chunks[-1].append(rel)
        done += size
    return chunks


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_store(
    root: Path,
    config: Config | None = None,
    workers: int = 0,
    fragments: Fragments | None = None,
) -> Loaded:
    """Every data file of the store, parsed, indexed and checked (`store.apply_update`:
    raises StoreError naming every problem). `config` is the store's Config, for the index
    (None: the defaults). `workers` 0 = as many processes as there are CPUs (at
    most MAX_WORKERS) when the store is large enough to gain from it, 1 = this one only.
    `fragments`: the store's cache of its memories' file texts, given the files' own."""
    with gc_paused():
        return _load_store(Path(root), config, workers, fragments)


def _load_store(
    root: Path, config: Config | None, workers: int, fragments: Fragments | None
) -> Loaded:
    settings = Index.for_config(config) if config is not None else Index()
    rels = data_files(root)
    sizes = _sizes(root, rels)
    if workers <= 0:
        hot = sum(s for r, s in zip(rels, sizes) if r.startswith((CLUSTERS + "/", UNSORTED + "/")))
        workers = min(_cpus(), MAX_WORKERS) if hot >= PARALLEL_MIN_BYTES else 1
    chunks = _chunks(rels, sizes, workers) if workers > 1 else [rels]
    parts = _load_parts(root, chunks, workers - 1, settings.cfg.stemmer, settings.cfg.stopwords)
    errors = [e for p in parts for e in p.errors]
    checked = all(p.checked for p in parts)
    state = merge_loaded([p.update for p in parts], errors, checked)
    for p in parts:
        if fragments is not None:
            fragments.remember(p.update.fragments)
        p.update.fragments = {}
    index = build([p.prepared for p in parts], settings.cfg, settings.ingest)
    return Loaded(state, index, workers=workers)


def _start_method() -> multiprocessing.context.BaseContext:
    """fork while this process runs no other thread: a forked worker starts at once (a
    spawned one starts Python and imports numpy and clagd first, 0.3-0.5 s, while this
    process loads alone). With other threads, spawn: a forked child could inherit a lock
    some other thread held."""
    alone = threading.active_count() == 1
    return multiprocessing.get_context("fork" if alone and os.name == "posix" else "spawn")


def _worker_started(daemon: int) -> None:
    """A loader process ends with the daemon and holds none of its locks: one that outlived
    a killed daemon went on parsing, and, forked, held the store lock, so a restart found
    "another clagd daemon (pid N) is running" for a pid that was gone."""
    close_inherited()
    die_with_parent(daemon)


def _load_parts(
    root: Path, chunks: list[list[str]], procs: int, stem: bool, stopwords: bool
) -> list[Part]:
    """Every chunk loaded, by `procs` worker processes from the first chunk on and by this
    one from the last chunk on; a chunk whose worker failed is loaded here."""
    futures: list[Future[Part] | None] = [None] * len(chunks)
    pool: ProcessPoolExecutor | None = None
    if procs > 0 and len(chunks) > 1:
        try:
            pool = ProcessPoolExecutor(
                max_workers=procs,
                mp_context=_start_method(),
                initializer=_worker_started,
                initargs=(os.getpid(),),
            )
            futures = [pool.submit(load_part, str(root), c, stem, stopwords) for c in chunks]
        except (OSError, RuntimeError) as exc:
            log.warning("start-up: no loader processes (%s); loading in this one", exc)
    parts: list[Part | None] = [None] * len(chunks)
    for i in reversed(range(len(chunks))):
        fut = futures[i]
        if fut is not None and not fut.cancel():
            break  # a worker has it (or had it): from here on, the workers' chunks
        parts[i] = load_part(str(root), chunks[i], stem, stopwords)
    failed = False
    for i, fut in enumerate(futures):
        if parts[i] is None and fut is not None:
            try:
                parts[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a broken worker: do its chunk here
                if not failed:
                    log.warning("start-up: a loader process failed (%s); loading here", exc)
                failed = True
        if parts[i] is None:
            parts[i] = load_part(str(root), chunks[i], stem, stopwords)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    return [p for p in parts if p is not None]
