"""The `none` backend: no model, the lexical organizer (`clagd.organizer`) makes the plan.

It is what `auto` falls back to when no SLM answers, and what a session falls back to when an
SLM plan fails validation twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory

if TYPE_CHECKING:
    from clagd.organize.plan import Plan

NAME = "none"
MODEL = "lexical"


def lexical_plan(
    memories: Sequence[Memory],
    clusters: Iterable[Cluster],
    cfg: SessionConfig,
    now: str | None = None,
) -> Plan:
    """The organizer's plan for `memories` (the sample) among `clusters`."""
    from clagd.organize.lexical import organize

    return organize(list(memories), list(clusters), cfg, now=now)
