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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast, get_args

from clagd.config import BackendKind, Config, SessionConfig
from clagd.errors import BackendError, ClagdError
from clagd.model import Cluster, Memory
from clagd.organize.examples import copied, prompt_examples
from clagd.organize.lexical import organize
from clagd.organize.plan import PlanError
from clagd.organize.plan_checks import validate_plan
from clagd.organize.plan_parse import parse_plan
from clagd.organize.plan_schema import Aliases, build_schema
from clagd.organize.prompts import load_prompt, organize_messages
from clagd.organize.similarity import ClusterScores
from clagd.slm.base import Backend
from clagd.text import tokenize
from clagd.yamlio import load_yaml_file

log = logging.getLogger("clagd.gate")

GATE_SET = Path(__file__).with_name("gate_set.yaml")
TASKS = ("route", "organize", "name", "judge")
JUDGE_MIN_AUC = 0.75
# how the gate scores (part of the cache key: a verdict scored another way is measured again)
# 2: the naming baseline names the reference groups (was the one lexical cluster's name)
# 3: the routing baseline is the index's BM25 (was IDF-weighted term overlap)
SCORING = 3
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


def pair_f1(pred: Mapping[str, str], truth: Mapping[str, Any]) -> float:
    """Pairwise F1 of a grouping against the reference (1.0: the same partition)."""
    keys = sorted(truth)
    tp = fp = fn = 0
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            same_p = pred.get(a) is not None and pred.get(a) == pred.get(b)
            same_t = truth[a] == truth[b]
            tp += same_p and same_t
            fp += same_p and not same_t
            fn += same_t and not same_p
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def naming_score(
    named: list[tuple[str, list[str]]], groups: dict[int, list[str]], truth: Mapping[str, int]
) -> float:
    """Share of clusters whose name, as a query over the reference groups' memories, ranks
    first the group most of the cluster's memories belong to."""
    if not named:
        return 0.0
    order = sorted(groups)
    docs = [" ".join(groups[g]) for g in order]
    hits = 0
    for name, members in named:
        majority = Counter(truth[m] for m in members).most_common(1)[0][0]
        score, i = overlap_rank(name, docs)[0]
        hits += score > 0 and order[i] == majority
    return hits / len(named)


# -- the result --------------------------------------------------------------------------


@dataclass
class TaskScore:
    model: float
    lexical: float
    allowed: bool
    why: str


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
        tasks = {k: TaskScore(**v) for k, v in (d.get("tasks") or {}).items()}
        known = {f for f in cls.__dataclass_fields__ if f != "tasks"}
        return cls(**{k: v for k, v in d.items() if k in known}, tasks=tasks)

    def lines(self) -> list[str]:
        out = [f"{self.backend} {self.model} (measured {self.measured_at}, {self.seconds:.0f} s):"]
        for k in TASKS:
            t = self.tasks.get(k)
            if t is not None:
                verdict = "allowed" if t.allowed else "refused"
                out.append(
                    f"  {k:<9} model {t.model:.2f}  lexical {t.lexical:.2f}  {verdict}: {t.why}"
                )
        out += [f"  copied: {c}" for c in self.copies[:5]]
        out += [f"  error: {e}" for e in self.errors[:5]]
        return out


# -- measuring ---------------------------------------------------------------------------


class _Meter:
    """Calls the backend, counting calls, tokens (failed answers too) and errors."""

    def __init__(self, backend: Backend, result: GateResult, timeout: float | None) -> None:
        self.backend, self.result, self.timeout = backend, result, timeout
        self.task = ""

    def _count(self, seconds: float, prompt: int, completion: int) -> None:
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
        start = time.monotonic()
        try:
            res = self.backend.chat_json(msgs, schema, seed=42, timeout=self.timeout)
        except BackendError as exc:
            self._count(time.monotonic() - start, exc.prompt_tokens, exc.completion_tokens)
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


def _route(meter: _Meter, scene: Scene) -> tuple[float, float]:
    keys = [f"R{i}" for i in range(1, len(scene.probes) + 1)]
    targets = [f"C{i}" for i in range(1, len(scene.clusters) + 1)] + [NEW]
    schema = {
        "type": "object",
        "properties": {
            "routes": {
                "type": "object",
                "properties": {k: {"enum": targets} for k in keys},
                "required": keys,
                "additionalProperties": False,
            }
        },
        "required": ["routes"],
        "additionalProperties": False,
    }
    lines = ["Clusters:", *_cluster_lines(scene.clusters), "New memories:"]
    lines += [f"{k}: {text}" for k, (text, _t) in zip(keys, scene.probes)]
    msgs = [
        {"role": "system", "content": ROUTE_PROMPT},
        {"role": "user", "content": "\n".join(lines) + "\nAnswer:"},
    ]
    names = {f"C{i}": c.name for i, c in enumerate(scene.clusters, 1)} | {NEW: NEW}
    data = meter.call(msgs, schema)
    routes = data.get("routes", {}) if data else {}
    model = sum(names.get(routes.get(k, ""), "") == t for k, (_x, t) in zip(keys, scene.probes))
    lexical = sum(lexical_route(x, scene.clusters) == t for x, t in scene.probes)
    n = len(scene.probes)
    return model / n, lexical / n


@dataclass
class _PlanScores:
    model_f1: float = 0.0
    lexical_f1: float = 0.0
    model_names: float = 0.0
    lexical_names: float = 0.0
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


def _named(assign: Mapping[str, str], names: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    members: dict[str, list[str]] = {}
    for mid, ref in assign.items():
        members.setdefault(ref, []).append(mid)
    return [(names[r], ms) for r, ms in members.items() if r in names]


def lexical_names(
    mems: list[Memory], truth: Mapping[str, int], cfg: SessionConfig
) -> list[tuple[str, list[str]]]:
    """The lexical organizer's names for the reference groups, each group organized on its
    own: the naming baseline measures names, not the grouping (organized together, the
    scene's memories are one time episode, one cluster with one name that can match only
    one group: the baseline was 0.00 in every scene)."""
    named: list[tuple[str, list[str]]] = []
    for g in sorted(set(truth.values())):
        plan = organize([m for m in mems if truth[m.id] == g], [], cfg)
        named += _named(plan.assign, {pc.ref: pc.name for pc in plan.clusters})
    return named


def _plan(meter: _Meter, scene: Scene, template: str, cfg: SessionConfig) -> _PlanScores:
    mems = [
        Memory.new(t, created_at=(T0 + timedelta(minutes=2 * i)).isoformat())
        for i, (t, _g) in enumerate(scene.plan)
    ]
    truth = {m.id: g for m, (_t, g) in zip(mems, scene.plan)}
    groups: dict[int, list[str]] = {}
    for m, (_t, g) in zip(mems, scene.plan):
        groups.setdefault(g, []).append(m.content)
    out = _PlanScores()
    lex = organize(mems, [], cfg)
    out.lexical_f1 = pair_f1(lex.assign, truth)
    out.lexical_names = naming_score(lexical_names(mems, truth, cfg), groups, truth)

    max_new = min(6, max(1, math.ceil(len(mems) / 2)))
    aliases = Aliases.make([m.id for m in mems], [], max_new)
    schema = build_schema(list(aliases.memories), [], max_new)
    data = meter.call(organize_messages(template, mems, [], max_new), schema)
    if data is None:
        return out
    by_alias = {a: truth[mid] for a, mid in aliases.memories.items()}
    out.copies = copied(data, prompt_examples(template), reference=by_alias)
    try:
        plan = parse_plan(data, aliases)
    except PlanError as exc:
        meter.result.errors.append(f"{scene.name}: plan does not parse: {exc}"[:200])
        return out
    problems = validate_plan(plan, list(truth), _State(mems))
    if problems:
        meter.result.errors.append(f"{scene.name}: unsound plan: {'; '.join(problems[:3])}")
        return out
    out.sound = True
    out.model_f1 = pair_f1(plan.assign, truth)
    names = {pc.ref: pc.name for pc in plan.clusters}
    copied_names = {n for n in names.values() if any(n.lower() in c.lower() for c in out.copies)}
    named = [(n, ms) for n, ms in _named(plan.assign, names) if n not in copied_names]
    total = len(_named(plan.assign, names))
    out.model_names = naming_score(named, groups, truth) * len(named) / total if total else 0.0
    return out


def _judge(meter: _Meter, scene: Scene, template: str) -> tuple[float, float]:
    """Balanced accuracy of the model's yes/no verdicts (and of the lexical rule's) on
    memory-cluster pairs: each filed probe with its own cluster (yes) and with the most
    similar other cluster (no)."""
    pairs: list[tuple[str, Cluster, bool]] = []
    by_name = {c.name: c for c in scene.clusters}
    for text, true in scene.probes:
        if true == NEW:
            continue
        others = [c for c in scene.clusters if c.name != true]
        ranked = overlap_rank(text, [_profile(c) for c in others])
        pairs += [(text, by_name[true], True), (text, others[ranked[0][1]], False)]
    keys = [f"A{i}" for i in range(1, len(pairs) + 1)]
    schema = {
        "type": "object",
        "properties": {
            "verdicts": {
                "type": "object",
                "properties": {k: {"enum": ["yes", "no"]} for k in keys},
                "required": keys,
                "additionalProperties": False,
            }
        },
        "required": ["verdicts"],
        "additionalProperties": False,
    }
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
    model = _balanced([(verdicts.get(k) == "yes", ok) for k, (_t, _c, ok) in zip(keys, pairs)])
    lexical = _balanced(
        [
            (
                overlap_rank(t, [_profile(x) for x in scene.clusters])[0][1]
                == scene.clusters.index(c),
                ok,
            )
            for t, c, ok in pairs
        ]
    )
    return model, lexical


def _balanced(said_truth: list[tuple[bool, bool]]) -> float:
    pos = [s for s, t in said_truth if t]
    neg = [not s for s, t in said_truth if not t]
    if not pos or not neg:
        return 0.5
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def measure(
    backend: Backend,
    prompts_dir: Path | None,
    margin: float = 0.05,
    scenes: int | None = None,
    timeout: float | None = None,
    cfg: SessionConfig | None = None,
) -> GateResult:
    """Run the gate's tasks on `backend` (one call per task and scene) and decide."""
    start = time.monotonic()
    organize_t = load_prompt(prompts_dir, "organize.md")
    validate_t = load_prompt(prompts_dir, "validate.md")
    all_scenes, set_hash = load_gate_set()
    picked = all_scenes[: scenes or len(all_scenes)]
    result = GateResult(
        backend.name,
        backend.model,
        cache_key(backend, set_hash, organize_t + validate_t, len(picked)),
        datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    meter = _Meter(backend, result, timeout)
    routes, plans, judges = [], [], []
    for scene in picked:
        meter.task = "route"
        routes.append(_route(meter, scene))
        meter.task = "organize"  # the plan call: its names are scored as well
        plans.append(_plan(meter, scene, organize_t, cfg or SessionConfig()))
        meter.task = "judge"
        judges.append(_judge(meter, scene, validate_t))
    for p in plans:
        result.copies += p.copies
    _decide(result, routes, plans, judges, margin)
    result.seconds = time.monotonic() - start
    return result


def _decide(
    result: GateResult,
    routes: list[tuple[float, float]],
    plans: list[_PlanScores],
    judges: list[tuple[float, float]],
    margin: float,
) -> None:
    def beat(task: str, model: float, lexical: float, need: float, extra: str = "") -> None:
        ok = model >= need and not extra
        why = extra or (
            f"{model:.2f} >= {need:.2f} needed" if ok else f"{model:.2f} < {need:.2f} needed"
        )
        result.tasks[task] = TaskScore(round(model, 3), round(lexical, 3), ok, why)

    rm, rl = _mean(r[0] for r in routes), _mean(r[1] for r in routes)
    beat("route", rm, rl, rl + margin)
    om, ol = _mean(p.model_f1 for p in plans), _mean(p.lexical_f1 for p in plans)
    unsound = sum(not p.sound for p in plans)
    extra = ""
    if result.copies:
        extra = f"copies the prompt's examples ({len(result.copies)} times)"
    elif unsound:
        extra = f"{unsound} of {len(plans)} plans unsound"
    beat("organize", om, ol, ol + margin, extra)
    nm, nl = _mean(p.model_names for p in plans), _mean(p.lexical_names for p in plans)
    beat("name", nm, nl, min(1.0, nl + margin))
    jm, jl = _mean(j[0] for j in judges), _mean(j[1] for j in judges)
    beat("judge", jm, jl, JUDGE_MIN_AUC)


# -- the cache ---------------------------------------------------------------------------


def cache_key(backend: Backend, set_hash: str, prompts: str, scenes: int) -> str:
    who = f"{backend.name}\0{backend.model}\0{getattr(backend, 'host', '') or ''}"
    text = f"{who}\0{set_hash}\0{hashlib.sha256(prompts.encode()).hexdigest()}\0{scenes}"
    text += f"\0{SCORING}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_file(cache_dir: Path, backend: Backend) -> Path:
    who = f"{backend.model}\0{getattr(backend, 'host', '') or ''}"
    digest = hashlib.sha256(who.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{backend.name}-{digest}.json"


def cached(cache_dir: Path, backend: Backend, prompts_dir: Path | None) -> GateResult | None:
    """The stored result for this backend and model, if it was measured with the same gate
    set and prompts (editing a prompt means measuring again)."""
    path = cache_file(cache_dir, backend)
    try:
        res = GateResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return res if res.key == current_key(backend, prompts_dir) else None


def current_key(backend: Backend, prompts_dir: Path | None) -> str:
    """The cache key of a full measurement of `backend` with the store's prompts now."""
    scenes, set_hash = load_gate_set()
    prompts = load_prompt(prompts_dir, "organize.md") + load_prompt(prompts_dir, "validate.md")
    return cache_key(backend, set_hash, prompts, len(scenes))


def store_result(cache_dir: Path, backend: Backend, result: GateResult) -> Path:
    path = cache_file(cache_dir, backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def gate_for(
    backend: Backend,
    config: Config,
    cache_dir: Path,
    prompts_dir: Path | None,
    force: bool = False,
) -> GateResult:
    """The cached verdict for `backend`, measuring it first when there is none (or `force`)."""
    if not force:
        hit = cached(cache_dir, backend, prompts_dir)
        if hit is not None:
            return hit
    log.info("competence gate: measuring %s %s", backend.name, backend.model)
    res = measure(
        backend,
        prompts_dir,
        config.backend.gate.margin,
        timeout=config.backend.gate.timeout,
        cfg=config.session,
    )
    store_result(cache_dir, backend, res)
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
    store: Path, kind: str | None = None, force: bool = True, scenes: int | None = None
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
            )
            store_result(paths.runtime / "gate", backend, res)
        else:
            res = gate_for(backend, config, paths.runtime / "gate", paths.prompts, force=force)
    finally:
        backend.close()
    return res, why
