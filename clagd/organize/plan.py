"""Plans: what a clustering session proposes, as types.

A plan covers a *sample* of memories. The SLM never sees real ids: it sees short aliases
(`M1..` memories, `C1..` existing clusters, `N1..` new clusters) that the JSON schema
enumerates (`plan_schema`), so a constrained decoder cannot invent an id; `plan_parse` maps
them back.

Safety comes in three layers: `plan_checks.validate_plan` rejects a plan before anything
changes, `plan_apply.apply_plan` only moves what the plan names, and
`plan_invariants.check_invariants` compares the store after the change with the set of
memories before it (the session reverts the commit if it fails). The size policy, a planner
that needs no model, is `size_policy` (beside the lexical organizer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from clagd.errors import ClagdError
from clagd.model import Cluster, Memory

NAME_MIN_WORDS = 2
NAME_MAX_WORDS = 5
NAME_MAX_CHARS = 60
DESCRIPTION_MAX_CHARS = 200
TAG_MAX_CHARS = 24
MAX_TAGS = 5
REASON_MAX_CHARS = 300
NEW_PREFIX = "new:"
NAME_PATTERN = "^[A-Za-z0-9']{1,20}( [A-Za-z0-9']{1,20}){1,4}$"


class PlanError(ClagdError):
    """A plan that cannot be parsed or applied; `problems` lists every reason."""

    code = "plan"

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems) if problems else "invalid plan")
        self.problems = list(problems)


@dataclass
class PlanCluster:
    ref: str  # an existing cluster id (keep/rename), or "new:<k>" (create)
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    merge_from: list[str] = field(default_factory=list)  # existing cids folded into ref


@dataclass
class Plan:
    clusters: list[PlanCluster] = field(default_factory=list)
    assign: dict[str, str] = field(default_factory=dict)  # memory id -> ref
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (newer mid, older mid)
    reason: str = ""
    # near-identical memories: (kept mid, dropped mid); the dropped text is kept as provenance
    # in the kept memory's metadata["merged"] and in the commit body
    dedupe: list[tuple[str, str]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.clusters or self.assign or self.conflicts or self.dedupe)

    def summary(self, state: StateLike | None = None) -> list[str]:
        """One line per cluster the plan touches, for the commit body."""
        counts: dict[str, int] = {}
        for ref in self.assign.values():
            counts[ref] = counts.get(ref, 0) + 1
        lines = []
        for pc in self.clusters:
            old = state.clusters.get(pc.ref) if state is not None else None
            if pc.ref.startswith(NEW_PREFIX):
                verb = "create"
            elif old is not None and old.name != pc.name:
                verb = f"rename {old.name!r} ->"
            else:
                verb = "keep"
            line = f"- {verb} {pc.name!r}: {counts.get(pc.ref, 0)} sampled memories"
            if pc.merge_from:
                names = [
                    state.clusters[c].name if state and c in state.clusters else c
                    for c in pc.merge_from
                ]
                line += f"; merges {', '.join(repr(n) for n in names)}"
            lines.append(line)
        for newer, older in self.conflicts:
            lines.append(f"- conflict: {newer} supersedes {older}")
        return lines

    def commit_text(
        self, state: StateLike, sid: str, label: str, n: int, notes: list[str]
    ) -> tuple[str, str]:
        """The commit's subject and body: what session `sid` (`label`) did to `n` sampled
        memories, each cluster it touched, the plan's reason and `notes`."""
        new = sum(1 for pc in self.clusters if pc.ref.startswith(NEW_PREFIX))
        merges = sum(len(pc.merge_from) for pc in self.clusters)
        subject = f"cluster: session {sid} ({label}): {n} memories, {new} new clusters"
        if merges:
            subject += f", {merges} merged"
        body = self.summary(state)
        if self.reason:
            body += ["", f"Reason: {self.reason}"]
        if notes:
            body += ["", *notes]
        return subject, "\n".join(body)


class StateLike(Protocol):
    """The part of `store.StoreState` plans need (a fake in tests is fine)."""

    clusters: dict[str, Cluster]
    archived: dict[str, Cluster]
    unsorted: dict[str, list[Memory]]

    def locate(self, mid: str) -> tuple[str, str] | None: ...

    def memory(self, mid: str) -> Memory | None: ...

    def locate_many(self, mids: Iterable[str]) -> dict[str, tuple[str, str, Memory]]: ...


def ref_scopes(plan: Plan, state: StateLike) -> dict[str, set[str]]:
    """The scopes each cluster of the plan would hold (ref -> scopes): an existing one's
    own, plus those of the memories assigned and the clusters merged into it. More than one
    is a plan that mixes scopes (`plan_checks` refuses it); a new cluster takes the one."""
    out: dict[str, set[str]] = {}
    for pc in plan.clusters:
        have = state.clusters.get(pc.ref)
        got = out.setdefault(pc.ref, set())
        if have is not None:
            got.add(have.scope)
        got.update(state.clusters[src].scope for src in pc.merge_from if src in state.clusters)
    live = state.locate_many(plan.assign)
    for mid, ref in plan.assign.items():
        if mid in live:
            out.setdefault(ref, set()).add(live[mid][2].scope)
        if ref in state.clusters:
            out.setdefault(ref, set()).add(state.clusters[ref].scope)
    return out


class Toucher(Protocol):
    """The writer context's file marking (`ctx.touch_cluster`, `ctx.touch_shard`)."""

    def touch_cluster(self, cid: str) -> None: ...

    def touch_shard(self, name: str) -> None: ...
