"""A model's answer, in aliases, mapped back to a `Plan` of real ids."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from clagd.organize.plan import NEW_PREFIX, REASON_MAX_CHARS, Plan, PlanCluster, PlanError
from clagd.organize.plan_schema import Aliases

_NEW_ALIAS_RE = re.compile(r"^N(\d+)$")


def parse_plan(data: Mapping[str, Any], aliases: Aliases) -> Plan:
    """Map an answer in aliases back to real ids. Raises PlanError listing every problem
    (unknown alias, a memory assigned twice, a cluster described twice, wrong types)."""
    problems: list[str] = []
    plan = Plan(reason=str(data.get("reason") or "")[:REASON_MAX_CHARS])
    plan.clusters = _parse_clusters(data.get("clusters"), aliases, problems)
    plan.assign = _parse_assign(data.get("assign"), aliases, problems)
    plan.conflicts = _parse_conflicts(data.get("conflicts"), aliases, problems)
    if problems:
        raise PlanError(problems)
    return plan


def _ref_of(alias: Any, aliases: Aliases, where: str, problems: list[str]) -> str | None:
    """The cluster ref an alias names (`C<i>`: an existing cluster, `N<k>`: a new one)."""
    if isinstance(alias, str):
        if alias in aliases.clusters:
            return aliases.clusters[alias]
        m = _NEW_ALIAS_RE.match(alias)
        if m and 1 <= int(m.group(1)) <= aliases.max_new:
            return NEW_PREFIX + m.group(1)
    problems.append(f"{where}: unknown cluster id {alias!r}")
    return None


def _parse_clusters(value: Any, aliases: Aliases, problems: list[str]) -> list[PlanCluster]:
    out: list[PlanCluster] = []
    seen_refs: set[str] = set()
    for i, item in enumerate(_as_list(value, "clusters", problems)):
        if not isinstance(item, Mapping):
            problems.append(f"clusters[{i}] is not an object")
            continue
        ref = _ref_of(item.get("id"), aliases, f"clusters[{i}]", problems)
        if ref is None:
            continue
        if ref in seen_refs:
            problems.append(f"cluster {item.get('id')} is described twice")
            continue
        seen_refs.add(ref)
        merge = []
        for alias in _as_list(item.get("merge"), f"clusters[{i}].merge", problems):
            if alias in aliases.clusters:
                merge.append(aliases.clusters[alias])
            else:
                problems.append(f"clusters[{i}].merge: unknown cluster id {alias!r}")
        out.append(
            PlanCluster(
                ref=ref,
                name=" ".join(str(item.get("name") or "").split()),
                description=" ".join(str(item.get("description") or "").split()),
                tags=[str(t).strip() for t in (item.get("tags") or []) if str(t).strip()],
                merge_from=merge,
            )
        )
    return out


def _parse_assign(raw: Any, aliases: Aliases, problems: list[str]) -> dict[str, str]:
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    else:  # also accept [{"memory": "M1", "cluster": "C2"}, ...]
        pairs = [
            (p.get("memory"), p.get("cluster")) if isinstance(p, Mapping) else (None, None)
            for p in _as_list(raw, "assign", problems)
        ]
    assign: dict[str, str] = {}
    for malias, calias in pairs:
        if malias not in aliases.memories:
            problems.append(f"assign: unknown memory id {malias!r}")
            continue
        mid = aliases.memories[malias]
        ref = _ref_of(calias, aliases, f"assign.{malias}", problems)
        if ref is None:
            continue
        if mid in assign:
            problems.append(f"memory {malias} is assigned twice")
            continue
        assign[mid] = ref
    return assign


def _parse_conflicts(value: Any, aliases: Aliases, problems: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, item in enumerate(_as_list(value, "conflicts", problems)):
        if not isinstance(item, Mapping):
            continue
        newer, older = item.get("newer"), item.get("older")
        if newer in aliases.memories and older in aliases.memories and newer != older:
            out.append((aliases.memories[newer], aliases.memories[older]))
        elif newer != older:
            problems.append(f"conflicts[{i}]: unknown memory id {newer!r} or {older!r}")
    return out


def _as_list(value: Any, where: str, problems: list[str]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} is not a list")
        return []
    return value
