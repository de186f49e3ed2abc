"""Realistic synthetic memories for benchmarks: LoCoMo dialog turns recombined."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo" / "locomo-dev.json"


def find_data() -> Path:
    for cand in (
        *([Path(os.environ["CLAGD_LOCOMO_DEV"])] if os.environ.get("CLAGD_LOCOMO_DEV") else []),
        DATA,
        Path(__file__).resolve().parents[1] / "shared" / "data" / "locomo" / "locomo-dev.json",
        Path("/work/shared/data/locomo/locomo-dev.json"),
    ):
        if cand.exists():
            return cand
    raise SystemExit(f"LoCoMo data not found (looked at {DATA}; set CLAGD_LOCOMO_DEV)")


def turns() -> list[str]:
    out = []
    for conv in json.loads(find_data().read_text()):
        for key, value in conv["conversation"].items():
            if key.startswith("session_") and isinstance(value, list):
                out.extend(f"{t['speaker']}: {t['text']}" for t in value)
    return out


def memories(n: int, seed: int = 1) -> list[str]:
    """n distinct memory texts, each one turn plus the body of another."""
    base = turns()
    rnd = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        a, b = rnd.choice(base), rnd.choice(base)
        text = f"{a} {b.split(': ', 1)[-1]}"
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def queries(n: int, seed: int = 2) -> list[str]:
    qs = [q["question"] for conv in json.loads(find_data().read_text()) for q in conv["qa"]]
    rnd = random.Random(seed)
    return [rnd.choice(qs) for _ in range(n)]
