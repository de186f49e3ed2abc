"""The prompt's few-shot examples, and answers that copy them.

A small model that cannot do the task often returns the prompt's first example word for word
("user comfort at home", the same reason) for a conversation about something else; a
validator model happily says yes to it. So clagd reads the examples out of the prompt the
model was given (`prompts/organize.md`, user-editable) and refuses answers that copy their
names, descriptions, reasons or assignment pattern, whatever the model or the gate says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clagd.text import tokenize

# descriptions and reasons this close (token Jaccard) to an example's count as copied
NEAR_COPY = 0.8


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w' ]+", " ", text.casefold()).split())


def _jaccard(a: str, b: str) -> float:
    x, y = set(tokenize(a)), set(tokenize(b))
    return len(x & y) / len(x | y) if x and y else 0.0


@dataclass
class Examples:
    """What the few-shot answers say, normalized for comparison."""

    names: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)  # descriptions and reasons
    assigns: list[dict[str, str]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.names or self.texts or self.assigns)


def prompt_examples(template: str) -> Examples:
    """Every JSON answer in the prompt (a line that parses as a JSON object with "assign")."""
    ex = Examples()
    for line in template.splitlines():
        line = line.strip()
        if not line.startswith("{") or '"assign"' not in line or "$" in line:
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        for c in data.get("clusters") or []:
            if isinstance(c, dict):
                ex.names.add(_norm(str(c.get("name", ""))))
                if c.get("description"):
                    ex.texts.append(str(c["description"]))
        if data.get("reason"):
            ex.texts.append(str(data["reason"]))
        if isinstance(data.get("assign"), dict):
            ex.assigns.append({str(k): str(v) for k, v in data["assign"].items()})
    ex.names.discard("")
    return ex


def _pattern(assign: Mapping[str, str], keys: list[str]) -> list[int]:
    """The grouping of `keys` as first-seen group numbers ({M1: N2, M2: N2} -> [0, 0])."""
    seen: dict[str, int] = {}
    return [seen.setdefault(assign[k], len(seen)) for k in keys]


def _near(text: str, ex: Examples) -> bool:
    return any(_norm(text) == _norm(t) or _jaccard(text, t) >= NEAR_COPY for t in ex.texts)


def _copied_texts(data: Mapping[str, Any], ex: Examples) -> list[str]:
    out: list[str] = []
    for c in data.get("clusters") or []:
        if not isinstance(c, Mapping):
            continue
        name = _norm(str(c.get("name", "")))
        if name and name in ex.names:
            out.append(f"name {c.get('name')!r} is copied from the prompt's examples")
        desc = str(c.get("description") or "")
        if desc and _near(desc, ex):
            out.append(f"description {desc[:60]!r} is copied from the prompt's examples")
    reason = str(data.get("reason") or "")
    if reason and _near(reason, ex):
        out.append(f"reason {reason[:60]!r} is copied from the prompt's examples")
    return out


def _copied_assign(
    assign: Mapping[str, Any], ex: Examples, reference: Mapping[str, Any] | None
) -> list[str]:
    out: list[str] = []
    for i, pattern in enumerate(ex.assigns, 1):
        keys = list(pattern)
        if len(set(pattern.values())) < 2 or any(assign.get(k) != pattern[k] for k in keys):
            continue
        whole = set(assign) == set(keys)
        wrong = False
        if reference is not None and all(k in reference for k in keys):
            truth = {k: str(reference[k]) for k in keys}
            wrong = _pattern(pattern, keys) != _pattern(truth, keys)
        if whole or wrong:
            out.append(f"the assignment copies example {i} ({', '.join(keys)})")
    return out


def copied(
    data: Mapping[str, Any],
    ex: Examples,
    reference: Mapping[str, Any] | None = None,
) -> list[str]:
    """What an answer (in aliases, as the model wrote it) copies from the examples.

    Names: equal to an example's. Descriptions and the reason: equal or nearly (token
    Jaccard >= 0.8). Assignment: the example's literal assignment on its memories (M1..Mk)
    when that is the whole answer, or - with labels (`reference`: alias -> true group, the
    gate's case) - when the true grouping of those memories is a different one.
    """
    out = _copied_texts(data, ex)
    assign = data.get("assign")
    if isinstance(assign, Mapping):
        out += _copied_assign(assign, ex, reference)
    return out
