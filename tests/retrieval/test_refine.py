"""SLM refinement of the cluster choice, with the real `ollama` client against the loopback
fake Ollama server: a good pick, a timeout, garbage, a dead server; all fall back cleanly."""

from __future__ import annotations

import time

import pytest
from fake_ollama import FakeOllama, delay, invalid_json

from clagd.config import OllamaConfig, RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.retrieval.refine import Refiner
from clagd.slm.ollama import OllamaBackend

TOPICS = {
    "c-00000001": ("Hiking Trips", "hiking trail mountain boots"),
    "c-00000002": ("Trail Running", "running trail race shoes"),
    "c-00000003": ("Garden Work", "garden trail tomatoes soil"),
    "c-00000004": ("Camping Gear", "camping tent trail stove"),
    "c-00000005": ("Mountain Bikes", "bike trail mountain wheels"),
    "c-00000006": ("Dog Walks", "dog walk trail park leash"),
}


def _index(cfg: RetrievalConfig) -> Index:
    clusters = {}
    for n, (cid, (name, words)) in enumerate(TOPICS.items()):
        mems = [
            Memory.new(f"{words} note {i} {n}", f"2024-01-0{1 + n}T10:00:{10 + i}Z")
            for i in range(3)
        ]
        clusters[cid] = Cluster(cid, name, f"Notes on {name.lower()}.", ["outdoors"], memories=mems)
    return Index.build(clusters, [], cfg)


CFG = RetrievalConfig(
    top_clusters=2, slm_refine=True, slm_refine_candidates=6, slm_refine_timeout=1.0
)


def _refiner(srv: FakeOllama, **kw: object) -> Refiner:
    backend = OllamaBackend(OllamaConfig(host=srv.url))
    return Refiner(lambda: backend, CFG, **kw)  # type: ignore[arg-type]


def test_the_slm_picks_among_enumerated_candidates(fake: FakeOllama) -> None:
    ix = _index(CFG)
    lexical = ix.search("trail notes")
    cands = ix.cluster_candidates("trail notes", CFG.slm_refine_candidates)
    assert len(cands) == 6
    # the model picks the candidate listed last ("C6") and then the fourth
    fake.script.append({"content": {"clusters": ["C6", "C4"]}})
    ref = _refiner(fake)
    chosen = ref.choose(ix, "trail notes")
    assert chosen == [cands[5][0], cands[3][0]]
    schema = fake.chats[-1]["format"]
    assert schema["properties"]["clusters"]["items"]["enum"] == [f"C{i}" for i in range(1, 7)]
    assert schema["properties"]["clusters"]["maxItems"] == 2
    assert fake.chats[-1]["options"]["temperature"] == pytest.approx(0.1)
    res = ix.search("trail notes", clusters=chosen)
    assert [c[0] for c in res.clusters] == chosen
    assert [c[0] for c in res.clusters] != [c[0] for c in lexical.clusters]
    assert ref.counts["refined"] == 1


def test_a_slow_model_times_out_and_falls_back(fake: FakeOllama) -> None:
    ix = _index(CFG)
    fake.script.append(delay(3.0, {"content": {"clusters": ["C1"]}}))
    ref = _refiner(fake)
    t0 = time.monotonic()
    assert ref.choose(ix, "trail notes") is None
    assert time.monotonic() - t0 < 2.5
    assert ref.counts["fallback_timeout"] == 1
    # paused after a failure: the next query does not wait for the model again
    t0 = time.monotonic()
    assert ref.choose(ix, "trail notes") is None
    assert time.monotonic() - t0 < 0.2
    assert ref.counts["skipped"] == 1 and len(fake.chats) == 1


def test_garbage_answers_fall_back(fake: FakeOllama) -> None:
    ix = _index(CFG)
    now = [0.0]
    ref = _refiner(fake, cooldown=10.0, clock=lambda: now[0])
    fake.script += [invalid_json(), {"content": {"clusters": ["C9"]}}, {"content": "yes"}]
    for _ in range(3):
        now[0] += 100.0  # past the pause
        assert ref.choose(ix, "trail notes") is None
    assert ref.counts["fallback_error"] == 3 and ref.counts["refined"] == 0
    assert "schema" in ref.last_error or "JSON" in ref.last_error


def test_no_backend_or_a_dead_server_falls_back() -> None:
    ix = _index(CFG)
    none = Refiner(lambda: None, CFG)
    assert none.choose(ix, "trail notes") is None and none.counts["skipped"] == 1
    dead = OllamaBackend(OllamaConfig(host="http://127.0.0.1:9"))
    ref = Refiner(lambda: dead, CFG)
    assert ref.choose(ix, "trail notes") is None
    assert ref.counts["fallback_error"] + ref.counts["fallback_timeout"] == 1


def test_few_candidates_need_no_model(fake: FakeOllama) -> None:
    ix = _index(CFG)
    ref = _refiner(fake)
    assert ref.choose(ix, "tomatoes soil") is None  # one candidate: nothing to refine
    assert fake.chats == []


def test_engine_query_uses_the_refiner(tmp_path, fake: FakeOllama) -> None:
    from helpers import make_store

    from clagd.engine.core import Engine

    store = make_store(tmp_path / "s")
    eng = Engine(store)
    try:
        eng.index = _index(CFG)
        cands = eng.index.cluster_candidates("trail notes", 6)
        fake.script.append({"content": {"clusters": ["C5"]}})
        eng.hooks.refiner = _refiner(fake)
        out = eng.query("trail notes", max_memories=3)
        assert [c.id for c in out.clusters] == [cands[4][0]]
        assert {m.cluster_id for m in out.memories} == {cands[4][0]}
    finally:
        eng.close()
