"""`check_invariants`: the store after a plan's commit against the memories before it."""

from __future__ import annotations

from collections.abc import Iterable

from clagd.model import Memory
from clagd.organize.plan import NAME_MAX_CHARS, StateLike
from clagd.organize.plan_checks import name_problem


def check_invariants(
    before_ids: set[str],
    state: StateLike,
    dropped: Iterable[str] = (),
    renamed: Iterable[str] = (),
) -> list[str]:
    """Every memory exactly once (none lost, none duplicated, none appeared), no empty
    cluster, no cluster holding another scope's memory, names distinct (within a scope)
    and within limits. `dropped` are ids a plan merged into a
    near-identical memory on purpose; `renamed` cluster ids get the 2-5 word check too."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    areas: list[tuple[str, Iterable[tuple[str, list[Memory]]]]] = [
        ("clusters", ((k, c.memories) for k, c in state.clusters.items())),
        ("archive", ((k, c.memories) for k, c in state.archived.items())),
        ("unsorted", state.unsorted.items()),
    ]
    for area, groups in areas:
        for key, mems in groups:
            for m in mems:
                where = f"{area}/{key}"
                if m.id in seen:
                    problems.append(f"memory {m.id} is in {seen[m.id]} and {where}")
                seen[m.id] = where
    expected = set(before_ids) - set(dropped)
    for mid in sorted(expected - set(seen)):
        problems.append(f"memory {mid} was lost")
    for mid in sorted(set(seen) - set(before_ids)):
        problems.append(f"memory {mid} appeared from nowhere")
    names: dict[tuple[str, str], str] = {}
    for area, table in (("clusters", state.clusters), ("archive", state.archived)):
        for cid, c in table.items():
            if c.id != cid:
                problems.append(f"cluster {cid} has id {c.id}")
            if any(m.scope != c.scope for m in c.memories):
                problems.append(f"cluster {c.name!r} ({cid}) mixes scopes")
            if not c.memories:
                problems.append(f"cluster {c.name!r} ({cid}) is empty")
            if not c.name.strip() or len(c.name) > NAME_MAX_CHARS:
                problems.append(f"cluster {cid} has an invalid name {c.name!r}")
            if area == "clusters":
                named = (c.scope, c.name.strip().casefold())
                if named in names:
                    problems.append(f"two clusters are named {c.name!r}")
                names[named] = cid
    for cid in renamed:
        rc = state.clusters.get(cid)
        if rc is not None and (p := name_problem(rc.name)):
            problems.append(p)
    return problems
