"""A lexical plan made off the writer that a write made stale before the writer took it is
made again off the writer, from a fresh snapshot, and only after `STALE_RETRIES` such
tries by the writer itself (issue 26: made on the writer, it held it 120-250 ms at 100k
memories). A real engine on a real store; the writes are hand edits taken in by the
engine between the plan and its application."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

import clagd.organize.organizers as organizers
from clagd.engine.core import Engine
from clagd.organize.organizers import STALE_RETRIES, LexicalOrganizer
from clagd.store.files import StoreState
from tests.helpers import head_contents, wait_for
from tests.organize.test_scale import _many_small_clusters


@pytest.mark.parametrize("stale", [1, STALE_RETRIES + 1])
def test_a_stale_lexical_plan_is_made_again_off_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale: int
) -> None:
    store, topics = _many_small_clusters(tmp_path)
    eng = Engine(store)
    made_on: list[str] = []  # the thread each lexical plan was made on
    proposed = 0
    real_plan, real_propose = organizers._lexical_plan, LexicalOrganizer.propose

    def lexical_plan(*a: Any, **kw: Any) -> Any:
        made = real_plan(*a, **kw)
        made_on.append(threading.current_thread().name)
        reads.append(sorted(made.read))
        return made

    def propose(self: LexicalOrganizer, *a: Any) -> Any:
        nonlocal proposed
        proposal = real_propose(self, *a)
        proposed += 1
        if proposed <= stale:
            # a hand edit of a cluster the plan read, taken in before the plan is applied
            path = store / "clusters" / f"{reads[-1][0]}.yaml"
            data = yaml.safe_load(path.read_text())
            data["memories"].append({"content": f"hand edit {proposed} of {reads[-1][0]}"})
            path.write_text(yaml.safe_dump(data))
            assert eng.check_outside() is not None
        return proposal

    reads: list[list[str]] = []
    monkeypatch.setattr(organizers, "_lexical_plan", lexical_plan)
    monkeypatch.setattr(LexicalOrganizer, "propose", propose)
    try:
        # unsorted memories on the clusters' topics (a batch over route_inline_max waits)
        eng.add([{"content": f"{topics[k]} again, note {k}"} for k in range(6)])
        out = eng.recluster("manual", "none")
        assert out.status == "accepted", out.reasons
        assert proposed == min(stale, STALE_RETRIES) + 1
        on_writer = [t for t in made_on if t == "clagd-writer"]
        # the writer made the plan itself only once every retry off it went stale
        assert len(on_writer) == (1 if stale > STALE_RETRIES else 0), made_on
        hand = {f"hand edit {i} of" for i in range(1, min(stale, STALE_RETRIES + 1) + 1)}
        served = {m.content for m, _a, _k in eng.state.all_memories()}
        assert all(any(s.startswith(h) for s in served) for h in hand)
    finally:
        eng.close()
    contents = head_contents(store)
    assert len(contents) == len(set(contents)) == 3 * len(topics) + 6 + len(hand)


def test_the_first_session_after_a_start_finds_its_sample_without_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where each memory is, noted when the store is loaded: the session's operations on the
    writer look its sample up there, not by a pass over every memory (65-130 ms at 100k)."""
    store, topics = _many_small_clusters(tmp_path)
    eng = Engine(store)
    eng.close()
    eng = Engine(store)  # a start on a store that has clusters and unsorted memories
    passes: list[str] = []
    real = StoreState.all_memories

    def all_memories(self: StoreState) -> Any:
        passes.append(threading.current_thread().name)
        return real(self)

    try:
        state = eng.writer.state
        # noted by the writer's operations right after the start (`Engine._prime_op`)
        wait_for(eng.writer.idle.idle, 30, "the start's own operations")
        assert set(state.places) == state.memory_ids()
        eng.add([{"content": f"{topics[k]} once more, note {k}"} for k in range(6)])
        monkeypatch.setattr(StoreState, "all_memories", all_memories)
        out = eng.recluster("manual", "none")
        assert out.status == "accepted", out.reasons
        assert "clagd-writer" not in passes, passes
    finally:
        eng.close()
