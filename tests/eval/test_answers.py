"""The answer eval: LoCoMo's metrics, the sample, the context formats, the cache, and the
whole eval end to end on a tiny LoCoMo-shaped file against a model server on loopback
(Ollama's API scripted by fake_ollama: an "oracle reader" that answers with the gold
answer exactly when the context it was given contains it)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from competent import Competent
from fake_ollama import FakeOllama

from clagd.cli import main
from clagd.config import Config
from clagd.eval.answer_metrics import bleu1, f1_multi, f1_score, locomo_f1, normalize_answer
from clagd.eval.answer_run import format_answer_table, run_answers
from clagd.eval.answers import (
    ANSWER_SYSTEMS,
    Answer,
    AnswerCache,
    AnswerEvalError,
    Scores,
    Shown,
    day,
    fit,
    line,
    sample_questions,
)
from clagd.eval.data import Question, questions

MODEL = "qwen2.5:1.5b-instruct"


# --------------------------------------------------------------------------- metrics
def test_normalization_is_locomos():
    # lower case, punctuation and commas gone, a/an/the/and dropped, whitespace collapsed
    assert normalize_answer("The Cat, and  a Dog!") == "cat dog"
    assert normalize_answer("7 May 2023.") == "7 may 2023"


def test_token_f1_with_porter_stems():
    # pred [cat, sat], gold [cat, sat, down]: precision 1, recall 2/3
    assert f1_score("The cat sat", "a cat sat down") == pytest.approx(0.8)
    assert f1_score("running dogs", "run dog") == 1.0  # stemmed alike
    assert f1_score("yes", "no") == 0.0
    assert f1_score("", "anything") == 0.0
    # multiplicity counts: pred [a, a] (after normalization "paris paris") vs gold [paris]
    assert f1_score("Paris Paris", "Paris") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_multi_hop_answers_are_split_on_commas():
    # each gold part by its best predicted part: pottery 1, camping 1, painting 0
    assert f1_multi("pottery, camping", "camping, pottery, painting") == pytest.approx(2 / 3)
    assert locomo_f1("pottery, camping", "camping, pottery, painting", 1) == pytest.approx(2 / 3)
    # the other categories score the whole string (commas vanish in normalization)
    assert locomo_f1("pottery, camping", "camping, pottery, painting", 4) == pytest.approx(0.8)
    # category 3 keeps the gold answer before the first ";"
    assert locomo_f1("likely yes", "Likely yes; she said so", 3) == 1.0
    assert locomo_f1("likely yes", "Likely yes; she said so", 2) < 1.0


def test_bleu1_is_clipped_unigram_precision_with_brevity_penalty():
    assert bleu1("the cat", "the cat sat") == pytest.approx(math.exp(1 - 3 / 2))
    assert bleu1("the the the", "the cat") == pytest.approx(1 / 3)  # clipped to one "the"
    assert bleu1("dog", "the cat") == 0.0
    assert bleu1("", "the cat") == 0.0


# --------------------------------------------------------------------------- data, sample
TURNS = [
    # (session, date, [(speaker, text)])
    (1, "1:56 pm on 8 May, 2023", [
        ("Mel", "I started a pottery class last week and I love it."),
        ("Caro", "That sounds great! I went camping at the lake with my kids."),
        ("Mel", "My dog Biscuit ate my clay bowl, can you believe it."),
        ("Caro", "Ha! Our cat Milo only sleeps all day."),
    ]),
    (2, "10:37 am on 27 June, 2023", [
        ("Mel", "I painted a sunrise over the ocean yesterday."),
        ("Caro", "I am applying for a counseling job at the youth center."),
        ("Mel", "Biscuit turned three years old in June."),
        ("Caro", "We are moving to Denver in August."),
    ]),
    (3, "8:15 pm on 3 September, 2023", [
        ("Mel", "The pottery class ended, I made twelve mugs in total."),
        ("Caro", "Denver is lovely, the kids like their new school."),
        ("Mel", "I joined a running club that meets on Sundays."),
        ("Caro", "I got the counseling job and start in October."),
    ]),
]  # fmt: skip
QA = [
    ("What class did Mel start?", 4, ["D1:1"], "pottery class"),
    ("Where did Caro go camping?", 4, ["D1:2"], "at the lake"),
    ("What is the name of Mel's dog?", 4, ["D1:3"], "Biscuit"),
    ("What did Mel paint?", 4, ["D2:1"], "a sunrise over the ocean"),
    ("Which city did Caro move to?", 2, ["D2:4", "D3:2"], "Denver"),
    ("What job did Caro get?", 1, ["D2:2", "D3:4"], "counseling job"),
    ("How many mugs did Mel make?", 3, ["D3:1"], "twelve mugs"),
    ("When does the running club meet?", 4, ["D3:3"], "on Sundays"),
]


def _conversation(tag: str) -> dict[str, Any]:
    conv: dict[str, Any] = {"speaker_a": "Mel", "speaker_b": "Caro"}
    for n, when, turns in TURNS:
        conv[f"session_{n}_date_time"] = when
        conv[f"session_{n}"] = [
            {"speaker": s, "dia_id": f"D{n}:{i}", "text": f"{t} ({tag})"}
            for i, (s, t) in enumerate(turns, 1)
        ]
    qa = [{"question": q, "category": c, "evidence": e, "answer": a} for q, c, e, a in QA]
    qa.append({"question": "Adversarial?", "category": 5, "evidence": ["D1:1"]})
    return {"conversation": conv, "qa": qa}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-locomo.json"
    path.write_text(json.dumps([_conversation("one"), _conversation("two")]))
    return path


def test_questions_carry_their_gold_answers(tiny: Path):
    qs = questions(json.loads(tiny.read_text())[0])
    assert [q.answer for q in qs] == [a for *_, a in QA]  # category 5 left out


def test_the_sample_is_stratified_and_fixed_by_its_seed(tiny: Path):
    convs = json.loads(tiny.read_text())
    picked = sample_questions(convs, 8, seed=1)
    flat = [q for qs in picked for q in qs]
    assert len(flat) == 8
    cats = [q.category for q in flat]
    # 16 questions (10 single-hop, 2 of each other category), halved proportionally
    assert [cats.count(c) for c in (1, 2, 3, 4)] == [1, 1, 1, 5]
    assert sample_questions(convs, 8, seed=1) == picked
    others = [sample_questions(convs, 8, seed=s) for s in range(2, 8)]
    assert any(o != picked for o in others)
    small = sample_questions(convs, 4, seed=1)  # a larger sample holds the smaller one
    assert all(q in big for sm, big in zip(small, picked) for q in sm)
    assert sum(map(len, sample_questions(convs, None, 0))) == 16
    assert sum(map(len, sample_questions(convs, 99, 0))) == 16


def test_context_formats():
    m = Shown("Mel: I love pottery.", "2023-05-08T13:56:00Z", "pottery and clay")
    assert line(m, "labelled") == "[Memory · pottery and clay] Mel: I love pottery."
    assert line(m, "dated") == "[Memory · pottery and clay · 8 May 2023] Mel: I love pottery."
    assert line(m, "compact") == "(8 May 2023) Mel: I love pottery."
    plain = Shown("Caro: hi", "2023-06-27T10:37:00Z")
    assert line(plain, "labelled") == "[Memory] Caro: hi"
    assert line(plain, "dated") == "[Memory · 27 June 2023] Caro: hi"
    assert day("not a date") == "not a date"
    with pytest.raises(AnswerEvalError, match="unknown context format"):
        line(m, "fancy")
    items = [m] * 10
    assert len(fit(items, 0, "dated")) == 10
    assert 1 <= len(fit(items, 40, "dated")) < len(fit(items, 80, "dated")) < 10


def test_the_cache_survives_a_cut_line(tmp_path: Path):
    cache = AnswerCache(tmp_path / "a.jsonl")
    key = AnswerCache.key("m", [{"role": "user", "content": "q"}])
    assert key != AnswerCache.key("m2", [{"role": "user", "content": "q"}])
    cache.put({"key": key, "answer": "x", "prompt_tokens": 3, "seconds": 0.5})
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"key": "cut')  # a run killed while writing
    again = AnswerCache(tmp_path / "a.jsonl")
    assert again.get(key) == {"key": key, "answer": "x", "prompt_tokens": 3, "seconds": 0.5}
    assert len(again.entries) == 1


# --------------------------------------------------------------------------- end to end
def _oracle(gold: dict[str, str]) -> Any:
    """Answers a question's gold answer when the memories shown contain it, else "unknown"."""

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        user = req["messages"][-1]["content"]
        memories, _, question = user.partition("\n\nQuestion: ")
        question = question.removesuffix("\nShort answer:")
        truth = gold[question]
        found = truth.lower() in memories.lower()
        return {"content": {"answer": truth if found else "unknown"}}

    return answer


def _uncached(tree: Any) -> Any:
    """The figures without the count of cached answers (the only thing a rerun changes)."""
    if isinstance(tree, dict):
        return {k: _uncached(v) for k, v in tree.items() if k != "cached"}
    return tree


def _config(url: str) -> Config:
    cfg = Config()
    cfg.backend.kind = "ollama"
    cfg.backend.ollama.host = url
    cfg.backend.ollama.num_ctx = 600  # a small window: the recent history is cut
    return cfg


def test_answer_eval_end_to_end_against_a_model_server(tiny: Path, tmp_path: Path, capsys):
    gold = {q: a for q, _c, _e, a in QA}
    with FakeOllama(models=[MODEL]) as fake:
        fake.default = _oracle(gold)
        kw: dict[str, Any] = {"cache": tmp_path / "answers.jsonl", "k": 5, "budget": 300}
        formats = ("labelled", "dated", "compact")
        res = run_answers(tiny, _config(fake.url), formats=formats, **kw)
        asked = len(fake.chats)
        again = run_answers(tiny, _config(fake.url), formats=formats, progress=False, **kw)
        assert len(fake.chats) == asked  # every answer came from the cache
    assert res["questions"] == 16 and res["format"] == "dated"
    a = res["answers"]
    assert set(a) == set(ANSWER_SYSTEMS)
    for row in a.values():
        assert {"f1", "bleu1", "prompt_tokens", "seconds", "per_category"} <= set(row)
        assert row["n"] == 16 and row["errors"] == 0
    # no memory: the oracle never finds the answer; retrieval finds most of them
    assert a["none"]["f1"] == 0.0
    assert a["clagd"]["f1"] > 50 and a["flat_bm25"]["f1"] > 50
    # 24 turns of ~20 tokens do not fit a 600-token window: the oldest answers are missing
    assert 0 < a["recent"]["f1"] < 100
    assert a["recent"]["prompt_tokens"] > a["clagd"]["prompt_tokens"] > a["none"]["prompt_tokens"]
    assert set(a["clagd"]["per_category"]) == {"1", "2", "3", "4"}
    assert set(res["formats"]) == set(formats)
    # clagd against each baseline, question by question: the same 16 questions, so the mean
    # difference is the difference of the means; no memory is clearly worse
    paired = res["paired"]
    assert set(paired) == {"flat_bm25", "none", "recent"}
    for other, d in paired.items():
        assert d["n"] == 16 and d["low"] <= d["diff"] <= d["high"]
        assert abs(d["diff"] - (a["clagd"]["f1"] - a[other]["f1"])) < 0.02
    assert paired["none"]["low"] > 0
    assert res["retrieval"]["clagd"]["session@5"] >= res["retrieval"]["clagd"]["hit@5"]
    # the same questions and answers a second time, none of them asked
    assert again["asked"] == 0 and again["answers"]["clagd"]["cached"] == 16
    assert _uncached(again["answers"]) == _uncached(a)
    # 3 formats x 4 systems x 16, less what repeats (no memory is the same prompt each time)
    assert res["asked"] == asked < 3 * 4 * 16
    err = capsys.readouterr().err
    assert "locomo answers: conversation 2/2" in err and "/192 answers" in err
    table = format_answer_table(res)
    assert "F1 per category" in table and "F1 per context format" in table
    assert "clagd minus none: +" in table


def test_paired_differences_use_only_questions_both_answered() -> None:
    q = Question("Where does Anna live?", 4, [], "Lyon")
    scores = Scores(("dated",))
    for qid, (mine, theirs) in enumerate([("Lyon", "Lyon"), ("Lyon", "Paris"), ("Lyon", None)]):
        scores.add("dated", "clagd", q, Answer(mine, 10, 0.1), qid)
        if theirs is not None:  # a cached-only run may lack this answer
            scores.add("dated", "flat_bm25", q, Answer(theirs, 10, 0.1), qid)
    got = scores.paired("dated")
    assert set(got) == {"flat_bm25"}  # nothing answered by the others
    assert got["flat_bm25"].n == 2 and got["flat_bm25"].diff == 50.0
    assert got["flat_bm25"].low == 0.0 and got["flat_bm25"].high == 100.0


def test_the_cli_answers_with_a_config_file(tiny: Path, tmp_path: Path, monkeypatch):
    gold = {q: a for q, _c, _e, a in QA}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with FakeOllama(models=[MODEL]) as fake:
        fake.default = _oracle(gold)
        cfg = tmp_path / "clagd.yaml"
        cfg.write_text(f"backend:\n  kind: ollama\n  ollama:\n    host: {fake.url}\n")
        args = ["eval", "locomo", str(tiny), "--answer", "--config", str(cfg)]
        args += ["--questions", "4", "--seed", "3", "--protocol", "batch", "--json"]
        out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["questions"] == 4 and res["seed"] == 3 and res["sampled"]
    assert res["answers"]["clagd"]["n"] == 4
    assert (tmp_path / "cache" / "clagd" / "answers" / "answers.jsonl").is_file()


def test_answering_without_a_model_is_one_clear_error(tiny: Path):
    out = CliRunner().invoke(main, ["eval", "locomo", str(tiny), "--answer", "--backend", "none"])
    assert out.exit_code == 1
    assert "--answer needs a model" in out.stderr


def test_cached_only_scores_what_a_stopped_run_finished(tiny: Path, tmp_path: Path):
    """A run cut short (here: 4 of 16 questions asked), then `cached_only`: each system is
    scored on the questions whose answer is cached for it, and the model is asked nothing."""
    gold = {q: a for q, _c, _e, a in QA}
    kw: dict[str, Any] = {"cache": tmp_path / "answers.jsonl", "k": 5, "budget": 300}
    with FakeOllama(models=[MODEL]) as fake:
        fake.default = _oracle(gold)
        small = run_answers(tiny, _config(fake.url), n=4, seed=2, progress=False, **kw)
        asked = len(fake.chats)
        res = run_answers(tiny, _config(fake.url), progress=False, cached_only=True, **kw)
        assert len(fake.chats) == asked
    assert res["sample"] == 16 and res["asked"] == 0
    for system in ("clagd", "flat_bm25"):  # their contexts differ from question to question
        assert res["answers"][system]["n"] == 4
        assert _uncached(res["answers"][system]) == _uncached(small["answers"][system])
    # a no-memory prompt is the question alone: the same question in the other conversation
    # is answered from the cache too
    assert res["answers"]["none"]["n"] >= 4 and res["questions"] >= 4


def test_a_model_can_organize_the_stores_clagd_answers_from(
    tiny: Path, tmp_path: Path, monkeypatch
):
    """`--organizer-config`: the stores clagd answers from are organized by that config's
    model (here a competent stand-in that names Mel's and Caro's clusters), and the
    answering model reads those names in clagd's context."""
    gold = {q: a for q, _c, _e, a in QA}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    groups = {"Mel": "Mel crafts and pets", "Caro": "Caro moving and work"}
    reference = {
        f"{who}: {text} ({tag})": groups[who]
        for _n, _when, turns in TURNS
        for who, text in turns
        for tag in ("one", "two")
    }
    with FakeOllama(models=[MODEL]) as answering, FakeOllama(models=[MODEL]) as organizing:
        answering.default = _oracle(gold)
        organizing.default = Competent(reference)
        cfg, org = tmp_path / "answer.yaml", tmp_path / "organize.yaml"
        cfg.write_text(f"backend:\n  kind: ollama\n  ollama:\n    host: {answering.url}\n")
        org.write_text(f"backend:\n  kind: ollama\n  ollama:\n    host: {organizing.url}\n")
        args = ["eval", "locomo", str(tiny), "--answer", "--config", str(cfg), "--json"]
        args += ["--questions", "4", "--seed", "3", "--protocol", "batch"]
        out = CliRunner().invoke(main, [*args, "--organizer-config", str(org)])
        prompts = [m["content"] for chat in answering.chats for m in chat["messages"]]
        lexical = CliRunner().invoke(main, args)
        asked_organizer = len(organizing.chats)
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["organizer"] == "ollama" and res["organization"]["sessions"] >= 1
    assert asked_organizer > 0
    assert any(name in p for name in groups.values() for p in prompts)
    assert json.loads(lexical.stdout)["organizer"] == "lexical"
    assert len(organizing.chats) == asked_organizer  # the lexical run asked it nothing
    refused = CliRunner().invoke(
        main, ["eval", "locomo", str(tiny), "--organizer-config", str(org)]
    )
    assert refused.exit_code == 2 and "goes with --answer" in refused.output


def _namer(competent: Competent) -> Any:
    """A model the gate lets name (the competent stand-in answers its scenes) that names a
    session's groups by their first memory's longest word, but copies the instructions'
    first words for the second group of each call."""

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        user = req["messages"][-1]["content"]
        if "(one)" not in user and "(two)" not in user:  # the gate's scenes
            return competent(req)
        prompt = re.findall(r"[A-Za-z']+", req["messages"][0]["content"])
        out = {}
        for key, first in re.findall(r"^(G\d+) \(.*\n- (.*)$", user, re.M):
            word = max(re.findall(r"[A-Za-z]+", first), key=len)
            name = " ".join(prompt[1:4]) if key == "G2" else f"talk of {word}"
            out[key] = {"name": name, "description": f"About {word}.", "tags": [word]}
        return {"content": {"groups": out}}

    return answer


def test_the_eval_says_how_many_clusters_the_model_named_and_why_not_more(
    tiny: Path, tmp_path: Path
):
    """`organization` in the eval's JSON: the clusters a model was asked to name, named, and
    whose answer was rejected, with the first reasons (issue 27: 9 of 52 named, nobody
    could tell why)."""
    gold = {q: a for q, _c, _e, a in QA}
    with FakeOllama(models=[MODEL]) as answering, FakeOllama(models=[MODEL]) as organizing:
        answering.default = _oracle(gold)
        organizing.default = _namer(Competent())
        cfg, org = tmp_path / "answer.yaml", tmp_path / "organize.yaml"
        cfg.write_text(f"backend:\n  kind: ollama\n  ollama:\n    host: {answering.url}\n")
        org.write_text(
            f"backend:\n  kind: ollama\n  ollama:\n    host: {organizing.url}\n"
            "  gate:\n    tasks: name\n"
        )
        args = ["eval", "locomo", str(tiny), "--answer", "--config", str(cfg), "--json"]
        args += ["--questions", "4", "--protocol", "batch", "--organizer-config", str(org)]
        out = CliRunner().invoke(main, args)
        calls = [c for c in organizing.chats if "(one)" in str(c) or "(two)" in str(c)]
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)["organization"]
    keys = [c["format"]["properties"]["groups"]["required"] for c in calls]
    asked, copied = sum(map(len, keys)), sum("G2" in k for k in keys)
    assert res["sessions"] >= 1 and res["naming_asked"] == asked and copied >= 1
    assert res["naming_rejected"] == copied and res["named"] == asked - copied
    reasons = res["naming_reasons"]
    assert len(reasons) == copied and all("copies the prompt" in r for r in reasons), reasons
