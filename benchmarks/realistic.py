"""A store shaped the way the daemon shapes one (issue 26): memories arrive in bursts (a
conversation, a task: turns seconds apart, bursts hours apart) and the lexical organizer,
with its own settings (`session.target_cluster_size`, the episode gap), makes the clusters.
About 12 memories a cluster: ~8,000 clusters at 100k, where `bench_scale`'s old store has
runs of 50 (2,000 clusters).

The organizer runs in process on consecutive windows of bursts (`organize.lexical.organize`,
the code path a session takes for unsorted memories), which keeps 100k to minutes; the
clusters it makes are written as cluster files and committed once.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory, new_cluster_id, normalize_content, parse_epoch
from clagd.organize.lexical import organize
from clagd.store.files import Paths, write_cluster

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WINDOW = 600  # memories organized together (a few sessions' worth of bursts)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def bursts(texts: list[str], seed: int = 3) -> list[Memory]:
    """The texts as memories in bursts of 5 to 60 turns 5-40 s apart, 1-20 h between
    bursts."""
    rnd = random.Random(seed)
    out: list[Memory] = []
    t = T0
    i = 0
    while i < len(texts):
        n = rnd.randint(5, 60)
        for x in texts[i : i + n]:
            out.append(Memory.new(x, stamp(t)))
            t += timedelta(seconds=rnd.randint(5, 40))
        i += n
        t += timedelta(hours=rnd.uniform(1, 20))
    return out


def realistic_clusters(texts: list[str], cfg: SessionConfig | None = None) -> list[Cluster]:
    """The clusters the lexical organizer makes of these texts arriving in bursts."""
    cfg = cfg or SessionConfig()
    mems = bursts(texts)
    out: list[Cluster] = []
    names: set[str] = set()  # distinct across windows, as sessions keep them
    for w in range(0, len(mems), WINDOW):
        chunk = mems[w : w + WINDOW]
        by_id = {m.id: m for m in chunk}
        plan = organize(chunk, [], cfg, now=chunk[-1].created_at, other_names=names)
        members: dict[str, list[Memory]] = {}
        for mid, ref in plan.assign.items():
            members.setdefault(ref, []).append(by_id[mid])
        for pc in plan.clusters:
            ms = members.get(pc.ref)
            if ms:
                names.add(pc.name)
                at = ms[-1].created_at
                out.append(
                    Cluster(new_cluster_id(), pc.name, pc.description, list(pc.tags), at, at, ms)
                )
    return out


def write_realistic(store: Path, texts: list[str]) -> int:
    """Write the realistic clusters of `texts` into `store`'s cluster files (not committed);
    returns how many."""
    paths = Paths(store)
    clusters = realistic_clusters(texts)
    for c in clusters:
        write_cluster(paths, c)
    return len(clusters)


def seed_store(store: Path, n: int, seed: int = 1) -> list[str]:
    """Commit a realistic store of `n` memories (LoCoMo turns recombined, `corpus.py`) into
    `store` before a daemon starts, as the harnesses do with `--realistic N`; returns the
    memories' texts as stored (normalized), each of which must stay in HEAD exactly once."""
    import subprocess

    from corpus import memories

    texts = memories(n, seed)
    k = write_realistic(store, texts)
    for args in (["add", "-A", "clusters"], ["commit", "-qm", f"bench: {k} realistic clusters"]):
        subprocess.run(["git", *args], cwd=store, check=True, capture_output=True)
    return [normalize_content(t) for t in texts]


def cold_days(texts: list[str], layout: str, share: float) -> float:
    """An `archive.cold_after_days` that makes about `share` of the store cold (the oldest
    memories, so about that share of the clusters), so the archive job has real work but
    not the whole store: the bench's memories are dated from 2024 on."""
    if layout == "realistic":
        times = sorted(parse_epoch(m.created_at) or 0.0 for m in bursts(texts))
    else:  # runs50 (bench_scale.build_store): memory i of run k at k * 50 h + 10 i s
        times = [T0.timestamp() + 3600 * 50 * (i // 50) + 10 * (i % 50) for i in range(len(texts))]
    cut = times[max(0, int(len(times) * share) - 1)]
    return (time.time() - cut) / 86400 - 0.01
