"""`validate_plan`: everything wrong with a plan against the store, before anything changes."""

from __future__ import annotations

from collections.abc import Iterable

from clagd.model import Cluster
from clagd.organize.plan import (
    DESCRIPTION_MAX_CHARS,
    NAME_MAX_CHARS,
    NAME_MAX_WORDS,
    NAME_MIN_WORDS,
    NEW_PREFIX,
    Plan,
    PlanCluster,
    StateLike,
    ref_scopes,
)
from clagd.store.frozen import ClusterNames, name_key


def name_problem(name: str) -> str | None:
    words = name.split()
    if not words:
        return "a cluster has no name"
    if len(name) > NAME_MAX_CHARS:
        return f"name {name!r} is longer than {NAME_MAX_CHARS} characters"
    if not NAME_MIN_WORDS <= len(words) <= NAME_MAX_WORDS:
        return f"name {name!r} should have {NAME_MIN_WORDS}-{NAME_MAX_WORDS} words"
    return None


def validate_plan(
    plan: Plan, sampled_ids: Iterable[str], state: StateLike, names: ClusterNames | None = None
) -> list[str]:
    """Everything wrong with `plan` against the store as it is now; [] means apply it.
    `names`: the hot clusters' names as `state` has them (the writer keeps them), or made."""
    sampled = set(sampled_ids)
    problems: list[str] = []
    declared, merged = _check_clusters(plan.clusters, state, problems)
    _check_assign(plan.assign, sampled, declared, merged, state, problems)
    names = ClusterNames(state.clusters) if names is None else names
    _check_names(declared, merged, state, names, problems, ref_scopes(plan, state))
    for newer, older in plan.conflicts:
        if newer not in sampled or older not in sampled:
            problems.append(f"conflict names a memory outside the sample ({newer}, {older})")
    found = state.locate_many(mid for pair in plan.dedupe for mid in pair) if plan.dedupe else {}
    for keep, drop in plan.dedupe:
        if keep == drop or keep not in found or drop not in found:
            problems.append(f"cannot merge memory {drop} into {keep}")
    _check_scopes(plan, state, problems)
    return problems


def _check_scopes(plan: Plan, state: StateLike, problems: list[str]) -> None:
    """A cluster never mixes scopes (`clagd.scopes`): no memory goes to, and no cluster is
    merged into, a cluster of another scope; no conflict or dedupe pairs two scopes."""
    for ref, scopes in ref_scopes(plan, state).items():
        if len(scopes) > 1:
            problems.append(
                f"cluster {ref} would mix scopes {', '.join(sorted(scopes))} "
                "(a cluster holds memories of one scope)"
            )
    pairs = [("conflict", a, b) for a, b in plan.conflicts]
    pairs += [("dedupe", a, b) for a, b in plan.dedupe]
    if not pairs:
        return
    live = state.locate_many([mid for _, a, b in pairs for mid in (a, b)])
    for what, a, b in pairs:
        if a in live and b in live and live[a][2].scope != live[b][2].scope:
            problems.append(f"{what} pairs memories of two scopes ({a}, {b})")


def _check_clusters(
    clusters: list[PlanCluster], state: StateLike, problems: list[str]
) -> tuple[dict[str, PlanCluster], dict[str, str]]:
    """The clusters the plan declares (ref -> cluster) and merges away (cid -> into ref)."""
    declared: dict[str, PlanCluster] = {}
    merged: dict[str, str] = {}
    for pc in clusters:
        if pc.ref in declared:
            problems.append(f"cluster {pc.ref} is described twice")
            continue
        declared[pc.ref] = pc
        if not pc.ref.startswith(NEW_PREFIX) and pc.ref not in state.clusters:
            problems.append(f"unknown cluster {pc.ref}")
            continue
        _check_fields(pc, state.clusters.get(pc.ref), problems)
        for src in pc.merge_from:
            if src == pc.ref:
                continue
            if src not in state.clusters:
                problems.append(f"merge of unknown cluster {src}")
            elif state.clusters[src].pinned:
                problems.append(f"cluster {state.clusters[src].name!r} is pinned")
            elif src in merged:
                problems.append(f"cluster {src} is merged twice")
            else:
                merged[src] = pc.ref
    for src in merged:
        if src in declared:
            problems.append(f"cluster {src} is both merged away and kept")
    return declared, merged


def _check_fields(pc: PlanCluster, existing: Cluster | None, problems: list[str]) -> None:
    if existing is None or existing.name != pc.name:
        if p := name_problem(pc.name):
            problems.append(p)
    if len(pc.description) > DESCRIPTION_MAX_CHARS:
        problems.append(f"description of {pc.name!r} is too long")
    if existing is not None and existing.pinned and existing.name != pc.name:
        problems.append(f"cluster {existing.name!r} is pinned and cannot be renamed")


def _check_assign(
    assign: dict[str, str],
    sampled: set[str],
    declared: dict[str, PlanCluster],
    merged: dict[str, str],
    state: StateLike,
    problems: list[str],
) -> None:
    """Every sampled memory goes somewhere that exists, and every new cluster gets one."""
    live = state.locate_many(assign)
    for mid, ref in assign.items():
        if mid not in sampled:
            problems.append(f"unknown memory {mid} (not in the sample)")
        elif mid not in live:
            problems.append(f"memory {mid} is no longer in the store")
        if ref.startswith(NEW_PREFIX):
            if ref not in declared:
                problems.append(f"memory {mid} goes to {ref}, which has no name")
        elif ref not in state.clusters:
            problems.append(f"memory {mid} goes to unknown cluster {ref}")
        elif ref in merged:
            problems.append(f"memory {mid} goes to {ref}, which is merged away")
    for mid in sorted(sampled - set(assign)):
        problems.append(f"memory {mid} was dropped (not assigned)")
    used = set(assign.values())
    for ref, pc in declared.items():
        if ref.startswith(NEW_PREFIX) and ref not in used:
            problems.append(f"new cluster {pc.name!r} is empty")


def _check_names(
    declared: dict[str, PlanCluster],
    merged: dict[str, str],
    state: StateLike,
    names: ClusterNames,
    problems: list[str],
    scope_of: dict[str, set[str]],
) -> None:
    """Names distinct among the plan and against every hot cluster the plan leaves as is,
    within one scope (two users may each have a cluster "Food Allergies")."""
    left = set(declared) | set(merged)  # the clusters whose names the plan sets or ends
    planned: set[tuple[str, str]] = set()
    for ref, pc in declared.items():
        key = name_key(min(scope_of.get(ref) or {""}), pc.name)
        if key in planned or names.bearing(*key) - left:
            problems.append(f"duplicate cluster name {pc.name!r}")
        planned.add(key)
    for _key, ids in sorted(names.shared().items()):
        kept = sorted(ids - left)
        if len(kept) > 1:  # clusters the plan leaves as they are share a name
            problems.append(f"duplicate cluster name {state.clusters[kept[-1]].name!r}")
