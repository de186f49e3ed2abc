"""`clagd eval locomo`: retrieval quality on LoCoMo-format conversations.

For each conversation: a fresh temporary store, every dialog turn ingested as a memory
(`<speaker>: <text>` plus ` [image: <caption>]`, created_at from the session date and time,
ten seconds apart per turn), one clustering pass with the chosen backend, then every QA item
of categories 1-4 that has evidence asked through the query path. Two baselines run on the
same memories in the same run: flat BM25 (rank-bm25's BM25Okapi, the same tokenizer) and a
recency window of the last k turns.

Only the harness knows which dialog turn became which memory (through `memory_id(content)`);
the store sees content and created_at, nothing the dataset adds (no dia_id, no sessions).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from rank_bm25 import BM25Okapi

from clagd.config import BackendKind, Config
from clagd.model import Memory, memory_id, normalize_content
from clagd.organize.lexical import organize_all
from clagd.retrieval.index import Index
from clagd.text import estimate_tokens, tokenize

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SYSTEMS = ("clagd", "flat_bm25", "recency")
TURN_SECONDS = 10
_EVIDENCE_RE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_DATE_RE = re.compile(
    r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.IGNORECASE
)


@dataclass
class Turn:
    dia_id: str
    content: str
    created_at: str


def parse_evidence(items: Sequence[Any]) -> list[str]:
    """Normalized dia ids ("D3:7") from LoCoMo evidence, lenient about its known quirks:
    "D:11:26", "D30:05", several ids in one string; anything without numbers is dropped."""
    out: list[str] = []
    for item in items or []:
        for a, b in _EVIDENCE_RE.findall(str(item)):
            did = f"D{int(a)}:{int(b)}"
            if did not in out:
                out.append(did)
    return out


def parse_session_time(text: str) -> datetime | None:
    """ "1:56 pm on 8 May, 2023" -> an aware UTC datetime (None when unparsable)."""
    m = _DATE_RE.search(text or "")
    if not m:
        return None
    hour, minute, ampm, day, month, year = m.groups()
    try:
        base = datetime.strptime(f"{day} {month[:3].title()} {year}", "%d %b %Y")
    except ValueError:
        return None
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    return base.replace(hour=h, minute=int(minute), tzinfo=timezone.utc)


def conversation_turns(conv: dict[str, Any]) -> list[Turn]:
    """Every dialog turn of one conversation as (dia_id, memory content, created_at)."""
    c = conv["conversation"]
    nums = sorted(
        int(k.split("_")[1])
        for k, v in c.items()
        if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
    )
    turns: list[Turn] = []
    last: datetime | None = None
    for n in nums:
        start = parse_session_time(str(c.get(f"session_{n}_date_time", "")))
        if start is None:  # keep order: continue after the previous session
            start = (last or datetime(2000, 1, 1, tzinfo=timezone.utc)) + timedelta(hours=1)
        for i, t in enumerate(c[f"session_{n}"]):
            content = f"{t.get('speaker', '')}: {t.get('text', '')}"
            if t.get("blip_caption"):
                content += f" [image: {t['blip_caption']}]"
            at = start + timedelta(seconds=TURN_SECONDS * i)
            last = at
            turns.append(Turn(str(t.get("dia_id", "")), content, at.strftime("%Y-%m-%dT%H:%M:%SZ")))
    return turns


def questions(conv: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    out = []
    for qa in conv.get("qa", []):
        cat = qa.get("category")
        ev = parse_evidence(qa.get("evidence") or [])
        if cat in CATEGORIES and ev and qa.get("question"):
            out.append((str(qa["question"]), int(cat), ev))
    return out


# --------------------------------------------------------------------------- pipelines
class InProcessPipeline:
    """Organizer -> clusters -> Index, without a store (for development and benchmarks)."""

    def __init__(self, config: Config, backend: BackendKind = "none") -> None:
        if backend != "none":
            raise ValueError("the in-process pipeline only runs the lexical organizer")
        self.config = config
        self.index = Index.for_config(config)

    def ingest(self, turns: list[Turn]) -> None:
        mems = list(
            {m.id: m for m in (Memory.new(t.content, t.created_at) for t in turns)}.values()
        )
        clusters = organize_all(mems, self.config.session)
        self.index = Index.build(
            {c.id: c for c in clusters}, [], self.config.retrieval, self.config.ingest
        )

    def query(self, text: str, k: int) -> dict[str, Any]:
        return self.index.search(text, max_memories=k, token_budget=0).to_dict()

    def close(self) -> None:
        pass


class EnginePipeline:
    """The real thing: a fresh store, the engine's ingest, one clustering session, the
    engine's query (the path the socket serves)."""

    def __init__(self, config: Config, backend: BackendKind = "none") -> None:
        from clagd.engine.core import Engine
        from clagd.engine.hooks import EngineHooks
        from clagd.organize.session import engine_session_runner
        from clagd.slm.manager import BackendManager
        from clagd.store.files import init_store

        self._tmp = tempfile.TemporaryDirectory(prefix="clagd-eval-")
        self.backend = backend
        self.config = copy.deepcopy(config)
        self.config.backend.kind = backend
        root, _ = init_store(Path(self._tmp.name) / "store")
        runner = engine_session_runner(BackendManager(self.config))
        self.engine = Engine(
            root, self.config, start=True, hooks=EngineHooks(session_runner=runner)
        )

    def ingest(self, turns: list[Turn]) -> None:
        self.engine.add([{"content": t.content, "created_at": t.created_at} for t in turns])
        # one clustering pass over the whole conversation
        self.config.session.sample_size = max(self.config.session.sample_size, len(turns))
        self.engine.recluster(trigger="eval", backend=self.backend)

    def query(self, text: str, k: int) -> dict[str, Any]:
        return self.engine.query(text, max_memories=k, token_budget=0)

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            self._tmp.cleanup()


def _pipeline_factory(kind: str) -> Callable[[Config, BackendKind], Any]:
    if kind == "inprocess":
        return InProcessPipeline
    if kind == "engine":
        return EnginePipeline
    try:
        from clagd.engine import core as engine  # noqa: F401
    except ImportError:
        return InProcessPipeline
    return EnginePipeline


# --------------------------------------------------------------------------- metrics
class _Tally:
    def __init__(self, ks: Sequence[int]) -> None:
        self.ks = ks
        self.recall: dict[int, list[float]] = {k: [] for k in ks}
        self.hit: dict[int, list[float]] = {k: [] for k in ks}
        self.tokens: list[int] = []
        self.ms: list[float] = []

    def add(self, ranked: list[str], evidence: set[str], tokens: int, ms: float) -> None:
        for k in self.ks:
            top = set(ranked[:k])
            found = len(top & evidence)
            self.recall[k].append(found / len(evidence))
            self.hit[k].append(1.0 if found else 0.0)
        self.tokens.append(tokens)
        self.ms.append(ms)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.ks:
            out[f"recall@{k}"] = round(float(np.mean(self.recall[k])), 4) if self.ms else 0.0
            out[f"hit@{k}"] = round(float(np.mean(self.hit[k])), 4) if self.ms else 0.0
        out["tokens"] = round(float(np.mean(self.tokens)), 1) if self.tokens else 0.0
        out["p50_ms"] = round(float(np.percentile(self.ms, 50)), 3) if self.ms else 0.0
        out["p99_ms"] = round(float(np.percentile(self.ms, 99)), 3) if self.ms else 0.0
        return out


def _plain_context(contents: list[str]) -> str:
    return "\n".join(f"[Memory] {c}" for c in contents)


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.label = ""
        self._shown = -1.0

    def step(self, n: int = 1, label: str | None = None) -> None:
        self.done += n
        if label is not None:
            self.label = label
        now = time.monotonic()
        if not self.enabled or (now - self._shown < 0.1 and self.done < self.total):
            return
        self._shown = now
        width = 30
        filled = int(width * self.done / self.total)
        sys.stderr.write(
            f"\rlocomo [{'#' * filled}{'.' * (width - filled)}] "
            f"{self.done}/{self.total} questions {self.label}   "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run_eval(
    path: str | Path,
    ks: Sequence[int] = (5, 10),
    backend: BackendKind = "none",
    progress: bool = True,
    config: Config | None = None,
    pipeline: str = "auto",
    max_conversations: int | None = None,
    max_questions: int | None = None,
) -> dict[str, Any]:
    """Evaluate retrieval on a LoCoMo-format file; returns the `--json` object.

    `pipeline`: "engine" (a real store per conversation), "inprocess" (organizer + index
    only), or "auto" (the engine when it is available). `max_*` take a slice (for tests).
    """
    ks = cutoffs(ks)
    kmax = max(ks)
    config = config or Config()
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = [data]
    convs = data[:max_conversations] if max_conversations else data
    make = _pipeline_factory(pipeline)
    work = [(c, questions(c)[:max_questions] if max_questions else questions(c)) for c in convs]
    bar = _Progress(sum(len(q) for _, q in work), progress)
    tallies = {s: _Tally(ks) for s in SYSTEMS}
    per_cat = {cat: {s: _Tally(ks) for s in SYSTEMS} for cat in CATEGORIES}
    full_tokens: list[int] = []
    n_memories = 0
    try:
        for ci, (conv, qs) in enumerate(work, 1):
            label = f"(conversation {ci}/{len(work)})"
            bar.step(0, label)
            turns = conversation_turns(conv)
            by_dia = {t.dia_id: memory_id(t.content) for t in turns}
            mems = list({memory_id(t.content): normalize_content(t.content) for t in turns}.items())
            n_memories += len(mems)
            full = estimate_tokens("\n".join(c for _, c in mems))
            ids = [mid for mid, _ in mems]
            contents = [c for _, c in mems]
            # same tokenizer and the same k1, b as clagd: only the organization differs
            rc = config.retrieval

            def tok(text: str, rc: Any = rc) -> list[str]:
                return tokenize(text, stem=rc.stemmer, stopwords=rc.stopwords)

            flat = BM25Okapi([tok(c) for c in contents], k1=rc.k1, b=rc.b)
            recent_ids = [mid for mid, _ in mems][-kmax:][::-1]
            recent_tokens = estimate_tokens(_plain_context([c for _, c in mems][-kmax:]))

            pipe = make(config, backend)
            try:
                pipe.ingest(turns)
                for text, cat, ev in qs:
                    evidence = {by_dia[d] for d in ev if d in by_dia}
                    if not evidence:
                        bar.step()
                        continue
                    t0 = time.perf_counter()
                    res = pipe.query(text, kmax)
                    ms = (time.perf_counter() - t0) * 1000
                    ranked = [m["id"] for m in res["memories"]]
                    got = [tallies["clagd"], per_cat[cat]["clagd"]]
                    for t in got:
                        t.add(ranked, evidence, int(res["tokens"]), ms)

                    t0 = time.perf_counter()
                    scores = flat.get_scores(tok(text))
                    top = np.argsort(-scores, kind="stable")[:kmax].tolist()
                    flat_ctx = _plain_context([contents[i] for i in top])
                    ms = (time.perf_counter() - t0) * 1000
                    flat_ranked = [ids[i] for i in top]
                    for t in (tallies["flat_bm25"], per_cat[cat]["flat_bm25"]):
                        t.add(flat_ranked, evidence, estimate_tokens(flat_ctx), ms)
                    for t in (tallies["recency"], per_cat[cat]["recency"]):
                        t.add(recent_ids, evidence, recent_tokens, 0.0)
                    full_tokens.append(full)
                    bar.step()
            finally:
                pipe.close()
    finally:
        bar.close()
    result: dict[str, Any] = {s: tallies[s].summary() for s in SYSTEMS}
    result["full_tokens"] = round(float(np.mean(full_tokens)), 1) if full_tokens else 0.0
    result["per_category"] = {
        str(cat): {
            "name": CATEGORIES[cat],
            "n": len(per_cat[cat]["clagd"].ms),
            **{s: per_cat[cat][s].summary() for s in SYSTEMS},
        }
        for cat in CATEGORIES
        if per_cat[cat]["clagd"].ms
    }
    result["questions"] = len(tallies["clagd"].ms)
    result["conversations"] = len(work)
    result["memories"] = n_memories
    result["backend"] = backend
    result["pipeline"] = make.__name__
    return result


def format_table(result: dict[str, Any], ks: Sequence[int] = (5, 10)) -> str:
    cols = [f"recall@{k}" for k in ks] + [f"hit@{k}" for k in ks]
    cols += ["tokens", "p50_ms", "p99_ms"]
    lines = [f"{'system':<10}" + "".join(f"{c:>11}" for c in cols)]
    for s in SYSTEMS:
        row = result[s]
        lines.append(f"{s:<10}" + "".join(f"{row.get(c, 0):>11}" for c in cols))
    lines.append(
        f"full history: {result['full_tokens']} tokens; {result['questions']} questions, "
        f"{result['conversations']} conversations, backend {result['backend']}"
    )
    rk = f"recall@{max(ks)}"
    lines.append("")
    lines.append(f"per category ({rk}):")
    for cat, row in result["per_category"].items():
        lines.append(
            f"  {cat} {row['name']:<12} n={row['n']:<4}"
            + "".join(f" {s}={row[s][rk]:<7}" for s in SYSTEMS)
        )
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


def eval_command(
    file: str,
    ks: Sequence[int] | str = (5, 10),
    as_json: bool = False,
    backend: BackendKind = "none",
) -> int:
    """What `clagd eval locomo FILE [--k 5,10] [--json] [--backend ...]` runs; exit code."""
    ks = cutoffs(ks)
    result = run_eval(file, ks=ks, backend=backend, progress=True)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result, ks))
    return 0


__all__ = [
    "run_eval",
    "cutoffs",
    "eval_command",
    "format_table",
    "parse_evidence",
    "parse_session_time",
]


def _main() -> None:  # pragma: no cover - `python -m clagd.eval_locomo FILE`
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--k", default="5,10")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pipeline", default="auto")
    args = ap.parse_args()
    ks = cutoffs(args.k)
    res = run_eval(args.file, ks=ks, pipeline=args.pipeline)
    print(json.dumps(res, indent=2) if args.json else format_table(res, ks))


if __name__ == "__main__":  # pragma: no cover
    _main()
