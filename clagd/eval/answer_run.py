"""The answer eval's run: conversations in, contexts retrieved, the model asked, scored.

Per conversation that has a sampled question: the turns go into clagd through the chosen
protocol (organized lexically), every question is retrieved for clagd and flat BM25 first,
then the model answers system by system and format by format (see `answers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from clagd.config import Config
from clagd.eval.answers import (
    ANSWER_SYSTEMS,
    DEFAULT_FORMAT,
    FORMATS,
    AnswerCache,
    Answerer,
    AnswerEvalError,
    Conversation,
    Scores,
    Shown,
    backend_for,
    by_cluster,
    cache_path,
    fit,
    messages,
    render,
    sample_questions,
)
from clagd.eval.data import Question, conversation_turns, load_conversations
from clagd.eval.locomo import Baselines, Progress, pipeline_factory
from clagd.eval.metrics import Tally
from clagd.eval.pipelines import Organization, Pipeline, add_organization
from clagd.model import memory_id
from clagd.slm.base import Backend


class _Retrieved:
    """clagd's and flat BM25's memories for each question, with recall and session@k."""

    def __init__(self, k: int) -> None:
        self.items: dict[str, list[list[Shown]]] = {"clagd": [], "flat_bm25": []}
        self.tallies = {s: Tally((k,)) for s in self.items}

    def collect(
        self, pipe: Pipeline, base: Baselines, cv: Conversation, qs: list[Question]
    ) -> None:
        by_dia = {t.dia_id: memory_id(t.content) for t in cv.turns}
        session_of = {memory_id(t.content): t.session for t in cv.turns}
        for q in qs:
            res = pipe.query(q.text, base.kmax)
            pipe.settle()
            mems = res["memories"]
            clagd = [
                Shown(m["content"], m["created_at"], m.get("cluster_name") or "") for m in mems
            ]
            flat_ids = base.flat_bm25(q.text)[0]
            self.items["clagd"].append(by_cluster(clagd))
            self.items["flat_bm25"].append([cv.shown[i] for i in flat_ids])
            evidence = {by_dia[d] for d in q.evidence if d in by_dia}
            for name, ids in (("clagd", [m["id"] for m in mems]), ("flat_bm25", flat_ids)):
                if evidence:
                    self.tallies[name].add(ids, evidence, 0, 0.0, None, session_of)

    def summary(self) -> dict[str, dict[str, float]]:
        keep = ("recall@", "session@", "hit@")
        return {
            s: {k: v for k, v in t.summary().items() if k.startswith(keep)}
            for s, t in self.tallies.items()
        }


class AnswerRun:
    """One answer eval: a model, the formats, k and the budget, a cache."""

    def __init__(
        self,
        backend: Backend,
        config: Config,
        cache: AnswerCache,
        formats: Sequence[str] = (DEFAULT_FORMAT,),
        k: int = 10,
        budget: int = 800,
        cached_only: bool = False,
    ) -> None:
        for fmt in formats:
            if fmt not in FORMATS:
                raise AnswerEvalError(f"unknown context format {fmt!r} ({', '.join(FORMATS)})")
        self.backend, self.config = backend, config
        self.answerer = Answerer(backend, config, cache)
        self.formats, self.k, self.budget = tuple(formats), k, budget
        self.scores = Scores(self.formats)
        self.retrieved = _Retrieved(k)
        self.cached_only = cached_only  # score only what the cache answers (per system)
        self.organized: Organization = {}  # what organizing did, summed over conversations

    def conversation(
        self, conv: dict[str, Any], qs: list[Question], pipe: Pipeline, bar: Progress
    ) -> None:
        cv = Conversation(conversation_turns(conv))
        base = Baselines(cv.turns, self.config, self.k)
        first = len(self.retrieved.items["clagd"])
        try:
            pipe.ingest(cv.turns)
            self.retrieved.collect(pipe, base, cv, qs)
            add_organization(self.organized, pipe.organization())
        finally:
            pipe.close()
        bar.line(f"{len(cv.turns)} turns in, {len(qs)} questions retrieved; asking the model")
        recents = {fmt: cv.recent(self.backend, fmt) for fmt in self.formats}

        def asked(fmt: str, system: str, i: int) -> list[dict[str, str]]:
            shown = self._shown(system, first + i, recents[fmt], fmt)
            return messages(render(shown, fmt), qs[i].text)

        for fmt in self.formats:
            for system in ANSWER_SYSTEMS:
                for i, q in enumerate(qs):
                    msgs = asked(fmt, system, i)
                    if not self.cached_only or self.answerer.cached(msgs):
                        self.scores.add(fmt, system, q, self.answerer.ask(msgs), first + i)
                    bar.step()

    def _shown(self, system: str, i: int, recent: list[Shown], fmt: str) -> list[Shown]:
        if system == "none":
            return []
        if system == "recent":
            return recent
        return fit(self.retrieved.items[system][i], self.budget, fmt)

    def summary(self) -> dict[str, Any]:
        by_format = self.scores.summary()
        main = DEFAULT_FORMAT if DEFAULT_FORMAT in self.formats else self.formats[0]
        return {
            "answers": by_format[main],
            "paired": {s: asdict(d) for s, d in self.scores.paired(main).items()},
            "format": main,
            "formats": by_format,
            "retrieval": self.retrieved.summary(),
            "model": self.answerer.model,
            "backend": self.backend.name,
            "k": self.k,
            "budget": self.budget,
            "window": self.backend.context_tokens,
            "asked": self.answerer.asked,
            "organization": self.organized,
        }


def run_answers(
    path: str | Path,
    config: Config,
    kind: str | None = None,
    n: int | None = None,
    seed: int = 0,
    formats: Sequence[str] = (DEFAULT_FORMAT,),
    k: int = 10,
    budget: int = 800,
    protocol: str = "stream",
    pipeline: str = "auto",
    progress: bool = True,
    cache: Path | None = None,
    cached_only: bool = False,
    organizer: Config | None = None,
) -> dict[str, Any]:
    """The answer eval on a LoCoMo-format file; the `--json` object. `organizer`: a config
    whose backend organizes the stores clagd answers from (as `clagd eval locomo --backend
    KIND --config` does for recall: the competence gate decides what it may do); None: the
    lexical organizer."""
    convs = load_conversations(path)
    picked = sample_questions(convs, n, seed)
    asked = sum(len(q) for q in picked)
    bar = Progress(
        asked * len(ANSWER_SYSTEMS) * len(formats), progress, "locomo answers", "answers"
    )
    make = pipeline_factory(protocol, pipeline, None, bar.line if progress else None)
    organizing = organizer.backend.kind if organizer else "none"
    backend = backend_for(config, kind)
    try:
        answers = AnswerCache(cache or cache_path())
        run = AnswerRun(backend, config, answers, formats, k, budget, cached_only)
        for i, (conv, qs) in enumerate(zip(convs, picked), 1):
            if qs:
                bar.line(f"conversation {i}/{len(convs)}")
                run.conversation(conv, qs, make(organizer or config, organizing), bar)
    finally:
        backend.close()
    out = run.summary()
    out |= {"questions": asked, "seed": seed, "protocol": protocol, "sampled": n is not None}
    out["organizer"] = organizing if organizer else "lexical"
    if cached_only:  # each system scored on the questions the cache answers for it
        out["questions"] = max(row["n"] for row in out["answers"].values())
        out["sample"] = asked
    return out


def format_answer_table(result: dict[str, Any]) -> str:
    """F1, BLEU-1, prompt tokens and seconds per system; F1 per category; per format."""
    cols = ("f1", "bleu1", "prompt_tokens", "seconds", "errors")
    lines = [f"{'system':<12}" + "".join(f"{c:>15}" for c in cols)]
    for s, row in result["answers"].items():
        lines.append(f"{s:<12}" + "".join(f"{row[c]:>15}" for c in cols))
    lines.append(
        f"{result['questions']} questions, model {result['model']}, format {result['format']}, "
        f"k {result['k']}, budget {result['budget']}, window {result['window']}, "
        f"{result['asked']} asked (the rest from the cache)"
    )
    for s, d in result["paired"].items():
        lines.append(
            f"clagd minus {s}: {d['diff']:+.2f} F1 [{d['low']:+.2f}, {d['high']:+.2f}] "
            f"(paired bootstrap 95%, {d['n']} questions)"
        )
    lines.append("")
    lines.append("F1 per category:")
    cats = result["answers"]["clagd"]["per_category"]
    for cat, row in cats.items():
        cells = "".join(
            f" {s}={result['answers'][s]['per_category'][cat]['f1']:<7}" for s in ANSWER_SYSTEMS
        )
        lines.append(f"  {cat} {row['name']:<12} n={row['n']:<4}{cells}")
    if len(result["formats"]) > 1:
        lines.append("")
        lines.append("F1 per context format:")
        for fmt, systems in result["formats"].items():
            cells = "".join(f" {s}={systems[s]['f1']:<7}" for s in ANSWER_SYSTEMS)
            lines.append(f"  {fmt:<10}{cells}")
    lines.append("")
    for s, row in result["retrieval"].items():
        lines.append(f"retrieval {s:<10}" + "  ".join(f"{k} {v}" for k, v in row.items()))
    return "\n".join(lines)
