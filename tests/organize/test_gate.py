"""The competence gate and the junk validation, with the real `ollama` client against the
loopback server (tests/fake_ollama.py), a real store and the real writer; the accept path
end to end through a real daemon with a competent stand-in (tests/competent.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from competent import Competent
from fake_ollama import FakeOllama
from helpers import InProcessDaemon, git, head_contents, make_store
from junk import JUNK

from clagd.cli import main
from clagd.config import Config, LlamaCppConfig, OllamaConfig
from clagd.engine.core import Engine
from clagd.errors import BackendClosed
from clagd.organize import gate, gate_cache
from clagd.organize.examples import copied, prompt_examples
from clagd.organize.gate import GateResult, TaskScore, cache_file, cache_key, gate_for, measure
from clagd.organize.prompts import load_prompt
from clagd.organize.session import run_session
from clagd.organize.validation import looping
from clagd.slm.llamacpp import LlamaCppBackend, llama_cpp_installed
from clagd.slm.ollama import OllamaBackend

TEXTS = {
    "User is always cold in the evening and wears two sweaters": "home warmth",
    "User asked where the heating switch is in the flat": "home warmth",
    "User wants the radiator in the bedroom bled before winter": "home warmth",
    "Anna is the user's sister and lives in Lyon": "sister Anna",
    "Anna's birthday is on 14 June; she likes lemon cake": "sister Anna",
    "Anna is moving flats in Lyon next month": "sister Anna",
    "The quarterly report is due on 30 April": "quarterly report work",
    "Tom, the user's manager, reviews the quarterly report": "quarterly report work",
}
LATER = {
    "User bought a wool blanket because the living room is cold": "home warmth",
    "Anna asked the user to help her pack boxes in Lyon": "sister Anna",
    "Tom wants the report figures split by region": "quarterly report work",
    "The report draft needs a chart of regional sales": "quarterly report work",
}


def _backend(fake: FakeOllama) -> OllamaBackend:
    return OllamaBackend(OllamaConfig(host=fake.url, timeout=5.0))


def test_the_lexical_naming_baseline_reaches_the_score(fake: FakeOllama) -> None:
    """The lexical organizer's profiles of the reference groups (each organized on its own)
    are scored on the later questions, as the model's are: organized together, a scene's
    memories were one lexical cluster with one name, and the baseline was 0.00."""
    res = measure(_backend(fake), None)
    name = res.tasks["name"]
    assert name.items == 36 and 0.2 < name.lexical < 1.0
    assert name.model == 0.0 and not name.allowed  # the fake's "{}" names nothing


def test_the_gate_set_is_large_enough_and_every_score_has_an_interval(fake: FakeOllama) -> None:
    scenes, _h = gate.load_gate_set()
    probes = [p for s in scenes for p in s.probes]
    judged = [p for p in probes if p[1] != gate.NEW]
    assert len(scenes) >= 4 and len(probes) >= 40 and 2 * len(judged) >= 40
    fake.default = Competent()
    res = measure(_backend(fake), None)
    for task, t in res.tasks.items():
        assert t.items > 0 and t.interval[0] <= t.model <= t.interval[1], (task, t)
        assert t.gain[0] <= t.model - t.lexical <= t.gain[1] or task == "judge", (task, t)
    assert res.tasks["route"].items == len(probes) and res.tasks["judge"].items == 2 * len(judged)
    # the decision is on the lower bound: a score above the need with a wide interval fails
    r = res.tasks["route"]
    assert r.allowed == (r.gain[0] >= 0.05), r


def test_the_lexical_router_is_the_index_bm25() -> None:
    """The gate's routing baseline asks the index's BM25 (as queries and the session's
    checks do): its best cluster, NEW only when no cluster matches at all."""
    from clagd.organize.gate import NEW, lexical_route, load_gate_set
    from clagd.organize.similarity import ClusterScores

    scene = load_gate_set()[0][0]
    scores = ClusterScores({c.id: c for c in scene.clusters})
    for text, _truth in scene.probes:
        got = lexical_route(text, scene.clusters)
        s = scores.scores(text)
        top = max(s.values(), default=0.0)
        assert (
            got == NEW
            if top <= 0
            else s[next(c.id for c in scene.clusters if c.name == got)] == top
        )
    assert lexical_route("zebra quantum xylophone", scene.clusters) == NEW


def test_the_cache_key_follows_how_the_gate_scores(fake: FakeOllama, monkeypatch) -> None:
    before = cache_key(_backend(fake), "set", "prompts", 2)
    monkeypatch.setattr(gate, "SCORING", gate.SCORING + 1)
    assert cache_key(_backend(fake), "set", "prompts", 2) != before


def test_prompt_examples_and_copy_detection() -> None:
    ex = prompt_examples(load_prompt(None, "organize.md"))
    assert {"user comfort at home", "user family members", "build and ci problems"} <= ex.names
    assert len(ex.assigns) == 3
    req = {"format": {"properties": {"assign": {"required": ["M1", "M2", "M3", "M4"]},
           "clusters": {"items": {"properties": {"id": {"enum": ["N1", "N2"]}}}}}}}  # fmt: skip
    answer = JUNK["copied_example"](req)["content"]
    found = copied(answer, ex)
    assert any("name 'user comfort at home'" in f for f in found)
    assert any("reason" in f for f in found) and any(
        "assignment copies example 1" in f for f in found
    )
    honest = {"clusters": [{"id": "N1", "name": "garden vegetables", "description": "What grows."}],
              "assign": {"M1": "N1", "M2": "N1"}, "reason": "Both are about the garden."}  # fmt: skip
    assert copied(honest, ex) == []
    assert looping("she's a little baby, " * 6) and not looping("User likes tea in the afternoon.")


def test_competent_model_passes_and_the_verdict_is_cached(store: Path, fake: FakeOllama) -> None:
    fake.default = Competent()
    cfg, cache = Config(), store / ".clagd" / "gate"
    res = gate_for(_backend(fake), cfg, cache, store / "prompts")
    assert res.may_organize() and all(res.allows(t) for t in ("route", "judge")), res.lines()
    assert res.tasks["organize"].model == 1.0 and res.tasks["organize"].lexical < 0.9
    assert res.calls == 16 and res.prompt_tokens > 0 and not res.copies
    assert cache_file(cache, _backend(fake)).is_file()
    calls = len(fake.chats)
    assert gate_for(_backend(fake), cfg, cache, store / "prompts").key == res.key
    assert len(fake.chats) == calls  # cached: no model call
    with open(store / "prompts" / "organize.md", "a") as f:  # an edited prompt: measure again
        f.write("\nKeep names short.\n")
    gate_for(_backend(fake), cfg, cache, store / "prompts")
    assert len(fake.chats) == calls + 16


def test_the_gate_measures_only_the_tasks_it_is_given(store: Path, fake: FakeOllama) -> None:
    """`backend.gate.tasks: name`: one naming call per scene and no other; the tasks left
    out are refused without a call, and the verdict is kept apart from a full one."""
    fake.default = Competent()
    cfg, cache = Config(), store / ".clagd" / "gate"
    cfg.backend.gate.tasks = "name"
    res = gate_for(_backend(fake), cfg, cache, store / "prompts")
    assert res.calls == 4 and len(fake.chats) == 4, res.lines()
    assert res.allows("name") and not res.may_organize()
    for task in ("route", "organize", "judge"):
        assert not res.allows(task) and "not measured" in res.tasks[task].why
    assert gate_for(_backend(fake), cfg, cache, store / "prompts").key == res.key
    assert len(fake.chats) == 4  # cached
    full = gate_for(_backend(fake), Config(), cache, store / "prompts")
    assert full.key != res.key and full.calls == 16 and full.may_organize()


def test_a_gate_task_list_naming_an_unknown_task_is_refused(tmp_path: Path) -> None:
    from clagd.config import ConfigError, load_config

    root = make_store(tmp_path / "s", {"backend": {"gate": {"tasks": "name,spelling"}}})
    with pytest.raises(ConfigError, match=r"backend\.gate\.tasks.*'name,spelling'"):
        load_config(root)


def test_a_second_store_takes_the_verdict_from_the_user_cache(
    tmp_path: Path, fake: FakeOllama, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fake.default = Competent()
    first, second = make_store(tmp_path / "one"), make_store(tmp_path / "two")
    res = gate_for(_backend(fake), Config(), first / ".clagd" / "gate", first / "prompts")
    shared = list((tmp_path / "xdg" / "clagd" / "gate").glob("ollama-*.json"))
    assert len(shared) == 1 and json.loads(shared[0].read_text())["key"] == res.key
    calls = len(fake.chats)
    again = gate_for(_backend(fake), Config(), second / ".clagd" / "gate", second / "prompts")
    assert len(fake.chats) == calls and again.key == res.key  # not paid again
    assert cache_file(second / ".clagd" / "gate", _backend(fake)).is_file()  # and in the store
    # a model file is known by its sha256: a copy elsewhere is the same model
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    copy = tmp_path / "elsewhere" / "a.gguf"
    copy.parent.mkdir()
    copy.write_bytes(gguf.read_bytes())
    assert gate_cache.file_sha256(gguf) == gate_cache.file_sha256(copy)


def test_the_gate_total_time_is_bounded(store: Path, fake: FakeOllama) -> None:
    fake.default = lambda req: {"content": Competent()(req)["content"], "delay": 0.6}
    cfg = Config()
    cfg.backend.gate.total_seconds = 2.5
    res = gate_for(_backend(fake), cfg, store / ".clagd" / "gate", store / "prompts")
    assert res.skipped > 0 and res.calls + res.skipped == 16 and res.seconds < 6
    assert any("time ran out" in e for e in res.errors)
    assert "not made in time" in res.lines()[0]
    assert not any(gate_cache.user_gate_dir().glob("*.json"))  # cut short: not shared


def test_a_gate_cut_short_by_the_backend_closing_keeps_no_verdict(
    store: Path, tmp_path: Path
) -> None:
    """clagd stopping closes the backend under a measurement: its calls fail at once, which
    must not become a verdict that the model fails every task (in either cache)."""
    backend = LlamaCppBackend(LlamaCppConfig(model_path=str(tmp_path / "model.gguf")))
    backend.close()
    with pytest.raises(BackendClosed):
        gate_for(backend, Config(), store / ".clagd" / "gate", store / "prompts")
    assert not cache_file(store / ".clagd" / "gate", backend).exists()
    assert not any(gate_cache.user_gate_dir().glob("*.json"))


@pytest.mark.parametrize("kind", sorted(JUNK) + ["halves_and_yes"])
def test_gate_refuses_junk_models(store: Path, fake: FakeOllama, kind: str) -> None:
    if kind in JUNK:
        fake.default = JUNK[kind]
    res = gate_for(_backend(fake), Config(), store / ".clagd" / "gate", store / "prompts")
    assert not res.may_organize(), res.lines()
    assert not res.allows("route") and not res.allows("judge")  # one answer for all; yes to all
    if kind == "copied_example":
        assert res.copies and "copies the prompt's examples" in res.tasks["organize"].why


@pytest.fixture
def eng(store: Path, fake: FakeOllama) -> Iterator[Engine]:
    e = Engine(store)
    e.config.backend.kind = "ollama"
    e.config.backend.ollama.host = fake.url
    e.config.backend.ollama.timeout = 5.0
    e.add(
        [{"content": t, "created_at": f"2025-03-0{i + 1}T10:00:00Z"} for i, t in enumerate(TEXTS)]
    )
    # existing clusters (lexical), then new memories: the model is offered clusters
    assert run_session(e.writer.submit, None, e.config, e.paths.prompts).status == "accepted"
    e.add([{"content": t, "created_at": "2025-03-20T10:00:00Z"} for t in LATER])
    yield e
    e.close()


@pytest.mark.parametrize("kind", sorted(JUNK))
def test_junk_plans_never_reach_head(eng: Engine, fake: FakeOllama, kind: str) -> None:
    """Whatever the gate says (`run_session` is called with the model directly and its
    yes/no verdicts count): the junk is refused and the model's plan is never kept."""
    fake.default = JUNK[kind]
    before_head = git(eng.root, "rev-parse", "HEAD").strip()
    before = sorted(head_contents(eng.root))
    out = run_session(eng.writer.submit, _backend(fake), eng.config, eng.paths.prompts)
    assert out.status == "fallback", out.reasons
    expect = {
        "copied_example": "copied from the prompt's examples",
        "looping_summary": "loops",
        "all_in_one": "in one cluster",
        "new_for_everything": "which has no name",
    }[kind]
    assert any(expect in r for r in out.reasons), out.reasons
    assert sorted(head_contents(eng.root)) == before
    # refused before any change: the only commits since are the lexical fallback's
    log = git(
        eng.root, "log", "--format=%(trailers:key=Clagd-Backend,valueonly)", f"{before_head}.."
    )
    assert "ollama" not in log
    names = {c.name.casefold() for c in eng.state.clusters.values()}
    assert not names & {"user comfort at home", "user family members", "little baby", "user notes"}


def test_retrievability_refuses_a_scrambled_grouping(eng: Engine, fake: FakeOllama) -> None:
    """A plan that looks fine (names, sizes) but files memories with the wrong group is
    applied, fails the label-free checks (retrievability, lexical coherence) and is
    reverted."""
    groups = sorted(set(TEXTS.values()))
    scrambled = {t: groups[i % 3] for i, t in enumerate({**TEXTS, **LATER})}
    assert scrambled != {**TEXTS, **LATER}
    fake.default = Competent(scrambled)
    before = sorted(head_contents(eng.root))
    # a gate that lets the model organize but not judge: its own verdicts do not count,
    # only the label-free checks do
    gate = GateResult("ollama", "m", "k", "now", tasks={
        "organize": TaskScore(1.0, 0.4, True, ""), "name": TaskScore(1.0, 0.0, True, ""),
        "judge": TaskScore(0.5, 0.7, False, "0.50 < 0.75 needed")})  # fmt: skip
    out = run_session(eng.writer.submit, _backend(fake), eng.config, eng.paths.prompts, gate=gate)
    assert out.status == "fallback", out.reasons
    assert any("retrievability fell" in r for r in out.reasons), out.reasons
    assert any("lexically incoherent" in r for r in out.reasons), out.reasons
    assert sorted(head_contents(eng.root)) == before
    assert "revert" in git(eng.root, "log", "--format=%(trailers:key=Clagd-Kind,valueonly)")


@pytest.fixture
def competent_daemon(
    tmp_path: Path, short_tmp: Path, fake: FakeOllama
) -> Iterator[InProcessDaemon]:
    fake.default = Competent({**TEXTS, **LATER})
    root = make_store(
        tmp_path / "m",
        {"backend": {"kind": "auto", "ollama": {"host": fake.url, "timeout": 5.0}},
         "session": {"validate_fraction": 0.5}},
    )  # fmt: skip
    d = InProcessDaemon(root, short_tmp / "s.sock")
    yield d
    d.stop()


def test_accept_path_end_to_end(competent_daemon: InProcessDaemon, fake: FakeOllama) -> None:
    """A competent model behind the real client: measured by the gate on first use, its
    plan accepted, committed with its trailers, shown in `clagd log` and `clagd status`."""
    d = competent_daemon
    with d.client() as c:
        c.add_many([{"content": t} for t in [*TEXTS, *LATER]])
        out = c.recluster()
        assert out["status"] == "accepted" and out["backend"] == "ollama", out
        names = {x["name"] for x in c.clusters()["clusters"]}
        assert names == {"home warmth", "sister Anna", "quarterly report work"}
        gate = c.status()["backend"]["gate"]
    assert gate[0]["backend"] == "ollama" and gate[0]["allowed"] == [
        "route",
        "organize",
        "name",
        "judge",
    ]
    msg = git(d.root, "log", "-1", "--grep=^cluster: session", "--format=%B")
    assert "Clagd-Backend: ollama" in msg and "Clagd-Status: applied" in msg
    assert "create 'home warmth'" in msg
    assert sorted(head_contents(d.root)) == sorted([*TEXTS, *LATER])
    runner = CliRunner()
    log_out = runner.invoke(main, ["--socket", str(d.socket), "log"]).output
    assert "backend=ollama" in log_out and "accepted" in log_out or "applied" in log_out
    status_out = runner.invoke(main, ["--socket", str(d.socket), "status"]).output
    assert "gate       ollama qwen2.5:1.5b-instruct" in status_out
    assert "may: route, organize, name, judge" in status_out


def test_backend_test_command(store: Path, fake: FakeOllama) -> None:
    make_store(store, {"backend": {"kind": "ollama", "ollama": {"host": fake.url}}})
    runner = CliRunner()
    fake.default = JUNK["copied_example"]
    res = runner.invoke(main, ["--store", str(store), "backend", "test", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"] == "ollama" and "organize" not in data["allowed"] and data["copies"]
    # a line on stderr after each call of the model, naming its task and scene
    lines = res.stderr.splitlines()
    assert len(lines) == data["calls"] and lines[0].startswith("gate: route, scene 1 of ")
    assert all(
        re.fullmatch(
            r"gate: \w+, scene \d+ of \d+: (answered|failed) in [\d.]+ s \(\d+ s so far\)", x
        )
        for x in lines
    ), lines
    fake.default = Competent()
    res = runner.invoke(main, ["--store", str(store), "doctor"])
    assert res.exit_code == 0 and "organize  model 1.00" in res.output
    assert "may: route, organize, name, judge" in res.output


@pytest.mark.skipif(
    not llama_cpp_installed(),
    reason="llama-cpp-python is not installed (pip install '.[embedded]')",
)
def test_backend_test_names_a_missing_gguf(store: Path, fake: FakeOllama) -> None:
    make_store(
        store,
        {
            "backend": {
                "kind": "ollama",
                "ollama": {"host": fake.url},
                "llamacpp": {"model_path": "/nonexistent/model.gguf"},
            }
        },
    )
    runner = CliRunner()
    res = runner.invoke(main, ["--store", str(store), "backend", "test", "--kind", "llamacpp"])
    assert res.exit_code == 0 and "no model answers" in res.output, res.output
    assert "GGUF file not found" in res.output
