"""The competence gate's verdict on one model: each task's scores with their intervals,
whether it is allowed, and what measuring cost (`organize.gate` measures and caches it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from clagd.config import GATE_TASKS as TASKS


@dataclass
class TaskScore:
    model: float
    lexical: float
    allowed: bool
    why: str
    items: int = 0  # probes, memory pairs, queries or checks scored
    interval: tuple[float, float] = (0.0, 0.0)  # the model's score, 95% bootstrap
    gain: tuple[float, float] = (0.0, 0.0)  # model minus lexical, 95% paired bootstrap


@dataclass
class GateResult:
    backend: str
    model: str
    key: str  # gate set + prompt + model: a cached result is reused only for the same key
    measured_at: str
    tasks: dict[str, TaskScore] = field(default_factory=dict)
    copies: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    # per task: calls, seconds, prompt_tokens, completion_tokens (for benchmarks and status)
    cost: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: int = 0  # calls not made: the gate's total time ran out (their items score 0)
    identity: str = ""  # what the user-wide cache keys the model by (its file's sha256)

    def allows(self, task: str) -> bool:
        t = self.tasks.get(task)
        return bool(t and t.allowed)

    def may_organize(self) -> bool:
        return self.allows("organize") and self.allows("name")

    def refused(self) -> str:
        """Why the model may not organize (empty when it may)."""
        return "; ".join(
            f"{k} {t.why}"
            for k, t in self.tasks.items()
            if k in ("organize", "name") and not t.allowed
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["allowed"] = [k for k in TASKS if self.allows(k)]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateResult:
        tasks = {}
        for k, v in (d.get("tasks") or {}).items():
            v = dict(v)
            for pair in ("interval", "gain"):
                if pair in v:
                    v[pair] = tuple(v[pair])
            tasks[k] = TaskScore(**v)
        known = {f for f in cls.__dataclass_fields__ if f != "tasks"}
        return cls(**{k: v for k, v in d.items() if k in known}, tasks=tasks)

    def lines(self) -> list[str]:
        took = f"{self.seconds:.0f} s, {self.calls} calls"
        if self.skipped:
            took += f", {self.skipped} not made in time"
        out = [f"{self.backend} {self.model} (measured {self.measured_at}, {took}):"]
        for k in TASKS:
            t = self.tasks.get(k)
            if t is not None:
                verdict = "allowed" if t.allowed else "refused"
                lo, hi = t.interval
                out.append(
                    f"  {k:<9} model {t.model:.2f} [{lo:.2f}, {hi:.2f}]  lexical {t.lexical:.2f}"
                    f"  n={t.items}  {verdict}: {t.why}"
                )
        out += [f"  copied: {c}" for c in self.copies[:5]]
        out += [f"  error: {e}" for e in self.errors[:5]]
        return out
