import json
from pathlib import Path

import pytest
from helpers import SHARED_DATA

from clagd.eval.data import Turn, arrivals
from clagd.eval.locomo import (
    conversation_turns,
    eval_command,
    format_table,
    parse_evidence,
    parse_session_time,
    run_eval,
    run_protocols,
)
from clagd.eval.metrics import Tally
from clagd.model import memory_id

DATA = SHARED_DATA / "locomo" / "locomo-dev.json"
if not DATA.exists():
    DATA = Path("/work/shared/data/locomo/locomo-dev.json")
KEYS = {
    "recall@5",
    "recall@10",
    "hit@5",
    "hit@10",
    "precision@5",
    "precision@10",
    "tokens",
    "wasted_tokens",
    "p50_ms",
    "p99_ms",
}


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
    res = run_eval(path, ks=(5, 10), progress=False, pipeline=pipeline, protocol="batch")
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
    assert eval_command(str(path), "5,10", True, "none", protocol="batch") == 0
    out = json.loads(capsys.readouterr().out)
    assert {"clagd", "flat_bm25", "recency", "full_tokens", "per_category"} <= set(out)


def test_arrivals_follow_sessions_or_batches():
    turns = [
        Turn(f"D{s}:{i}", f"t{s}.{i}", f"2024-01-0{s}T00:00:{i:02d}Z", s)
        for s in (1, 2)
        for i in range(3)
    ]
    assert [[t.dia_id for t in g] for g in arrivals(turns)] == [
        ["D1:0", "D1:1", "D1:2"],
        ["D2:0", "D2:1", "D2:2"],
    ]
    assert [len(g) for g in arrivals(turns, 4)] == [4, 2]


def test_precision_and_wasted_tokens():
    t = Tally((2, 4))
    # 4 returned, the 1st and 3rd are evidence; lines of 10, 30, 10, 50 tokens
    t.add(["a", "x", "b", "y"], {"a", "b", "c"}, 100, 1.0, [10, 30, 10, 50])
    s = t.summary()
    assert s["precision@2"] == 0.5 and s["precision@4"] == 0.5
    assert s["recall@4"] == round(2 / 3, 4)
    assert s["wasted_tokens"] == 80.0  # 80 of the 100 line tokens are not evidence
    t.add([], {"a"}, 0, 1.0, [])
    assert t.summary()["precision@4"] == 0.25  # nothing returned counts as 0


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_stream_protocol_against_a_real_daemon(tmp_path, capsys):
    """Turns go into a running daemon's inbox session by session; its own triggers
    organize them (a session after every 20 new memories); questions go over the socket."""
    path = _small_file(tmp_path, sessions=3, questions=8)
    res = run_protocols(path, ("stream", "batch"), ks=(5, 10), progress=True, max_questions=8)
    stream, batch = res["protocols"]["stream"], res["protocols"]["batch"]
    assert res["protocol"] == "stream" and stream["clagd"] == res["clagd"]
    n_turns = len(conversation_turns(json.loads(path.read_text())[0]))
    org = stream["organization"]
    assert org["memories"] == n_turns == batch["organization"]["memories"]
    assert org["sessions"] >= 2  # the daemon's memory-count trigger fired between arrivals
    assert org["clusters"] > 0
    assert batch["organization"]["sessions"] == 1
    for r in (stream, batch):
        assert KEYS <= set(r["clagd"]) and r["questions"] == 8
        assert r["clagd"]["hit@10"] > 0.5
    same = ("recall@10", "precision@10", "tokens", "wasted_tokens")
    assert [stream["flat_bm25"][k] for k in same] == [batch["flat_bm25"][k] for k in same]
    err = capsys.readouterr().err
    assert "locomo stream: arrival 3/3" in err and "8/8 questions" in err
    table = format_table(res)
    assert "clagd stream" in table and "clagd batch" in table and "routed" in table


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_stream_in_batches_of_n_turns(tmp_path):
    path = _small_file(tmp_path, sessions=2, questions=3)
    n_turns = len(conversation_turns(json.loads(path.read_text())[0]))
    res = run_eval(path, progress=False, protocol="stream", batch=60)
    assert res["batch"] == 60 and res["organization"]["memories"] == n_turns


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_in_process_stream_replica_answers_like_the_daemon(tmp_path):
    """`pipeline="stream-inprocess"` (the engine in time order with the daemon's own
    triggers, for quick ablations) organizes and answers exactly as the real daemon."""
    path = _small_file(tmp_path, sessions=3, questions=8)
    kw = {"ks": (5, 10), "progress": False, "max_questions": 8, "protocol": "stream"}
    daemon = run_eval(path, **kw)
    replica = run_eval(path, pipeline="stream-inprocess", **kw)
    assert replica["protocol"] == "stream-inprocess"
    assert replica["organization"] == daemon["organization"]
    assert replica["organization"]["sessions"] >= 2
    for key in ("recall@5", "recall@10", "precision@10", "tokens"):
        assert replica["clagd"][key] == daemon["clagd"][key]


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
@pytest.mark.parametrize("protocol", ["batch", "stream"])
def test_a_run_in_a_scope_scores_as_the_default_one(tmp_path, protocol):
    """`clagd eval --scope NAME`: every turn stored and every question asked in one
    scope; the figures are the default scope's (scopes change no ranking)."""
    path = _small_file(tmp_path, sessions=2, questions=6)
    kw = {"ks": (5, 10), "progress": False, "protocol": protocol}
    plain = run_eval(path, **kw)
    scoped = run_eval(path, scope="alice", **kw)
    assert scoped["organization"] == plain["organization"]
    for key in ("recall@5", "recall@10", "precision@10", "tokens"):
        assert scoped["clagd"][key] == plain["clagd"][key]
        for baseline in ("flat_bm25", "recency"):  # they answer with the scope's ids too
            assert scoped[baseline][key] == plain[baseline][key]
    assert plain["clagd"]["recall@10"] > 0 and plain["flat_bm25"]["recall@10"] > 0


@pytest.mark.skipif(not DATA.exists(), reason="LoCoMo dev file not available")
def test_a_model_session_longer_than_the_deadline_is_waited_for(tmp_path, fake):
    """A model's session may run longer than the eval's deadline (the 1.5B model named one
    conversation's clusters for 16 minutes; the stream eval gave up after 300 s): while a
    session runs the wait goes on, and the deadline counts from its end."""
    from competent import Competent

    from clagd.config import Config
    from clagd.eval.stream import DaemonPipeline

    competent = Competent()
    fake.default = lambda req: {"content": competent(req)["content"], "delay": 2.5}
    config = Config()
    config.backend.ollama.host = fake.url
    config.backend.gate.enabled = False  # trusted: it plans and names, every call slow
    path = _small_file(tmp_path, sessions=2, questions=1)
    turns = conversation_turns(json.loads(path.read_text())[0])
    pipe = DaemonPipeline(config, "ollama", deadline=4.0)
    try:
        pipe.ingest(turns)
        st = pipe.client.status().raw
        assert st["counters"]["sessions"] >= 1 and len(fake.chats) >= 2
        assert st["last_session"]["seconds"] > 4.0, st["last_session"]
    finally:
        pipe.close()


def _pids_with(text: str) -> list[int]:
    """The processes whose command line names `text` (read from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(int(d.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_sigterm_stops_the_eval_and_its_daemon(tmp_path: Path) -> None:
    """A `kill` of `clagd eval locomo` (stream) stops the conversation's daemon and removes
    its temporary store, as Ctrl-C does; it used to leave the daemon running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.eval.test_answers import _conversation

    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([_conversation("one")]))
    runs = tmp_path / "tmp"
    runs.mkdir()
    env = {**os.environ, "TMPDIR": str(runs)}
    cmd = [sys.executable, "-m", "clagd", "eval", "locomo", str(data), "--batch", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        stores: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            stores = [p for p in runs.glob("clagd-eval-*") if (p / "s.sock").exists()]
            if stores:
                break
            time.sleep(0.05)
        assert stores and proc.poll() is None, "the stream daemon never started"
        daemons = _pids_with(str(stores[0] / "store"))
        assert daemons, "no daemon process names the eval's store"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert not _pids_with(str(stores[0] / "store")), "the daemon outlived the eval"
        assert not stores[0].exists(), "the temporary store was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _pids_with(str(runs)):
            os.kill(pid, signal.SIGKILL)
