"""`clagd eval locomo FILE --answer`: what the context does to a real SLM's answers.

Each sampled question is answered by the same model with the same prompt four times, once
per context: clagd's (its query path under the chosen protocol, organized by the lexical
organizer: the model only answers), flat BM25's top k, no memory at all, and the most
recent turns of the conversation that fit the model's window (what an agent without memory
would send). clagd's and flat BM25's memories are cut to the same estimated token budget.
Answers are scored with LoCoMo's F1 and BLEU-1 (`answer_metrics`), per category and
overall, with the prompt's tokens (the model's own count) and the seconds per answer.

Answers are cached in `$XDG_CACHE_HOME/clagd/answers/answers.jsonl`, keyed by the model,
its settings and the exact messages (prompt and context): a rerun after a retrieval change
asks the model only what changed, and an interrupted run resumes where it stopped.

Questions are a stratified sample (by category, proportional, chosen by `seed`) when
`questions` is smaller than the file's. The asking order keeps one system's prompts
together per conversation, so a llama.cpp model reuses the shared prefix (the recent
history is the same for every question of a conversation).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clagd.config import Config
from clagd.errors import BackendError, ClagdError
from clagd.eval.answer_metrics import bleu1, locomo_f1
from clagd.eval.data import CATEGORIES, Question, Turn, questions
from clagd.model import day_label, memory_id, normalize_content
from clagd.organize.gate_stats import bootstrap
from clagd.slm.base import Backend, select_backend
from clagd.slm.schema import closed_object, string
from clagd.text import estimate_tokens

ANSWER_SYSTEMS = ("clagd", "flat_bm25", "none", "recent")
FORMATS = ("labelled", "dated", "compact")
DEFAULT_FORMAT = "dated"
ANSWER_TOKENS = 96  # max_tokens of an answer call, and what the window keeps free for it
MAX_ANSWER_CHARS = 200
WINDOW_RATIO = 1.4  # estimated -> model tokens, on the safe side (TokenCalibration's start)
SYSTEM_PROMPT = (
    "You answer questions about a long conversation between two people, using the "
    "memories of it that you are given. Answer with a short phrase, in exact words from "
    "the memories whenever possible. When a question asks when, use the dates shown."
)
ANSWER_SCHEMA = closed_object({"answer": string(max_length=MAX_ANSWER_CHARS)})


class AnswerEvalError(ClagdError):
    """The answer eval cannot run: no model answers, or its options are inconsistent."""


# --------------------------------------------------------------------------- contexts
@dataclass(frozen=True)
class Shown:
    """One memory as a context shows it."""

    content: str
    created_at: str
    cluster: str = ""  # clagd's cluster name; the baselines have none


def day(stamp: str) -> str:
    """ "2023-05-08T13:56:00Z" -> "8 May 2023" (unparsable stamps are shown as they are)."""
    return day_label(stamp) or stamp


def line(item: Shown, fmt: str) -> str:
    """`labelled`: today's `[Memory · cluster]` lines; `dated`: the same with the memory's
    day; `compact`: the day in brackets and the content, no label."""
    if fmt == "compact":
        return f"({day(item.created_at)}) {item.content}"
    label = ["Memory"] + ([item.cluster] if item.cluster else [])
    if fmt == "dated":
        label.append(day(item.created_at))
    elif fmt != "labelled":
        raise AnswerEvalError(f"unknown context format {fmt!r} ({', '.join(FORMATS)})")
    return f"[{' · '.join(label)}] {item.content}"


def render(items: Sequence[Shown], fmt: str) -> str:
    return "\n".join(line(i, fmt) for i in items)


def fit(items: Sequence[Shown], budget: int, fmt: str) -> list[Shown]:
    """The leading items whose lines fit `budget` estimated tokens (0: no limit)."""
    out: list[Shown] = []
    used = 0
    for item in items:
        used += estimate_tokens(line(item, fmt)) + 1
        if budget and used > budget:
            break
        out.append(item)
    return out


def by_cluster(items: Sequence[Shown]) -> list[Shown]:
    """clagd's order: hits grouped by cluster, groups in the order of their best hit."""
    groups: dict[str, list[Shown]] = {}
    for item in items:
        groups.setdefault(item.cluster, []).append(item)
    return [i for g in groups.values() for i in g]


def messages(context: str, question: str) -> list[dict[str, str]]:
    memories = context if context else "(none)"
    user = f"Memories:\n{memories}\n\nQuestion: {question}\nShort answer:"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------- answers
def cache_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ if env is None else env)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clagd" / "answers" / "answers.jsonl"


class AnswerCache:
    """Answers by sha256 of (model, settings, messages), one JSON line each, appended as
    they come (a killed run loses at most the answer being written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            for raw in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(raw)
                    self.entries[entry["key"]] = entry
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a kill: asked again

    @staticmethod
    def key(model: str, msgs: list[dict[str, str]]) -> str:
        blob = json.dumps([model, ANSWER_SCHEMA, msgs], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, entry: dict[str, Any]) -> None:
        self.entries[entry["key"]] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    seconds: float
    cached: bool = False
    error: str = ""


def model_id(backend: Backend, config: Config) -> str:
    """What the cache keys an answer by besides the messages: backend, model, settings."""
    b = config.backend
    settings = {
        "llamacpp": (b.llamacpp.temperature, b.llamacpp.seed, b.llamacpp.chat_format),
        "openai": (b.openai.temperature, b.openai.seed),
        "ollama": (b.ollama.temperature, b.ollama.seed),
    }.get(backend.name, ())
    return f"{backend.name}:{backend.model}:{settings}:{ANSWER_TOKENS}"


class Answerer:
    """One model answering, through the cache."""

    def __init__(self, backend: Backend, config: Config, cache: AnswerCache) -> None:
        self.backend, self.cache = backend, cache
        self.model = model_id(backend, config)
        self.asked = 0

    def cached(self, msgs: list[dict[str, str]]) -> bool:
        return self.cache.get(AnswerCache.key(self.model, msgs)) is not None

    def ask(self, msgs: list[dict[str, str]]) -> Answer:
        key = AnswerCache.key(self.model, msgs)
        hit = self.cache.get(key)
        if hit is not None:
            return Answer(hit["answer"], int(hit["prompt_tokens"]), float(hit["seconds"]), True)
        self.asked += 1
        t0 = time.monotonic()
        try:
            res = self.backend.chat_json(msgs, ANSWER_SCHEMA)
        except BackendError as exc:  # counted, not cached: the next run asks again
            return Answer("", exc.prompt_tokens, time.monotonic() - t0, error=str(exc))
        text = str(res.data.get("answer", "")).strip()
        entry: dict[str, Any] = {"key": key, "model": self.model, "answer": text}
        entry |= {"prompt_tokens": res.prompt_tokens, "seconds": round(res.seconds, 3)}
        self.cache.put(entry)
        return Answer(text, res.prompt_tokens, entry["seconds"])


# --------------------------------------------------------------------------- scores
@dataclass
class AnswerTally:
    f1: list[float] = field(default_factory=list)
    bleu: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    errors: int = 0
    cached: int = 0

    def add(self, answer: Answer, q: Question) -> None:
        self.f1.append(locomo_f1(answer.text, q.answer, q.category))
        self.bleu.append(bleu1(answer.text, q.answer))
        self.prompt_tokens.append(answer.prompt_tokens)
        self.seconds.append(answer.seconds)
        self.errors += bool(answer.error)
        self.cached += answer.cached

    def summary(self) -> dict[str, float | int]:
        def mean(xs: Sequence[float], scale: float = 1.0, nd: int = 2) -> float:
            return round(scale * sum(xs) / len(xs), nd) if xs else 0.0

        return {
            "n": len(self.f1),
            "f1": mean(self.f1, 100),
            "bleu1": mean(self.bleu, 100),
            "prompt_tokens": mean(self.prompt_tokens, nd=1),
            "seconds": mean(self.seconds, nd=2),
            "errors": self.errors,
            "cached": self.cached,
        }


@dataclass(frozen=True)
class PairedDiff:
    """clagd's F1 minus another system's on the questions both answered (F1 points), with
    the 95% interval of a paired bootstrap over those questions (organize/gate_stats.py):
    a difference whose interval holds 0 is not one this sample can tell."""

    n: int
    diff: float
    low: float
    high: float


class Scores:
    """Tallies per (format, system), overall and per category, and each question's F1 per
    (format, system) for the paired intervals."""

    def __init__(self, formats: Sequence[str]) -> None:
        self.formats = tuple(formats)
        self.all = {(f, s): AnswerTally() for f in formats for s in ANSWER_SYSTEMS}
        self.cat = {
            (f, s, c): AnswerTally() for f in formats for s in ANSWER_SYSTEMS for c in CATEGORIES
        }
        self.by_question: dict[tuple[str, str], dict[int, float]] = {key: {} for key in self.all}

    def add(self, fmt: str, system: str, q: Question, answer: Answer, qid: int) -> None:
        """`qid`: the question's number in the run, the same for every system."""
        self.all[(fmt, system)].add(answer, q)
        self.cat[(fmt, system, q.category)].add(answer, q)
        self.by_question[(fmt, system)][qid] = self.all[(fmt, system)].f1[-1]

    def paired(self, fmt: str, base: str = "clagd") -> dict[str, PairedDiff]:
        """`base` against every other system, question by question."""
        mine = self.by_question[(fmt, base)]
        out: dict[str, PairedDiff] = {}
        for other in ANSWER_SYSTEMS:
            if other == base:
                continue
            theirs = self.by_question[(fmt, other)]
            pairs = [(100 * mine[q], 100 * theirs[q]) for q in sorted(mine.keys() & theirs)]
            if not pairs:
                continue
            _, iv = bootstrap(
                pairs,
                lambda d: sum(a for a, _ in d) / len(d),
                lambda d: sum(b for _, b in d) / len(d),
            )
            diff = sum(a - b for a, b in pairs) / len(pairs)
            out[other] = PairedDiff(len(pairs), round(diff, 2), round(iv.low, 2), round(iv.high, 2))
        return out

    def system(self, fmt: str, system: str) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.all[(fmt, system)].summary())
        out["per_category"] = {
            str(c): {"name": CATEGORIES[c], **self.cat[(fmt, system, c)].summary()}
            for c in CATEGORIES
            if self.cat[(fmt, system, c)].f1
        }
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        return {f: {s: self.system(f, s) for s in ANSWER_SYSTEMS} for f in self.formats}


# --------------------------------------------------------------------------- sampling
def sample_questions(
    convs: Sequence[dict[str, Any]], n: int | None, seed: int
) -> list[list[Question]]:
    """Per conversation, the questions asked: all of them, or a sample of `n` stratified by
    category (proportional, largest remainders), chosen by `seed`, in file order. With one
    seed, a larger sample holds the smaller one (each stratum is shuffled once and cut), so
    a run can grow from the answers cached by a smaller one."""
    every = [(ci, qi, q) for ci, c in enumerate(convs) for qi, q in enumerate(questions(c))]
    chosen: Iterable[tuple[int, int, Question]] = every
    if n is not None and n < len(every):
        rng = random.Random(seed)
        strata = {c: [e for e in every if e[2].category == c] for c in CATEGORIES}
        quota = {c: n * len(s) / len(every) for c, s in strata.items()}
        take = {c: int(q) for c, q in quota.items()}
        for c in sorted(quota, key=lambda c: take[c] - quota[c])[: n - sum(take.values())]:
            take[c] += 1
        for c in CATEGORIES:  # shuffled once: a larger sample holds the smaller ones
            rng.shuffle(strata[c])
        chosen = sorted(e for c, s in strata.items() for e in s[: take[c]])
    out: list[list[Question]] = [[] for _ in convs]
    for ci, _qi, q in chosen:
        out[ci].append(q)
    return out


# --------------------------------------------------------------------------- contexts per conversation
@dataclass
class Conversation:
    """One conversation's memories as the baselines and the contexts need them."""

    turns: list[Turn]
    shown: dict[str, Shown] = field(default_factory=dict)  # memory id -> as shown

    def __post_init__(self) -> None:
        for t in self.turns:
            self.shown[memory_id(t.content)] = Shown(normalize_content(t.content), t.created_at)

    def recent(self, backend: Backend, fmt: str) -> list[Shown]:
        """The latest turns, in time order, that fit the model's window with the prompt
        and the answer (estimated on the safe side, then checked with the model's count)."""
        room = backend.context_tokens - ANSWER_TOKENS
        room -= int(estimate_tokens(messages("", "x " * 40)[1]["content"] + SYSTEM_PROMPT) * 2)
        items = list(self.shown.values())
        n, used = 0, 0.0
        for item in reversed(items):
            used += (estimate_tokens(line(item, fmt)) + 1) * WINDOW_RATIO
            if used > room:
                break
            n += 1
        while n > 0:
            tail = items[len(items) - n :]
            probe = messages(render(tail, fmt), "x " * 40)
            if backend.count_tokens(probe) + ANSWER_TOKENS <= backend.context_tokens:
                return tail
            n = int(n * 0.9)
        return []


def backend_for(config: Config, kind: str | None) -> Backend:
    """The answering model, with answers capped at ANSWER_TOKENS."""
    config = copy.deepcopy(config)
    if kind:
        config.backend.kind = kind  # type: ignore[assignment]
    if config.backend.kind == "none":
        raise AnswerEvalError("--answer needs a model: --backend llamacpp|ollama|openai|auto")
    config.backend.llamacpp.max_tokens = ANSWER_TOKENS
    config.backend.openai.max_tokens = ANSWER_TOKENS
    backend, why = select_backend(config)
    if backend is None:
        raise AnswerEvalError(f"no model answers: {why}")
    return backend
