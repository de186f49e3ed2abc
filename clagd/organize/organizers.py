"""Who makes a session's plans: `LexicalOrganizer` (no model) or `ModelOrganizer` (an SLM
backend), behind one interface, so a session runs one path whichever it has:

    proposal = organizer.propose(snapshot, seed, meter)   # the one place a plan is obtained
    ... the session applies it on the writer (`validate_plan`, invariants) ...
    organizer.judge(checks, seed, meter)                   # the organizer's own verdict

`organizer_for(backend)` is the one place that picks an organizer for a backend; the "no
model" backend (`slm.none.NoneBackend`) gets the lexical organizer. An organizer that may
fail names its `fallback`, which the session runs on the same sample when every attempt
failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clagd.config import SessionConfig
from clagd.errors import BackendError
from clagd.model import Cluster, Memory
from clagd.organize.chunks import Chunk, combine, make_chunks
from clagd.organize.examples import prompt_examples
from clagd.organize.lexical import NewestTimes, describe_groups, neighbourhood, organize
from clagd.organize.naming import NamingRun, name_groups
from clagd.organize.plan import NEW_PREFIX, Plan, PlanError
from clagd.organize.plan_parse import parse_plan
from clagd.organize.plan_schema import Aliases, build_schema
from clagd.organize.prompts import (
    Messages,
    load_prompt,
    organize_messages,
    validate_messages,
)
from clagd.organize.sample import Check, Snapshot
from clagd.organize.size_policy import fingerprint
from clagd.organize.validation import plan_junk
from clagd.scopes import DEFAULT_SCOPE
from clagd.slm.base import Backend, ChatResult
from clagd.slm.none import NoneBackend
from clagd.slm.schema import Schema, closed_object, one_of
from clagd.store.files import StoreState
from clagd.store.frozen import ClusterNames

if TYPE_CHECKING:
    from clagd.organize.gate import GateResult

# a retry asks with another seed: this far from the last one
SEED_STEP = 7919


class Meter(Protocol):
    """What a session counts of its model use (`SessionOutcome` is one)."""

    attempts: int
    calls: int
    prompt_tokens: int
    completion_tokens: int
    named: int  # clusters a model wrote the profile of
    naming_asked: int  # clusters it was asked to name
    naming_rejected: int  # ... whose answer was not used (`naming_reasons`: the first whys)
    naming_reasons: list[str]
    naming_seconds: float
    reasons: list[str]


# runs on the writer with the live state: the plan and the ids of the memories it covers,
# or None when there is nothing to organize
# (the state on the writer, whether the writer may make the plan itself, the hot clusters'
# names as the writer keeps them) -> the plan and the sampled ids, None for nothing to do;
# StalePlan when it may not and must
PlanMaker = Callable[[StoreState, bool, ClusterNames], "tuple[Plan, list[str]] | None"]
# a lexical plan made off the writer that no longer holds there (a write meanwhile changed
# a cluster it read, or moved a memory it sampled) is made again off the writer, from a
# fresh snapshot, this often before the writer makes it itself (at 100k memories making it
# on the writer held it 120-250 ms: a pass over the store to find the sample, and the plan)
STALE_RETRIES = 2


class StalePlan(Exception):
    """The plan made off the writer no longer holds, and the writer may not make it."""


@dataclass
class Proposal:
    """A plan to apply: made before (a model's) or on the writer (the lexical organizer's,
    from the state as it is then), and the share of its assignments to check afterwards."""

    make: PlanMaker
    check_fraction: float = 0.0


@dataclass(frozen=True)
class Tag:
    """How one attempt is named: in its commit subject, trailers and the session's reasons."""

    label: str  # "ollama attempt 1", "lexical"
    trailers: dict[str, Any] = field(default_factory=dict)  # which attempt, which seed
    who: str = ""  # "attempt 1: ", "lexical "


# share of checked assignments judged wrong, and the notes that say why
Judgement = tuple[float, list[str]]


class Organizer(Protocol):
    backend: Backend  # named in trailers and the outcome (`NoneBackend` for no model)
    attempts: int  # plans a session may try before it turns to `fallback`
    fallback: Organizer | None

    def tag(self, attempt: int, seed: int) -> Tag: ...

    def propose(self, snap: Snapshot, seed: int, meter: Meter) -> Proposal:
        """A plan for the sample; raises BackendError or PlanError when there is none."""
        ...

    def judge(self, checks: list[Check], seed: int, meter: Meter) -> Judgement | None:
        """The verdict on an applied plan's checked assignments; None: not judged."""
        ...


def organizer_for(
    backend: Backend | None,
    cfg: SessionConfig,
    prompts_dir: Path | None = None,
    gate: GateResult | None = None,
    newest: NewestTimes | None = None,
) -> Organizer:
    """The organizer for a backend: the lexical one when there is no model, or when the
    competence gate measured that the model does not organize better than it (`gate`).
    `newest`: the store's clusters' newest times, which the lexical one reads."""
    if backend is None or isinstance(backend, NoneBackend):
        return LexicalOrganizer(cfg, newest)
    if gate is not None and not gate.allows("organize"):
        if gate.allows("name"):
            return NamingOrganizer(backend, cfg)
        return LexicalOrganizer(cfg, newest)
    judge = gate is None or gate.allows("judge")
    name = gate is None or gate.allows("name")
    return ModelOrganizer(backend, cfg, prompts_dir, judge=judge, name=name)


def gate_note(backend: Backend | None, gate: GateResult | None) -> list[str]:
    """What a session says when the gate kept a model from organizing ([] otherwise)."""
    if backend is None or gate is None or gate.may_organize():
        return []
    model = f"competence gate: {backend.name} {backend.model}"
    if gate.allows("organize"):
        return [f"{model} may not name ({gate.refused()}): the model groups, lexical names"]
    who = f"{model} may not organize ({gate.refused()})"
    if gate.allows("name"):
        return [f"{who}: lexical grouping, the model names the clusters"]
    return [f"{who}: lexical organizer"]


def _present(state: StoreState, sampled: list[str]) -> tuple[list[Memory], dict[str, str]]:
    """The sampled memories still hot (in a cluster or unsorted), as they are now, and the
    cluster of each clustered one."""
    found = state.locate_many(sampled)
    mems = [
        found[mid][2]
        for mid in sampled
        if mid in found and found[mid][0] in ("cluster", "unsorted")
    ]
    home = {m.id: found[m.id][1] for m in mems if found[m.id][0] == "cluster"}
    return mems, home


class LexicalOrganizer:
    """Plans by time episodes and topic shifts (`organize.lexical`): no model, one attempt,
    nothing to judge. The plan is made off the writer from the session's snapshot, and
    taken on the writer if nothing it read changed meanwhile; otherwise it is made again
    off the writer from a fresh snapshot (`STALE_RETRIES` times), then on the writer from
    the memories as they are (each reads a bounded neighbourhood of clusters,
    `lexical.neighbourhood`, not the whole store)."""

    attempts = 1
    fallback: Organizer | None = None

    def __init__(self, cfg: SessionConfig, newest: NewestTimes | None = None) -> None:
        self.cfg = cfg
        self.backend: Backend = NoneBackend()
        self.newest = newest if newest is not None else NewestTimes()  # the store's

    def tag(self, attempt: int, seed: int) -> Tag:
        return Tag("lexical", {}, "lexical ")

    def propose(self, snap: Snapshot, seed: int, meter: Meter) -> Proposal:
        sampled, cfg = snap.sampled, self.cfg
        home = {mid: cid for mid, cid in snap.home.items() if cid is not None}
        ahead = _lexical_plan(snap.sample, home, snap.clusters, cfg, self.newest)

        def make(
            state: StoreState, here: bool, names: ClusterNames
        ) -> tuple[Plan, list[str]] | None:
            if ahead.still_holds(state, names):
                return ahead.plan, ahead.ids
            if not here:
                raise StalePlan(f"{len(ahead.read)} clusters read, {len(ahead.ids)} sampled")
            mems, now_home = _present(state, sampled)
            if not mems:
                return None
            made = _lexical_plan(mems, now_home, state.clusters, cfg, self.newest)
            return made.plan, made.ids

        return Proposal(make)

    def judge(self, checks: list[Check], seed: int, meter: Meter) -> Judgement | None:
        return None


class NamingOrganizer:
    """The lexical organizer's grouping, the model's names: allowed to `name` but not to
    `organize`, the model writes the profiles (name, one-sentence description, tags) of the
    clusters the plan creates or changes (`organize.naming`: batched calls, a timeout per
    call and a deadline for all; a cluster not named in time or named badly keeps its
    lexical profile). The plan is made from the snapshot, off the writer, and validated on
    it like a model's; its grouping is the lexical one, so nothing is judged."""

    attempts = 1

    def __init__(self, backend: Backend, cfg: SessionConfig) -> None:
        self.backend, self.cfg = backend, cfg
        # a named plan the writer refuses (a name taken meanwhile): the lexical one
        self.fallback: Organizer | None = LexicalOrganizer(cfg)

    def tag(self, attempt: int, seed: int) -> Tag:
        return Tag(f"lexical, {self.backend.name} names", {"naming": "model"}, "naming ")

    def propose(self, snap: Snapshot, seed: int, meter: Meter) -> Proposal:
        sample, cfg = snap.sample, self.cfg
        plan = organize(sample, list(snap.clusters.values()), cfg)
        groups = named_groups(plan, sample, snap.clusters)
        asked = {ref for ref, _m in groups}
        # names are unique within a scope: per scope, those the clusters not renamed keep
        scope_of = {cid: c.scope for cid, c in snap.clusters.items()}
        by_id = {m.id: m for m in sample}
        for mid, ref in plan.assign.items():
            if mid in by_id:
                scope_of.setdefault(ref, by_id[mid].scope)
        taken: dict[str, set[str]] = {}
        for cid, c in snap.clusters.items():
            if cid not in asked:
                taken.setdefault(c.scope, set()).add(c.name.casefold())
        for pc in plan.clusters:
            if pc.ref not in asked:
                scope = scope_of.get(pc.ref, DEFAULT_SCOPE)
                taken.setdefault(scope, set()).add(pc.name.casefold())
        deadline = time.monotonic() + cfg.naming_seconds
        run = name_groups(self.backend, groups, taken, cfg.naming_timeout, deadline, seed)
        _use_profiles(plan, run)
        meter.calls += run.calls
        meter.prompt_tokens += run.prompt_tokens
        meter.completion_tokens += run.completion_tokens
        meter.named += len(run.profiles)
        meter.naming_asked += run.asked
        meter.naming_rejected += len(run.rejected)
        meter.naming_seconds += run.seconds
        meter.reasons.append(run.note(self.backend))
        meter.reasons.extend(run.reasons(2))
        meter.naming_reasons.extend(run.reasons())
        return Proposal(lambda _state, _here, _names: (plan, [m.id for m in sample]))

    def judge(self, checks: list[Check], seed: int, meter: Meter) -> Judgement | None:
        return None


def _use_profiles(plan: Plan, run: NamingRun) -> None:
    """The model's profiles into the plan; a name another cluster of the plan still has
    (the lexical name of one the model did not name, or whose name was not used) is not
    used, and the run says so."""
    kept = {pc.name.casefold() for pc in plan.clusters if pc.ref not in run.profiles}
    clash = True
    while clash:  # a name not used leaves its cluster the lexical one: check again
        clash = False
        for pc in plan.clusters:
            got = run.profiles.get(pc.ref)
            if got is not None and got.name.casefold() in kept:
                run.reject(pc.ref, f"name {got.name!r} is another cluster's lexical name")
                kept.add(pc.name.casefold())
                clash = True
    for pc in plan.clusters:
        got = run.profiles.get(pc.ref)
        if got is not None:
            pc.name, pc.description, pc.tags = got.name, got.description, list(got.tags)


def _lexical_profiles(plan: Plan, snap: Snapshot) -> None:
    """A model allowed to organize but not to name: its grouping, the lexical organizer's
    profiles. A cluster the plan creates gets the lexical profile of what it will hold; an
    existing one keeps its own (the model's rename is dropped)."""
    groups = [
        g for g in named_groups(plan, snap.sample, snap.clusters) if g[0].startswith(NEW_PREFIX)
    ]
    taken = {c.name.casefold() for c in snap.clusters.values()}
    made = describe_groups(groups, taken)
    for pc in plan.clusters:
        old = snap.clusters.get(pc.ref)
        if old is not None:
            pc.name, pc.description, pc.tags = old.name, old.description, list(old.tags)
        elif pc.ref in made:
            pc.name, pc.description, pc.tags = made[pc.ref]


def named_groups(
    plan: Plan, sample: list[Memory], clusters: dict[str, Cluster]
) -> list[tuple[str, list[Memory]]]:
    """The plan's clusters to name, each with the memories it will hold: every new one and
    every existing one the plan adds memories to (a pinned cluster keeps its name)."""
    by_id = {m.id: m for m in sample}
    into: dict[str, list[Memory]] = {}
    for mid, ref in plan.assign.items():
        if mid in by_id:
            into.setdefault(ref, []).append(by_id[mid])
    out: list[tuple[str, list[Memory]]] = []
    for pc in plan.clusters:
        old = clusters.get(pc.ref)
        if old is not None and old.pinned:
            continue
        held = [m for m in (old.memories if old else []) if m.id not in by_id]
        added = into.get(pc.ref, [])
        if added or pc.merge_from:
            out.append((pc.ref, held + added))
    return out


@dataclass
class _LexicalPlan:
    """A lexical plan and what it read: the clusters (by fingerprint) and the sampled
    memories' places, so the writer can tell whether it still holds."""

    plan: Plan
    ids: list[str]
    read: dict[str, int]  # cluster id -> fingerprint when the plan was made
    home: dict[str, str]  # sampled memory id -> its cluster then (absent: unsorted)

    def still_holds(self, state: StoreState, names: ClusterNames | None = None) -> bool:
        """Every cluster it read unchanged, every sampled memory where it was, and no new
        name taken meanwhile by a cluster it did not read."""
        for cid, fp in self.read.items():
            c = state.clusters.get(cid)
            if c is None or fingerprint(c) != fp:
                return False
        found = state.locate_many(self.ids)
        for mid in self.ids:
            where = found.get(mid)
            want = ("cluster", self.home[mid]) if mid in self.home else ("unsorted",)
            if where is None or where[: len(want)] != want:
                return False
        names = ClusterNames(state.clusters) if names is None else names
        new = [pc.name for pc in self.plan.clusters if pc.ref.startswith(NEW_PREFIX)]
        return not any(names.in_any_scope(name) - self.read.keys() for name in new)


def _lexical_plan(
    mems: list[Memory], home: dict[str, str], clusters: dict[str, Cluster], cfg: SessionConfig,
    newest: NewestTimes,
) -> _LexicalPlan:  # fmt: skip
    near = neighbourhood(mems, home, clusters, cfg, newest)
    read = {c.id: fingerprint(c) for c in near}
    others = [c.name for cid, c in clusters.items() if cid not in read]
    plan = organize(mems, near, cfg, other_names=others)
    return _LexicalPlan(plan, [m.id for m in mems], read, dict(home))


def ask(
    backend: Backend, messages: Messages, schema: Schema, seed: int, meter: Meter
) -> ChatResult:
    """Ask the model once, counting the call and its tokens (a failed answer's too: it
    still used the model)."""
    meter.calls += 1
    try:
        res = backend.chat_json(messages, schema, seed=seed)
    except BackendError as exc:
        meter.prompt_tokens += exc.prompt_tokens
        meter.completion_tokens += exc.completion_tokens
        raise
    meter.prompt_tokens += res.prompt_tokens
    meter.completion_tokens += res.completion_tokens
    return res


class ModelOrganizer:
    """Asks an SLM for the plan, chunk by chunk (aliases and a schema that enumerates them),
    two attempts with different seeds; judges an applied plan by a yes/no call on a sample
    of its assignments plus a lexical coherence check; falls back to the lexical organizer."""

    attempts = 2

    def __init__(
        self,
        backend: Backend,
        cfg: SessionConfig,
        prompts_dir: Path | None,
        judge: bool = True,
        name: bool = True,
    ) -> None:
        self.backend = backend
        self.cfg = cfg
        self.prompts_dir = prompts_dir
        self.may_judge = judge  # the competence gate's judge task: do its yes/no count?
        # its name task: else the lexical organizer names (`_lexical_profiles`)
        self.may_name = name
        self.fallback: Organizer | None = LexicalOrganizer(cfg)
        self._chunked: tuple[Snapshot, str, list[Chunk]] | None = None

    def tag(self, attempt: int, seed: int) -> Tag:
        trailers = {"attempt": attempt, "seed": seed, "status": "applied"}
        return Tag(f"{self.backend.name} attempt {attempt}", trailers, f"attempt {attempt}: ")

    def _chunks(self, snap: Snapshot) -> tuple[str, list[Chunk]]:
        """The prompt template and the chunks of this sample (made once per sample)."""
        if self._chunked is None or self._chunked[0] is not snap:
            cfg = self.cfg
            template = load_prompt(self.prompts_dir, "organize.md")
            coarse = snap.total > cfg.coarse_threshold
            ctx = self.backend.context_tokens
            try:
                chunks = make_chunks(
                    snap, template, cfg.chunk_size, ctx, coarse, self.backend.count_tokens
                )
            except BackendError:  # the tokenizer lives in the model's worker: estimate
                chunks = make_chunks(snap, template, cfg.chunk_size, ctx, coarse)
            self._chunked = (snap, template, chunks)
        return self._chunked[1], self._chunked[2]

    def propose(self, snap: Snapshot, seed: int, meter: Meter) -> Proposal:
        template, chunks = self._chunks(snap)
        meter.attempts += 1
        plan = combine(
            [self._propose_chunk(template, ch, seed, meter) for ch in chunks],
            [ch.scope for ch in chunks],
        )
        if not self.may_name:
            _lexical_profiles(plan, snap)
        sampled = snap.sampled
        return Proposal(lambda _state, _here, _names: (plan, sampled), self.cfg.validate_fraction)

    def _propose_chunk(self, template: str, chunk: Chunk, seed: int, meter: Meter) -> Plan:
        max_new = chunk.max_new
        aliases = Aliases.make(
            [m.id for m in chunk.memories], [c.id for c in chunk.clusters], max_new
        )
        schema = build_schema(list(aliases.memories), list(aliases.clusters), max_new)
        msgs = organize_messages(template, chunk.memories, chunk.clusters, max_new)
        res = ask(self.backend, msgs, schema, seed, meter)
        plan = parse_plan(res.data, aliases)
        # junk, whatever the gate said: copies of the examples, loops, one cluster for all
        lexical = organize(chunk.memories, chunk.clusters, self.cfg)
        junk = plan_junk(
            res.data,
            plan,
            prompt_examples(template),
            chunk.memories,
            len(set(lexical.assign.values())),
            self.cfg,
        )
        if junk:
            raise PlanError(junk)
        return plan

    def judge(self, checks: list[Check], seed: int, meter: Meter) -> Judgement | None:
        """Share of checked assignments judged wrong: by the SLM (yes/no) when it answers,
        and by lexical coherence (a memory sharing nothing with its cluster but much with
        another)."""
        if not checks:
            return 0.0, []
        notes: list[str] = []
        verdicts: dict[str, str] = {}
        if self.may_judge:
            try:
                verdicts = self._verdicts(checks, seed, meter)
            except (BackendError, KeyError, TypeError) as exc:
                notes.append(f"SLM validation unavailable ({exc}); lexical check only")
        wrong = 0
        for ch in checks:
            if verdicts.get(ch.mid) == "no" or not ch.lexical_ok:
                wrong += 1
                said_no = verdicts.get(ch.mid) == "no"
                why = "validator said no" if said_no else "lexically incoherent"
                notes.append(f"{ch.mid} in {ch.cluster.split(':')[0]!r}: {why}")
        return wrong / len(checks), notes

    def _verdicts(self, checks: list[Check], seed: int, meter: Meter) -> dict[str, str]:
        """memory id -> "yes" | "no", in one schema-constrained call."""
        keys = [f"A{i}" for i in range(1, len(checks) + 1)]
        schema = closed_object(
            {"verdicts": closed_object({k: one_of(["yes", "no"]) for k in keys})}
        )
        template = load_prompt(self.prompts_dir, "validate.md")
        res = ask(self.backend, validate_messages(template, keys, checks), schema, seed, meter)
        return dict(zip([c.mid for c in checks], (res.data["verdicts"][k] for k in keys)))
