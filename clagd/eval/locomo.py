"""`clagd eval locomo`: retrieval quality on LoCoMo-format conversations.

Per conversation: a fresh store, every dialog turn a memory (`<speaker>: <text>` plus
` [image: <caption>]`, created_at from the session date and time, ten seconds apart per
turn), organized by one of the protocols (`stream`: a running daemon's inbox and triggers,
the way agents use clagd; `batch`: everything at once, one session), then every QA item of
categories 1-4 that has evidence asked through the query path. Two baselines run on the same
memories in the same run: flat BM25 (rank-bm25's BM25Okapi, the same tokenizer) and a
recency window of the last k turns.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rank_bm25 import BM25Okapi

from clagd.config import BackendKind, Config
from clagd.eval.data import (
    CATEGORIES,
    Question,
    Turn,
    conversation_turns,
    load_conversations,
    parse_evidence,
    parse_session_time,
    questions,
)
from clagd.eval.metrics import Tally
from clagd.eval.pipelines import (
    EnginePipeline,
    InProcessPipeline,
    Organization,
    Pipeline,
    StreamEnginePipeline,
    add_organization,
    line_tokens,
)
from clagd.model import memory_id, normalize_content
from clagd.scopes import DEFAULT_SCOPE
from clagd.text import estimate_tokens, tokenize

SYSTEMS = ("clagd", "flat_bm25", "recency")
PROTOCOLS = ("stream", "batch")
ORG_KEYS = ("sessions", "route_passes", "routed", "clusters", "unsorted", "memories")


# --------------------------------------------------------------------------- progress
class Progress:
    """Progress lines on stderr: one per conversation step, and a question counter."""

    def __init__(self, total: int, enabled: bool, prefix: str, unit: str = "questions") -> None:
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.prefix, self.unit = prefix, unit
        self._shown = -1.0

    def line(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"{self.prefix}: {text}\n")
            sys.stderr.flush()

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or (now - self._shown < 5.0 and self.done < self.total):
            return
        self._shown = now
        self.line(f"{self.done}/{self.total} {self.unit}")


# --------------------------------------------------------------------------- baselines
def _plain_context(contents: list[str]) -> str:
    return "\n".join(f"[Memory] {c}" for c in contents)


class Baselines:
    """Flat BM25 over all turns (the same tokenizer, k1 and b as clagd: only the
    organization differs) and the last k turns, on one conversation's memories."""

    def __init__(
        self, turns: list[Turn], config: Config, kmax: int, scope: str = DEFAULT_SCOPE
    ) -> None:
        """`scope`: the run's (the baselines answer with that scope's memory ids)."""
        by_id = {memory_id(t.content, scope): normalize_content(t.content) for t in turns}
        mems = list(by_id.items())
        self.ids = [mid for mid, _ in mems]
        self.contents = [c for _, c in mems]
        self.rc = config.retrieval
        self.kmax = kmax
        self.flat = BM25Okapi([self._tok(c) for c in self.contents], k1=self.rc.k1, b=self.rc.b)
        self.recent = list(range(len(mems)))[-kmax:][::-1]
        self.full_tokens = estimate_tokens("\n".join(self.contents))

    def _tok(self, text: str) -> list[str]:
        return tokenize(text, stem=self.rc.stemmer, stopwords=self.rc.stopwords)

    def _answer(self, rows: list[int], ms: float) -> tuple[list[str], int, float, list[int]]:
        texts = [self.contents[i] for i in rows]
        costs = [estimate_tokens(f"[Memory] {c}") + 1 for c in texts]
        return [self.ids[i] for i in rows], estimate_tokens(_plain_context(texts)), ms, costs

    def flat_bm25(self, text: str) -> tuple[list[str], int, float, list[int]]:
        t0 = time.perf_counter()
        scores = self.flat.get_scores(self._tok(text))
        top = np.argsort(-scores, kind="stable")[: self.kmax].tolist()
        return self._answer(top, (time.perf_counter() - t0) * 1000)

    def recency(self) -> tuple[list[str], int, float, list[int]]:
        return self._answer(self.recent, 0.0)


# --------------------------------------------------------------------------- one run
@dataclass
class _Run:
    ks: tuple[int, ...]
    tallies: dict[str, Tally] = field(default_factory=dict)
    per_cat: dict[int, dict[str, Tally]] = field(default_factory=dict)
    org: Organization = field(default_factory=dict)
    full_tokens: list[int] = field(default_factory=list)
    memories: int = 0
    conversations: int = 0

    def __post_init__(self) -> None:
        self.tallies = {s: Tally(self.ks) for s in SYSTEMS}
        self.per_cat = {c: {s: Tally(self.ks) for s in SYSTEMS} for c in CATEGORIES}
        self.org = dict.fromkeys(ORG_KEYS, 0)

    def add(
        self,
        system: str,
        cat: int,
        evidence: set[str],
        answer: tuple,
        session_of: dict[str, int] | None = None,
    ) -> None:
        ranked, tokens, ms, costs = answer
        for t in (self.tallies[system], self.per_cat[cat][system]):
            t.add(ranked, evidence, tokens, ms, costs, session_of)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {s: self.tallies[s].summary() for s in SYSTEMS}
        ft = self.full_tokens
        out["full_tokens"] = round(float(np.mean(ft)), 1) if ft else 0.0
        out["per_category"] = {
            str(cat): {
                "name": CATEGORIES[cat],
                "n": len(self.per_cat[cat]["clagd"]),
                **{s: self.per_cat[cat][s].summary() for s in SYSTEMS},
            }
            for cat in CATEGORIES
            if len(self.per_cat[cat]["clagd"])
        }
        out["organization"] = dict(self.org)
        out["questions"] = len(self.tallies["clagd"])
        out["conversations"] = self.conversations
        out["memories"] = self.memories
        return out


def pipeline_factory(
    protocol: str,
    pipeline: str,
    batch: int | None,
    log: Callable[[str], None] | None,
    scope: str = DEFAULT_SCOPE,
) -> Callable[[Config, BackendKind], Pipeline]:
    """What makes each conversation's pipeline; `scope`: where the run's memories and
    questions live (the store's protocols only; the development pipelines have none)."""
    if scope != DEFAULT_SCOPE and pipeline in ("inprocess", "stream-inprocess"):
        raise ValueError(f"pipeline {pipeline!r} has no scopes: use a protocol's")
    if pipeline == "inprocess":
        return InProcessPipeline
    if pipeline == "stream-inprocess":

        def replica(config: Config, backend: BackendKind) -> Pipeline:
            return StreamEnginePipeline(config, backend, batch=batch)

        return replica
    if protocol == "batch":

        def engine(config: Config, backend: BackendKind) -> Pipeline:
            return EnginePipeline(config, backend, scope=scope)

        return engine
    if protocol != "stream":
        raise ValueError(f"unknown protocol {protocol!r} (stream, batch)")
    from clagd.eval.stream import DaemonPipeline

    def make(config: Config, backend: BackendKind) -> Pipeline:
        return DaemonPipeline(config, backend, batch=batch, log=log, scope=scope)

    return make


def _ask(
    pipe: Pipeline,
    base: Baselines,
    qs: list[Question],
    by_dia: dict[str, str],
    run: _Run,
    bar: Progress,
    session_of: dict[str, int],
) -> None:
    """Every question through clagd and both baselines."""
    for q in qs:
        evidence = {by_dia[d] for d in q.evidence if d in by_dia}
        if not evidence:
            bar.step()
            continue
        t0 = time.perf_counter()
        res = pipe.query(q.text, base.kmax)
        ms = (time.perf_counter() - t0) * 1000
        pipe.settle()
        ranked = [m["id"] for m in res["memories"]]
        clagd = (ranked, int(res["tokens"]), ms, line_tokens(res))
        run.add("clagd", q.category, evidence, clagd, session_of)
        run.add("flat_bm25", q.category, evidence, base.flat_bm25(q.text), session_of)
        run.add("recency", q.category, evidence, base.recency(), session_of)
        run.full_tokens.append(base.full_tokens)
        bar.step()


def _conversation(
    conv: dict[str, Any],
    qs: list[Question],
    make: Callable[[Config, BackendKind], Pipeline],
    config: Config,
    backend: BackendKind,
    run: _Run,
    bar: Progress,
    scope: str = DEFAULT_SCOPE,
) -> None:
    """One conversation: a fresh pipeline, its turns in, its questions out (the turns'
    memory ids are those of `scope`)."""
    turns = conversation_turns(conv)
    by_dia = {t.dia_id: memory_id(t.content, scope) for t in turns}
    base = Baselines(turns, config, max(run.ks), scope)
    run.memories += len(base.ids)
    run.conversations += 1
    pipe = make(config, backend)
    try:
        t0 = time.monotonic()
        pipe.ingest(turns)
        org = pipe.organization()
        bar.line(
            f"conversation {run.conversations}: {len(turns)} turns organized in "
            f"{time.monotonic() - t0:.1f}s ({org['sessions']} sessions, {org['clusters']} "
            f"clusters, {org['routed']} routed, {org['unsorted']} unsorted)"
        )
        sessions = {memory_id(t.content, scope): t.session for t in turns}
        _ask(pipe, base, qs, by_dia, run, bar, sessions)
        add_organization(run.org, pipe.organization())
    finally:
        pipe.close()


def run_eval(
    path: str | Path,
    ks: Sequence[int] = (5, 10),
    backend: BackendKind = "none",
    progress: bool = True,
    config: Config | None = None,
    pipeline: str = "auto",
    max_conversations: int | None = None,
    max_questions: int | None = None,
    protocol: str = "stream",
    batch: int | None = None,
    scope: str = DEFAULT_SCOPE,
) -> dict[str, Any]:
    """Evaluate retrieval on a LoCoMo-format file with one protocol; the `--json` object.
    `scope`: the scope every memory and question of the run is in.

    `protocol`: "stream" (a running daemon's inbox) or "batch" (everything at once, one
    session). `pipeline="inprocess"` runs organizer + index without a store instead
    (development). `max_*` take a slice (for tests).
    """
    ks = cutoffs(ks)
    config = config or Config()
    convs = load_conversations(path)
    convs = convs[:max_conversations] if max_conversations else convs
    work = [(c, questions(c)[:max_questions] if max_questions else questions(c)) for c in convs]
    label = pipeline if pipeline in ("inprocess", "stream-inprocess") else protocol
    bar = Progress(sum(len(q) for _, q in work), progress, f"locomo {label}")
    make = pipeline_factory(protocol, pipeline, batch, bar.line if progress else None, scope)
    run = _Run(ks)
    for conv, qs in work:
        _conversation(conv, qs, make, config, backend, run, bar, scope)
    result = run.summary()
    result["backend"] = backend
    result["protocol"] = label
    result["batch"] = batch
    return result


def run_protocols(
    path: str | Path, protocols: Sequence[str] = PROTOCOLS, **kw: Any
) -> dict[str, Any]:
    """Several protocols on the same file: `{"protocols": {name: result}}` plus the first
    protocol's result at the top level (so one-protocol readers keep working)."""
    results = {p: run_eval(path, protocol=p, **kw) for p in protocols}
    first = results[protocols[0]]
    return {**first, "protocols": results}


# --------------------------------------------------------------------------- output
def _row(name: str, row: dict[str, Any], cols: list[str]) -> str:
    return f"{name:<14}" + "".join(f"{row.get(c, 0):>10}" for c in cols)


def format_table(result: dict[str, Any], ks: Sequence[int] = (5, 10)) -> str:
    """The systems side by side (clagd once per protocol), per category, organization."""
    runs = result.get("protocols") or {result.get("protocol", "clagd"): result}
    rk = f"recall@{max(ks)}"
    cols = [f"recall@{k}" for k in ks] + [f"session@{max(ks)}"] + [f"hit@{k}" for k in ks]
    cols += [f"precision@{max(ks)}", "tokens", "wasted_tokens", "p50_ms", "p99_ms"]
    short = [
        c.replace("precision", "prec").replace("wasted_tokens", "wasted").replace("session", "sess")
        for c in cols
    ]
    lines = [f"{'system':<14}" + "".join(f"{c:>10}" for c in short)]
    for name, res in runs.items():
        lines.append(_row(f"clagd {name}", res["clagd"], cols))
    first = next(iter(runs.values()))
    for s in SYSTEMS[1:]:
        lines.append(_row(s, first[s], cols))
    lines.append(
        f"full history: {first['full_tokens']} tokens; {first['questions']} questions, "
        f"{first['conversations']} conversations, backend {first['backend']}"
    )
    lines.append("")
    lines.append(f"per category ({rk}):")
    for cat, row in first["per_category"].items():
        cells = "".join(
            f" {n}={res['per_category'][cat]['clagd'][rk]:<7}" for n, res in runs.items()
        )
        base = "".join(f" {s}={row[s][rk]:<7}" for s in SYSTEMS[1:])
        lines.append(f"  {cat} {row['name']:<12} n={row['n']:<4}{cells}{base}")
    lines.append("")
    lines.append("organization (summed over conversations):")
    for name, res in runs.items():
        org = res["organization"]
        lines.append(f"  {name:<10}" + "  ".join(f"{k} {org.get(k, 0)}" for k in ORG_KEYS))
    return "\n".join(lines)


def cutoffs(ks: str | Iterable[int]) -> tuple[int, ...]:
    """The recall cut-offs (`--k`): "5,10" or integers, each kept once, ascending. Anything
    else (a non-integer, zero or less, none at all) is a ValueError saying so: a cut-off
    silently dropped would change what the table shows."""
    items: list[Any] = ks.split(",") if isinstance(ks, str) else list(ks)
    out: set[int] = set()
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        try:
            k = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"cut-offs are positive integers like 5,10, not {item!r}") from None
        if k <= 0:
            raise ValueError(f"cut-offs are positive integers like 5,10, not {k}")
        out.add(k)
    if not out:
        raise ValueError("no cut-off given (e.g. 5,10)")
    return tuple(sorted(out))


def _stop_on_sigterm() -> None:
    """SIGTERM (a `kill`, a systemd stop) ends an eval as Ctrl-C does: the conversation's
    daemon, its query processes and model worker are stopped and its temporary store is
    removed (each pipeline closes in a `finally`). Python's default dies at once and left
    them running."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def eval_command(
    file: str,
    ks: Sequence[int] | str = (5, 10),
    as_json: bool = False,
    backend: BackendKind | None = "none",
    protocol: str = "stream",
    batch: int | None = None,
    config: Config | None = None,
    answer: dict[str, Any] | None = None,
    scope: str = DEFAULT_SCOPE,
) -> int:
    """What `clagd eval locomo FILE [--protocol stream|batch|both] [--batch N] [--k 5,10]
    [--json] [--backend ...] [--config CLAGD_YAML] [--answer ...]` runs; the exit code.
    `answer` (the answer eval's options: questions, seed, formats, budget) switches from
    evidence recall to the answers of the `backend` model."""
    ks = cutoffs(ks)
    config = config or Config()
    _stop_on_sigterm()
    if answer is not None:
        if scope != DEFAULT_SCOPE:
            raise ValueError("--answer runs in the default scope: leave out --scope")
        return _answer_command(file, ks, as_json, backend, protocol, config, answer)
    protocols = PROTOCOLS if protocol == "both" else (protocol,)
    result = run_protocols(
        file, protocols, ks=ks, backend=backend or "none", progress=True, batch=batch,
        config=config, scope=scope,
    )  # fmt: skip
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result, ks))
    return 0


def _answer_command(
    file: str,
    ks: Sequence[int],
    as_json: bool,
    backend: str | None,
    protocol: str,
    config: Config,
    answer: dict[str, Any],
) -> int:
    from clagd.eval.answer_run import format_answer_table, run_answers
    from clagd.eval.answers import AnswerEvalError

    if protocol == "both":
        raise AnswerEvalError("--answer takes one protocol (stream or batch)")
    result = run_answers(file, config, backend, k=max(ks), protocol=protocol, **answer)
    print(json.dumps(result, indent=2) if as_json else format_answer_table(result))
    return 0


__all__ = [
    "run_eval",
    "run_protocols",
    "eval_command",
    "format_table",
    "parse_evidence",
    "parse_session_time",
    "conversation_turns",
]
