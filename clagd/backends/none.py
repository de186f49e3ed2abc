"""The `none` backend: no model, the lexical organizer (`clagd.organizer`) makes the plan.

It is what `auto` falls back to when no SLM answers, and what a session falls back to when an
SLM plan fails validation twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..config import SessionConfig
from ..model import Cluster, Memory

if TYPE_CHECKING:
    from ..plan import Plan

NAME = "none"
MODEL = "lexical"


def lexical_plan(
    memories: Sequence[Memory],
    clusters: Iterable[Cluster],
    cfg: SessionConfig,
    now: str | None = None,
) -> Plan:
    """The organizer's plan for `memories` (the sample) among `clusters`."""
    from ..organizer import organize

    return organize(list(memories), list(clusters), cfg, now=now)
