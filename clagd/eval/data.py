"""LoCoMo-format data for the eval: dialog turns as memories, QA items with their evidence.

Only the harness knows which dialog turn became which memory (through `memory_id(content)`)
and which LoCoMo session a turn belongs to (that decides only *when* a turn is dropped into
the inbox in the stream protocol); the store sees content and created_at, nothing the
dataset adds (no dia_id, no session, no category).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
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
    session: int = 0  # the LoCoMo session: when the turn arrives, never a feature


@dataclass
class Question:
    text: str
    category: int
    evidence: list[str]  # dia ids
    answer: str = ""  # the gold answer (a year or count is kept as text)


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
            stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            turns.append(Turn(str(t.get("dia_id", "")), content, stamp, n))
    return turns


def questions(conv: dict[str, Any]) -> list[Question]:
    """The QA items of categories 1-4 that name evidence (category 5 is adversarial)."""
    out = []
    for qa in conv.get("qa", []):
        cat = qa.get("category")
        ev = parse_evidence(qa.get("evidence") or [])
        if cat in CATEGORIES and ev and qa.get("question"):
            out.append(Question(str(qa["question"]), int(cat), ev, str(qa.get("answer", ""))))
    return out


def arrivals(turns: list[Turn], batch: int | None = None) -> Iterator[list[Turn]]:
    """The turns in time order as they reach the inbox: one LoCoMo session at a time, or
    `batch` turns at a time (a batch may span two sessions, as a timer-driven writer's
    would)."""
    ordered = sorted(turns, key=lambda t: t.created_at)
    if batch:
        for i in range(0, len(ordered), batch):
            yield ordered[i : i + batch]
        return
    group: list[Turn] = []
    for t in ordered:
        if group and t.session != group[-1].session:
            yield group
            group = []
        group.append(t)
    if group:
        yield group


def load_conversations(path: str | Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [data] if isinstance(data, dict) else list(data)
