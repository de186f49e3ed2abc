"""The JSON schema a model's plan answers in: every id it may name is an enumerated alias."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from clagd.organize.plan import (
    DESCRIPTION_MAX_CHARS,
    MAX_TAGS,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    REASON_MAX_CHARS,
    TAG_MAX_CHARS,
)
from clagd.slm.schema import array, closed_object, one_of, string


@dataclass
class Aliases:
    memories: dict[str, str]  # "M1" -> memory id
    clusters: dict[str, str]  # "C1" -> cluster id
    max_new: int

    @classmethod
    def make(cls, memory_ids: Iterable[str], cluster_ids: Iterable[str], max_new: int) -> Aliases:
        return cls(
            {f"M{i}": mid for i, mid in enumerate(memory_ids, 1)},
            {f"C{i}": cid for i, cid in enumerate(cluster_ids, 1)},
            max_new,
        )

    @property
    def new(self) -> list[str]:
        return [f"N{i}" for i in range(1, self.max_new + 1)]


def build_schema(
    memory_aliases: list[str], cluster_aliases: list[str], max_new: int
) -> dict[str, Any]:
    """The JSON schema of an answer; every id the model may name is enumerated.

    `assign` is an object with one required key per memory, so a constrained decoder cannot
    drop a memory or assign one twice.
    """
    targets = list(cluster_aliases) + [f"N{i}" for i in range(1, max_new + 1)]
    cluster_props: dict[str, Any] = {
        "id": one_of(targets),
        # 2-5 words; a grammar-constrained decoder cannot produce anything else
        "name": string(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS),
        "description": string(max_length=DESCRIPTION_MAX_CHARS),
        "tags": array(string(min_length=1, max_length=TAG_MAX_CHARS), MAX_TAGS),
    }
    if cluster_aliases:
        cluster_props["merge"] = array(one_of(cluster_aliases), len(cluster_aliases))
    memory = one_of(memory_aliases)
    return closed_object(
        {
            "clusters": array(
                closed_object(cluster_props, ["id", "name", "description", "tags"]),
                len(targets),
            ),
            "assign": closed_object({m: one_of(targets) for m in memory_aliases}),
            "conflicts": array(
                closed_object({"newer": memory, "older": memory}),
                max(1, len(memory_aliases) // 2),
            ),
            "reason": string(max_length=REASON_MAX_CHARS),
        }
    )
