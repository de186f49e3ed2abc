"""The competence gate: a model organizes only what it measurably does better than the
lexical organizer.

Each backend + model is measured once on the labelled set shipped with clagd
(`gate_set.yaml`: synthetic memories with reference groupings and names) and the result is
cached in `<store>/.clagd/gate/`. Four tasks, each compared with what clagd does without a
model on the same items:

- route:    file new memories into existing clusters (or NEW); accuracy against the
            reference, versus the lexical router (the index's own BM25, `lexical_route`).
- organize: the real session prompt on unsorted memories; the plan must be sound (it
            parses and passes `validate_plan`), copy nothing from the prompt's examples, and
            its grouping (pairwise F1 against the reference) must beat the lexical
            organizer's.
- name:     each new cluster's name, used as a query over the reference groups, must find
            the group most of its memories belong to (names copied from the examples never
            do); versus the lexical organizer's names for the reference groups (each group
            named on its own, so that the baseline measures names, not grouping).
- judge:    the yes/no "does this memory belong here" validator; its balanced accuracy (the
            AUC of a yes/no answer) must reach JUDGE_MIN_AUC before its verdicts count.

A task is allowed when the model beats the lexical score by `backend.gate.margin` (naming:
reaches it, capped at 1.0). Sessions use a model's plans only when `organize` and `name` are
allowed; the session's semantic check asks the model only when `judge` is; retrieval
refinement asks it only when `route` is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast, get_args

from clagd.config import GATE_TASKS as TASKS
from clagd.config import BackendKind, Config, SessionConfig
from clagd.config import gate_tasks as task_list
from clagd.errors import BackendClosed, BackendError, ClagdError
from clagd.model import Cluster, Memory
from clagd.organize.examples import copied, prompt_examples
from clagd.organize.gate_cache import model_identity, user_gate_dir, write_json
from clagd.organize.gate_result import GateResult, TaskScore
from clagd.organize.gate_stats import accuracy, balanced, bootstrap, pair_f1_of
from clagd.organize.lexical import organize
from clagd.organize.naming import (
    PROMPT_HASH,
    Profile,
    naming_messages,
    naming_schema,
    read_profiles,
)
from clagd.organize.plan import PlanError
from clagd.organize.plan_checks import validate_plan
from clagd.organize.plan_parse import parse_plan
from clagd.organize.plan_schema import Aliases, build_schema
from clagd.organize.prompts import load_prompt, organize_messages
from clagd.organize.similarity import ClusterScores
from clagd.slm.base import Backend
from clagd.slm.schema import closed_object, one_of
from clagd.text import tokenize
from clagd.yamlio import load_yaml_file

log = logging.getLogger("clagd.gate")

GATE_SET = Path(__file__).with_name("gate_set.yaml")
JUDGE_MIN_AUC = 0.75
# how the gate scores (part of the cache key: a verdict scored another way is measured again)
# 2: the naming baseline names the reference groups (was the one lexical cluster's name)
# 3: the routing baseline is the index's BM25 (was IDF-weighted term overlap)
# 4: intervals; allowed on the lower bound; naming is its own call, scored on later questions
SCORING = 4
NEW = "NEW"
T0 = datetime(2025, 1, 6, 9, 0, tzinfo=timezone.utc)

ROUTE_PROMPT = (
    "You file new memories of an AI assistant into existing clusters. A memory belongs to "
    "the cluster it will be useful together with for a future task (group by use, not by "
    'shared words). Answer "NEW" when no cluster fits.\n\n'
    'Answer with JSON only: {"routes": {"R1": "C2", "R2": "NEW", ...}} with one entry per '
    "memory."
)


# -- the labelled set --------------------------------------------------------------------


@dataclass
class Scene:
    name: str
    clusters: list[Cluster]
    probes: list[tuple[str, str]]  # (memory text, true cluster name or NEW)
    plan: list[tuple[str, int]]  # (memory text, reference group), in arrival order
    groups: dict[int, str]
    queries: dict[int, list[str]] = field(default_factory=dict)  # later questions per group
    descriptions: dict[int, str] = field(default_factory=dict)  # reference profile sentences


def load_gate_set(path: Path = GATE_SET) -> tuple[list[Scene], str]:
    """The scenes and a hash of the file (part of the cache key)."""
    raw = path.read_bytes()
    data = load_yaml_file(path)
    scenes = []
    for s in data["scenes"]:
        clusters = []
        for i, c in enumerate(s["clusters"]):
            mems = [
                Memory.new(t, created_at=(T0 + timedelta(minutes=j)).isoformat())
                for j, t in enumerate(c["examples"])
            ]
            stamp = T0.isoformat()
            clusters.append(
                Cluster(f"gate{i}", c["name"], c["description"], [], stamp, stamp, mems)
            )
        scenes.append(
            Scene(
                s["name"],
                clusters,
                [(p["text"], p["cluster"]) for p in s["probes"]],
                [(p["text"], int(p["group"])) for p in s["plan"]],
                {int(k): str(v) for k, v in s["groups"].items()},
                {int(k): [str(q) for q in v] for k, v in (s.get("queries") or {}).items()},
                {int(k): str(v) for k, v in (s.get("descriptions") or {}).items()},
            )
        )
    return scenes, hashlib.sha256(raw).hexdigest()[:16]


# -- scores ------------------------------------------------------------------------------


def _idf(docs: list[list[str]]) -> dict[str, float]:
    df: Counter[str] = Counter(t for d in docs for t in set(d))
    n = len(docs)
    return {t: math.log((n + 1) / (d + 0.5)) for t, d in df.items()}


def overlap_rank(query: str, docs: list[str]) -> list[tuple[float, int]]:
    """Docs ranked by the IDF-weighted terms they share with `query` (best first)."""
    toks = [tokenize(d) for d in docs]
    idf = _idf(toks)
    q = set(tokenize(query))
    scored = [(sum(idf.get(t, 0.0) for t in q & set(d)), i) for i, d in enumerate(toks)]
    return sorted(scored, key=lambda x: (-x[0], x[1]))


def _profile(c: Cluster) -> str:
    return " ".join([c.name, c.description, *(m.content for m in c.memories)])


def lexical_route(text: str, clusters: list[Cluster]) -> str:
    """The lexical router's choice, scored by the index's own BM25 (`ClusterScores`: an
    index of these clusters, asked as a query asks it): the best cluster, or NEW when
    none matches at all. (The store's absolute `route_min_score` is never reached over a
    scene's five clusters, so only "no match" means NEW.)"""
    scores = ClusterScores({c.id: c for c in clusters}).scores(text)
    best = max(clusters, key=lambda c: scores.get(c.id, 0.0))
    return best.name if scores.get(best.id, 0.0) > 0 else NEW


def pair_outcomes(pred: Mapping[str, str], truth: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """(predicted same group, truly same group) for every pair of the reference's memories."""
    keys = sorted(truth)
    out = []
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            same_p = pred.get(a) is not None and pred.get(a) == pred.get(b)
            out.append((same_p, truth[a] == truth[b]))
    return out


def pair_f1(pred: Mapping[str, str], truth: Mapping[str, Any]) -> float:
    """Pairwise F1 of a grouping against the reference (1.0: the same partition)."""
    return pair_f1_of(pair_outcomes(pred, truth))


# -- measuring ---------------------------------------------------------------------------


class _Meter:
    """Calls the backend, counting calls, tokens (failed answers too) and errors; no call
    starts after `deadline` (time.monotonic()), and none may outlast it."""

    def __init__(
        self,
        backend: Backend,
        result: GateResult,
        timeout: float | None,
        deadline: float | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.backend, self.result, self.timeout = backend, result, timeout
        self.deadline = deadline
        self.task = self.where = ""  # the task, and "scene 2 of 4"
        self.progress, self.t0 = progress, time.monotonic()  # a line after each call

    def _count(self, seconds: float, prompt: int, completion: int, failed: bool = False) -> None:
        if self.progress is not None:
            so_far = f"{time.monotonic() - self.t0:.0f} s so far"
            how = f"{'failed' if failed else 'answered'} in {seconds:.1f} s ({so_far})"
            self.progress(f"gate: {self.task}, {self.where}: {how}")
        r = self.result
        r.calls += 1
        r.prompt_tokens += prompt
        r.completion_tokens += completion
        c = r.cost.setdefault(
            self.task, {"calls": 0, "seconds": 0.0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        c["calls"] += 1
        c["seconds"] = round(c["seconds"] + seconds, 2)
        c["prompt_tokens"] += prompt
        c["completion_tokens"] += completion

    def call(self, msgs: list[dict[str, str]], schema: dict[str, Any]) -> dict[str, Any] | None:
        timeout = self.timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left < 1.0:
                self.result.skipped += 1
                self.result.errors.append(f"{self.task}: not asked, the gate's time ran out")
                return None
            timeout = left if timeout is None else min(timeout, left)
        start = time.monotonic()
        try:
            res = self.backend.chat_json(msgs, schema, seed=42, timeout=timeout)
        except BackendClosed:  # clagd is stopping: no verdict, rather than a wrong one
            raise
        except BackendError as exc:
            self._count(time.monotonic() - start, exc.prompt_tokens, exc.completion_tokens, True)
            self.result.errors.append(str(exc)[:200])
            return None
        self._count(time.monotonic() - start, res.prompt_tokens, res.completion_tokens)
        return res.data


def _cluster_lines(clusters: list[Cluster]) -> list[str]:
    out = []
    for i, c in enumerate(clusters, 1):
        held = "; ".join(m.content for m in c.memories[:3])
        out.append(f'C{i} "{c.name}": {c.description} Holds: {held}')
    return out


# each task's items: (the model's outcome, the lexical organizer's) on one item
Hits = list[tuple[bool, bool]]


def _route(meter: _Meter, scene: Scene) -> Hits:
    keys = [f"R{i}" for i in range(1, len(scene.probes) + 1)]
    targets = [f"C{i}" for i in range(1, len(scene.clusters) + 1)] + [NEW]
    schema = closed_object({"routes": closed_object({k: one_of(targets) for k in keys})})
    lines = ["Clusters:", *_cluster_lines(scene.clusters), "New memories:"]
    lines += [f"{k}: {text}" for k, (text, _t) in zip(keys, scene.probes)]
    msgs = [
        {"role": "system", "content": ROUTE_PROMPT},
        {"role": "user", "content": "\n".join(lines) + "\nAnswer:"},
    ]
    names = {f"C{i}": c.name for i, c in enumerate(scene.clusters, 1)} | {NEW: NEW}
    data = meter.call(msgs, schema)
    routes = data.get("routes", {}) if data else {}
    return [
        (names.get(routes.get(k, ""), "") == t, lexical_route(x, scene.clusters) == t)
        for k, (x, t) in zip(keys, scene.probes)
    ]


@dataclass
class _PlanScores:
    pairs: list[tuple[tuple[bool, bool], tuple[bool, bool]]] = field(default_factory=list)
    sound: bool = False
    copies: list[str] = field(default_factory=list)


class _State:
    """A store state holding only the scene's unsorted memories (for `validate_plan`)."""

    def __init__(self, mems: list[Memory]) -> None:
        self.clusters: dict[str, Cluster] = {}
        self.archived: dict[str, Cluster] = {}
        self.unsorted: dict[str, list[Memory]] = {"gate": mems}

    def locate(self, mid: str) -> tuple[str, str] | None:
        return ("unsorted", "gate") if any(m.id == mid for m in self.unsorted["gate"]) else None

    def memory(self, mid: str) -> Memory | None:
        return next((m for m in self.unsorted["gate"] if m.id == mid), None)

    def locate_many(self, mids: Iterable[str]) -> dict[str, tuple[str, str, Memory]]:
        wanted = set(mids)
        return {m.id: ("unsorted", "gate", m) for m in self.unsorted["gate"] if m.id in wanted}


def _scene_memories(scene: Scene) -> tuple[list[Memory], dict[str, int]]:
    mems = [
        Memory.new(t, created_at=(T0 + timedelta(minutes=2 * i)).isoformat())
        for i, (t, _g) in enumerate(scene.plan)
    ]
    return mems, {m.id: g for m, (_t, g) in zip(mems, scene.plan)}


def _plan(meter: _Meter, scene: Scene, template: str, cfg: SessionConfig) -> _PlanScores:
    """The session's plan call on the scene's unsorted memories: sound, no copies, and its
    grouping's pairs against the lexical organizer's."""
    mems, truth = _scene_memories(scene)
    out = _PlanScores()
    lexical = pair_outcomes(organize(mems, [], cfg).assign, truth)
    model: dict[str, str] = {}
    max_new = min(6, max(1, math.ceil(len(mems) / 2)))
    aliases = Aliases.make([m.id for m in mems], [], max_new)
    schema = build_schema(list(aliases.memories), [], max_new)
    data = meter.call(organize_messages(template, mems, [], max_new), schema)
    if data is not None:
        by_alias = {a: truth[mid] for a, mid in aliases.memories.items()}
        out.copies = copied(data, prompt_examples(template), reference=by_alias)
        try:
            plan = parse_plan(data, aliases)
        except PlanError as exc:
            meter.result.errors.append(f"{scene.name}: plan does not parse: {exc}"[:200])
        else:
            problems = validate_plan(plan, list(truth), _State(mems))
            if problems:
                meter.result.errors.append(
                    f"{scene.name}: unsound plan: {'; '.join(problems[:3])}"[:200]
                )
            else:
                out.sound, model = True, plan.assign
    out.pairs = list(zip(pair_outcomes(model, truth), lexical))
    return out


def _profiled(
    scene: Scene,
    mems: list[Memory],
    truth: Mapping[str, int],
    profiles: Mapping[int, Profile | None],
) -> ClusterScores:
    stamp = T0.isoformat()
    clusters = {}
    for g in sorted(scene.groups):
        p = profiles.get(g) or Profile("", "")
        # the profile alone: the members' terms would rank the groups whatever the names
        members: list[Memory] = []
        clusters[f"g{g}"] = Cluster(
            f"g{g}", p.name, p.description, list(p.tags), stamp, stamp, members
        )
    return ClusterScores(clusters)


def _first(scores: ClusterScores, query: str, g: int) -> bool:
    return scores.rank(query, f"g{g}") == 1


def lexical_profiles(scene: Scene, cfg: SessionConfig) -> dict[int, Profile]:
    """The lexical organizer's profile of each reference group, organized on its own (the
    baseline measures profiles, not grouping)."""
    mems, truth = _scene_memories(scene)
    out = {}
    for g in sorted(scene.groups):
        plan = organize([m for m in mems if truth[m.id] == g], [], cfg)
        pc = plan.clusters[0]
        out[g] = Profile(pc.name, pc.description, tuple(pc.tags))
    return out


def _name(meter: _Meter, scene: Scene, cfg: SessionConfig) -> Hits:
    """The session's naming call (`organize.naming`) on the reference groups; each later
    question is asked of the groups (their memories and the profile) as stage-1 cluster
    retrieval asks: a hit when the question's group ranks first."""
    mems, truth = _scene_memories(scene)
    keys = {g: f"G{i}" for i, g in enumerate(sorted(scene.groups), 1)}
    groups = [(keys[g], [m for m in mems if truth[m.id] == g]) for g in sorted(scene.groups)]
    data = meter.call(naming_messages(groups), naming_schema(list(keys.values())))
    got, _why = read_profiles(data, list(keys.values()), set())
    model = _profiled(scene, mems, truth, {g: got.get(k) for g, k in keys.items()})
    lexical = _profiled(scene, mems, truth, lexical_profiles(scene, cfg))
    return [
        (_first(model, q, g) if got.get(keys[g]) else False, _first(lexical, q, g))
        for g, qs in sorted(scene.queries.items())
        for q in qs
    ]


def _judge(meter: _Meter, scene: Scene, template: str) -> list[tuple[bool, bool, bool]]:
    """The model's yes/no verdicts (and the lexical rule's) on memory-cluster pairs, with
    the truth: each filed probe with its own cluster (yes) and with the most similar other
    cluster (no)."""
    pairs: list[tuple[str, Cluster, bool]] = []
    by_name = {c.name: c for c in scene.clusters}
    for text, true in scene.probes:
        if true == NEW:
            continue
        others = [c for c in scene.clusters if c.name != true]
        ranked = overlap_rank(text, [_profile(c) for c in others])
        pairs += [(text, by_name[true], True), (text, others[ranked[0][1]], False)]
    keys = [f"A{i}" for i in range(1, len(pairs) + 1)]
    schema = closed_object({"verdicts": closed_object({k: one_of(["yes", "no"]) for k in keys})})
    lines = []
    for k, (text, c, _ok) in zip(keys, pairs):
        held = " ".join(f'"{m.content}"' for m in c.memories[:2])
        lines.append(
            f'{k}: memory "{text}"\n    cluster "{c.name}: {c.description}". Holds: {held}'
        )
    system = template.replace(
        "$answer_format", '{"verdicts": {"A1": "yes", "A2": "no"}} with one verdict per check'
    ).strip()
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n".join(lines) + "\nAnswer:"},
    ]
    data = meter.call(msgs, schema)
    verdicts = data.get("verdicts", {}) if data else {}
    profiles = [_profile(x) for x in scene.clusters]
    return [
        (
            verdicts.get(k) == "yes",
            overlap_rank(t, profiles)[0][1] == scene.clusters.index(c),
            ok,
        )
        for k, (t, c, ok) in zip(keys, pairs)
    ]


@dataclass
class _Items:
    """Every scene's items, per task."""

    route: Hits = field(default_factory=list)
    plans: list[_PlanScores] = field(default_factory=list)
    name: Hits = field(default_factory=list)
    judge: list[tuple[bool, bool, bool]] = field(default_factory=list)


def measure(
    backend: Backend,
    prompts_dir: Path | None,
    margin: float = 0.05,
    scenes: int | None = None,
    timeout: float | None = None,
    cfg: SessionConfig | None = None,
    total_seconds: float | None = None,
    tasks: tuple[str, ...] = TASKS,
    progress: Callable[[str], None] | None = None,
) -> GateResult:
    """Run the gate's `tasks` on `backend` (one call per task and scene, none after
    `total_seconds`; `progress` gets a line after each) and decide; a task not in `tasks`
    is refused without a call."""
    start = time.monotonic()
    organize_t = load_prompt(prompts_dir, "organize.md")
    validate_t = load_prompt(prompts_dir, "validate.md")
    all_scenes, set_hash = load_gate_set()
    picked = all_scenes[: scenes or len(all_scenes)]
    result = GateResult(
        backend.name,
        backend.model,
        cache_key(backend, set_hash, organize_t + validate_t, len(picked), tasks),
        datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        identity=model_identity(backend),
    )
    deadline = start + total_seconds if total_seconds else None
    meter = _Meter(backend, result, timeout, deadline, progress)
    cfg = cfg or SessionConfig()
    items = _Items()
    for i, scene in enumerate(picked, 1):
        meter.where = f"scene {i} of {len(picked)}"
        if "route" in tasks:
            meter.task = "route"
            items.route += _route(meter, scene)
        if "organize" in tasks:
            meter.task = "organize"
            items.plans.append(_plan(meter, scene, organize_t, cfg))
        if "name" in tasks:
            meter.task = "name"
            items.name += _name(meter, scene, cfg)
        if "judge" in tasks:
            meter.task = "judge"
            items.judge += _judge(meter, scene, validate_t)
    for p in items.plans:
        result.copies += p.copies
    _decide(result, items, margin)
    for task in TASKS:
        if task not in tasks:
            result.tasks[task] = TaskScore(0.0, 0.0, False, "not measured (backend.gate.tasks)")
    result.seconds = round(time.monotonic() - start, 1)
    return result


def _score(
    task: str,
    items: Sequence[Any],
    stat: Callable[[Sequence[Any]], float],
    need: Callable[[float], float],
    paired: bool = True,
) -> TaskScore:
    """The task's scores and intervals; allowed when the lower bound of the gain over the
    lexical organizer (`paired`) or of the model's score reaches what it needs."""

    def model(xs: Sequence[Any]) -> float:
        return stat([x[0] for x in xs])

    def lexical(xs: Sequence[Any]) -> float:
        return stat([x[1] for x in xs])

    m, lx = model(items), lexical(items)
    interval, gain = bootstrap(items, model, lexical)
    bound = gain.low if paired else interval.low
    what = "gain" if paired else "score"
    need_v = need(lx)
    ok = bool(items) and bound >= need_v
    sign = ">=" if ok else "<"
    why = f"{what} lower bound {bound:.2f} {sign} {need_v:.2f} needed"
    return TaskScore(
        round(m, 3),
        round(lx, 3),
        ok,
        why,
        len(items),
        (interval.low, interval.high),
        (gain.low, gain.high),
    )


def _decide(result: GateResult, items: _Items, margin: float) -> None:
    result.tasks["route"] = _score("route", items.route, accuracy, lambda _lx: margin)
    pairs = [(m, lx) for p in items.plans for m, lx in p.pairs]
    organize_score = _score("organize", pairs, pair_f1_of, lambda _lx: margin)
    unsound = sum(not p.sound for p in items.plans)
    if result.copies:
        organize_score.allowed = False
        organize_score.why = f"copies the prompt's examples ({len(result.copies)} times)"
    elif unsound:
        organize_score.allowed = False
        organize_score.why = f"{unsound} of {len(items.plans)} plans unsound"
    result.tasks["organize"] = organize_score
    result.tasks["name"] = _score("name", items.name, accuracy, lambda _lx: margin)
    judged = [((said, truth), (lex, truth)) for said, lex, truth in items.judge]
    result.tasks["judge"] = _score(
        "judge", judged, balanced, lambda _lx: JUDGE_MIN_AUC, paired=False
    )


# -- the cache ---------------------------------------------------------------------------


def cache_key(
    backend: Backend, set_hash: str, prompts: str, scenes: int, tasks: tuple[str, ...] = TASKS
) -> str:
    who = f"{backend.name}\0{backend.model}\0{getattr(backend, 'host', '') or ''}"
    text = f"{who}\0{set_hash}\0{hashlib.sha256(prompts.encode()).hexdigest()}\0{scenes}"
    text += f"\0{SCORING}\0{PROMPT_HASH}"
    if tuple(tasks) != TASKS:  # a verdict on some tasks is not one on all
        text += "\0" + ",".join(tasks)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_file(cache_dir: Path, backend: Backend) -> Path:
    who = f"{backend.model}\0{getattr(backend, 'host', '') or ''}"
    digest = hashlib.sha256(who.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{backend.name}-{digest}.json"


def _user_file(backend: Backend) -> Path:
    digest = hashlib.sha256(model_identity(backend).encode()).hexdigest()[:16]
    return user_gate_dir() / f"{backend.name}-{digest}.json"


def _read(path: Path, key: str) -> GateResult | None:
    try:
        res = GateResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return res if res.key == key else None


def cached(
    cache_dir: Path, backend: Backend, prompts_dir: Path | None, tasks: tuple[str, ...] = TASKS
) -> GateResult | None:
    """The stored result for this backend and model, if it was measured with the same gate
    set, prompts and tasks (editing a prompt means measuring again)."""
    return _read(cache_file(cache_dir, backend), current_key(backend, prompts_dir, tasks))


def current_key(backend: Backend, prompts_dir: Path | None, tasks: tuple[str, ...] = TASKS) -> str:
    """The cache key of a full measurement of `backend` (of `tasks`) with the store's
    prompts now."""
    scenes, set_hash = load_gate_set()
    prompts = load_prompt(prompts_dir, "organize.md") + load_prompt(prompts_dir, "validate.md")
    return cache_key(backend, set_hash, prompts, len(scenes), tasks)


def store_result(cache_dir: Path, backend: Backend, result: GateResult) -> Path:
    path = cache_file(cache_dir, backend)
    write_json(path, result.to_dict())
    return path


def gate_for(
    backend: Backend,
    config: Config,
    cache_dir: Path,
    prompts_dir: Path | None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> GateResult:
    """The cached verdict for `backend`: the store's, else the user's (measured for the same
    model file by another store: copied into this one), else measured now and kept in both
    (or measured again when `force`; `progress` as for `measure`)."""
    key = current_key(backend, prompts_dir, task_list(config.backend.gate.tasks))
    if not force:
        hit = _read(cache_file(cache_dir, backend), key)
        if hit is not None:
            return hit
        shared = _read(_user_file(backend), key)
        if shared is not None:
            store_result(cache_dir, backend, shared)
            log.info(
                "competence gate: %s %s measured before (user cache)", backend.name, backend.model
            )
            return shared
    log.info("competence gate: measuring %s %s", backend.name, backend.model)
    gate = config.backend.gate
    res = measure(
        backend,
        prompts_dir,
        gate.margin,
        timeout=gate.timeout,
        cfg=config.session,
        total_seconds=gate.total_seconds,
        tasks=task_list(gate.tasks),
        progress=progress,
    )
    store_result(cache_dir, backend, res)
    if not res.skipped:  # a measurement cut short is the store's, not every store's
        write_json(_user_file(backend), res.to_dict())
    log.info("competence gate: %s", " | ".join(res.lines()))
    return res


def all_results(cache_dir: Path) -> list[dict[str, Any]]:
    """Every measured backend and model in the cache, for `status`."""
    out = []
    for path in sorted(Path(cache_dir).glob("*.json")):
        try:
            out.append(GateResult.from_dict(json.loads(path.read_text("utf-8"))).to_dict())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("unreadable gate result %s: %s", path, exc)
    return out


class GateRefused(ClagdError):
    code = "gate"


def backend_verdict(
    store: Path,
    kind: str | None = None,
    force: bool = True,
    scenes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[GateResult | None, str]:
    """`clagd backend test`: pick the backend as the daemon would (or `kind`), measure it
    (or reuse the cached verdict unless `force`) and store the verdict in the store's cache.
    Returns (None, why) when no model answers: then the lexical organizer does everything."""
    from clagd.config import load_config
    from clagd.slm.base import select_backend
    from clagd.store.files import Paths

    config = load_config(store)
    if kind:
        if kind not in get_args(BackendKind):
            raise ClagdError(f"unknown backend kind {kind!r}")
        config.backend.kind = cast(BackendKind, kind)
    backend, why = select_backend(config)
    if backend is None:
        return None, why
    paths = Paths(Path(store))
    try:
        if scenes:
            res = measure(
                backend,
                paths.prompts,
                config.backend.gate.margin,
                scenes,
                config.backend.gate.timeout,
                config.session,
                config.backend.gate.total_seconds,
                task_list(config.backend.gate.tasks),
                progress,
            )
            store_result(paths.runtime / "gate", backend, res)
        else:
            res = gate_for(backend, config, paths.runtime / "gate", paths.prompts, force, progress)
    finally:
        backend.close()
    return res, why
