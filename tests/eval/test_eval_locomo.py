import json
from pathlib import Path

import pytest
from helpers import SHARED_DATA

from clagd.eval.locomo import (
    conversation_turns,
    eval_command,
    parse_evidence,
    parse_session_time,
    run_eval,
)
from clagd.model import memory_id

DATA = SHARED_DATA / "locomo" / "locomo-dev.json"
if not DATA.exists():
    DATA = Path("/work/shared/data/locomo/locomo-dev.json")
KEYS = {"recall@5", "recall@10", "hit@5", "hit@10", "tokens", "p50_ms", "p99_ms"}


def test_parse_evidence_is_lenient():
    assert parse_evidence(["D3:7"]) == ["D3:7"]
    assert parse_evidence(["D:11:26"]) == ["D11:26"]
    assert parse_evidence(["D30:05"]) == ["D30:5"]
    assert parse_evidence(["D8:6; D9:17", "D8:6"]) == ["D8:6", "D9:17"]
    assert parse_evidence(["D", ""]) == []


def test_parse_session_time():
    t = parse_session_time("1:56 pm on 8 May, 2023")
    assert t is not None and t.isoformat() == "2023-05-08T13:56:00+00:00"
    assert parse_session_time("12:05 am on 1 January, 2024").hour == 0
    assert parse_session_time("no date here") is None


def _small_file(tmp_path: Path, sessions: int = 4, questions: int = 12) -> Path:
    conv = json.loads(DATA.read_text())[0]
    c = conv["conversation"]
    keep = {k: v for k, v in c.items() if not k.startswith("session")}
    for n in range(1, sessions + 1):
        keep[f"session_{n}"] = c[f"session_{n}"]
        keep[f"session_{n}_date_time"] = c[f"session_{n}_date_time"]
    valid = {t["dia_id"] for n in range(1, sessions + 1) for t in c[f"session_{n}"]}
    qa = [q for q in conv["qa"] if q.get("evidence") and set(q["evidence"]) <= valid]
    path = tmp_path / "slice.json"
    path.write_text(json.dumps([{"conversation": keep, "qa": qa[:questions]}]))
    return path


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_turns_carry_content_time_and_captions():
    conv = json.loads(DATA.read_text())[0]
    turns = conversation_turns(conv)
    assert turns[0].content.startswith(conv["conversation"]["speaker_a"] + ": ")
    assert turns[0].created_at == "2023-05-08T13:56:00Z"
    assert turns[1].created_at == "2023-05-08T13:56:10Z"
    assert any("[image: " in t.content for t in turns)
    assert all(t.created_at <= u.created_at for t, u in zip(turns, turns[1:]))
    assert memory_id(turns[0].content).startswith("m-")


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
@pytest.mark.parametrize("pipeline", ["inprocess", "engine"])
def test_run_eval_on_a_slice(tmp_path, pipeline):
    path = _small_file(tmp_path)
    res = run_eval(path, ks=(5, 10), progress=False, pipeline=pipeline)
    for system in ("clagd", "flat_bm25", "recency"):
        assert KEYS <= set(res[system])
        assert 0.0 <= res[system]["recall@10"] <= 1.0
        assert res[system]["recall@5"] <= res[system]["recall@10"]
    assert res["questions"] == 12
    assert res["full_tokens"] > res["clagd"]["tokens"] > 0
    assert res["per_category"]
    for row in res["per_category"].values():
        assert KEYS <= set(row["clagd"]) and row["n"] > 0
    assert res["clagd"]["hit@10"] > 0.5


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_eval_command_prints_json(tmp_path, capsys):
    path = _small_file(tmp_path, sessions=2, questions=4)
    assert eval_command(str(path), "5,10", True, "none") == 0
    out = json.loads(capsys.readouterr().out)
    assert {"clagd", "flat_bm25", "recency", "full_tokens", "per_category"} <= set(out)
