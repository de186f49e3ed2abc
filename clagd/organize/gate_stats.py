"""Confidence intervals for the competence gate's scores: a seeded paired bootstrap over the
gate set's items (probes, memory pairs, queries, checks).

Each task's items carry the model's outcome and the lexical organizer's on the same item;
a resample draws items with replacement and scores both with the task's statistic (an
accuracy, a pairwise F1, a balanced accuracy), so the interval of the difference is the
paired one. A task is allowed only when the lower bound clears what it needs (the gate's
`_decide`): one lucky answer no longer turns a verdict.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
ROUNDS = 1000
LEVEL = 0.95
SEED = 20261202


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def __str__(self) -> str:
        return f"[{self.low:.2f}, {self.high:.2f}]"


def _quantiles(values: list[float]) -> Interval:
    values.sort()
    tail = (1 - LEVEL) / 2
    lo = values[int(tail * (len(values) - 1))]
    hi = values[int(round((1 - tail) * (len(values) - 1)))]
    return Interval(round(lo, 3), round(hi, 3))


def bootstrap(
    items: Sequence[T],
    model: Callable[[Sequence[T]], float],
    lexical: Callable[[Sequence[T]], float],
    rounds: int = ROUNDS,
    seed: int = SEED,
) -> tuple[Interval, Interval]:
    """(interval of the model's score, interval of model minus lexical), both at LEVEL."""
    if not items:
        return Interval(0.0, 0.0), Interval(0.0, 0.0)
    rng = random.Random(seed)
    n = len(items)
    scores, diffs = [], []
    for _ in range(rounds):
        draw = [items[rng.randrange(n)] for _ in range(n)]
        m = model(draw)
        scores.append(m)
        diffs.append(m - lexical(draw))
    return _quantiles(scores), _quantiles(diffs)


def accuracy(hits: Sequence[bool]) -> float:
    return sum(hits) / len(hits) if hits else 0.0


def pair_f1_of(pairs: Sequence[tuple[bool, bool]]) -> float:
    """Pairwise F1 from (predicted same group, truly same group) pairs."""
    tp = sum(p and t for p, t in pairs)
    fp = sum(p and not t for p, t in pairs)
    fn = sum(t and not p for p, t in pairs)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def balanced(said_truth: Sequence[tuple[bool, bool]]) -> float:
    """Balanced accuracy of yes/no verdicts (0.5 when one class is missing)."""
    pos = [s for s, t in said_truth if t]
    neg = [not s for s, t in said_truth if not t]
    if not pos or not neg:
        return 0.5
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2
