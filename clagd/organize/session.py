"""A clustering session: sample, plan, apply, validate, keep or revert.

The session never touches the store directly. Everything that reads or changes it runs as an
operation on the single writer, through one callable:

    submit(op, arg) -> concurrent.futures.Future        # writer.submit
    op(ctx, arg)    runs on the writer thread (`arg` one frozen dataclass: `ApplyPlan`, ...), with ctx a `store.writer.WriteContext`:
        ctx.state                                        # store.StoreState
        ctx.touch_cluster(cid) / ctx.touch_shard(name)   # before changing a file
        ctx.commit(subject, body, trailers) -> sha | None
        ctx.revert(sha, subject, trailers) -> sha

The operations are `_snapshot_op` (what the sample and the clusters' copies are taken
from, off the writer), `_apply_op` (make the plan if it is made on the writer, validate it
against the state at that moment, apply, commit, check invariants, revert at once if they
fail), `_revert_op`, `_record_op`, `_size_view_op` (what a size-policy slice is planned on,
off the writer) and `_size_policy_op` (its plan applied). Model calls happen between
operations, so the writer (ingest, queries' index snapshots) is never blocked by a model.

Plans come from an organizer (`organize.organizers`: the lexical one when there is no model).
The session runs one path for all: every attempt the organizer allows (`_Session.attempt`),
its fallback if none was kept, then the size policy.

Outcome statuses: accepted (a plan is kept), rolled_back (reverted and nothing replaced it),
fallback (the SLM failed twice; the lexical organizer's plan is kept), failed (not even the
fallback could be applied), noop (nothing to sample, or nothing changed).
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from clagd.config import Config, SessionConfig
from clagd.errors import BackendError, ClagdError, Conflict, StoreError
from clagd.model import Cluster, new_id
from clagd.organize.organizers import (
    SEED_STEP,
    STALE_RETRIES,
    Organizer,
    Proposal,
    StalePlan,
    Tag,
    gate_note,
    organizer_for,
)
from clagd.organize.plan import Plan, PlanError
from clagd.organize.plan_apply import apply_plan
from clagd.organize.plan_checks import validate_plan
from clagd.organize.plan_invariants import Before, check_touched
from clagd.organize.sample import Check, Snapshot, lexical_ok, pick_checks, take_snapshot
from clagd.organize.similarity import ClusterScores
from clagd.organize.size_policy import SessionMemo, SizeMemo, size_slice
from clagd.organize.validation import retrievability, retrievability_problem
from clagd.scopes import scopes_trailer
from clagd.slm.base import Backend
from clagd.slm.manager import BackendManager
from clagd.slm.none import NoneBackend
from clagd.store.files import Paths, StoreState
from clagd.store.writer import WriteContext, Writer

if TYPE_CHECKING:
    from clagd.organize.gate import GateResult

log = logging.getLogger("clagd.session")

Submit = Callable[..., "Future[Any]"]  # writer.submit: (op, arg) -> Future
SessionStatus = Literal["accepted", "rolled_back", "fallback", "failed", "noop"]
# how one attempt ended: its plan kept, rejected (try the next), or a revert git refused
Verdict = Literal["kept", "rejected", "conflict"]
FAILED_STATUSES: tuple[SessionStatus, ...] = ("fallback", "rolled_back", "failed")
# slices of the size policy one session runs at most, and the session time after which it
# starts no more (a 20k-memory cluster is split in 17 slices; the next session goes on)
SIZE_SLICES = 60
SIZE_SECONDS = 8.0


@dataclass
class SessionOutcome:
    session_id: str
    trigger: str
    backend: str
    model: str
    status: SessionStatus = "noop"
    reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    commits: list[str] = field(default_factory=list)
    sampled: int = 0
    moved: int = 0
    attempts: int = 0  # plans asked of a model
    calls: int = 0
    error_rate: float | None = None
    named: int = 0  # clusters whose profile a model wrote (allowed to name, not organize)
    naming_asked: int = 0  # clusters it was asked to name
    naming_rejected: int = 0  # ... whose answer was not used; `naming_reasons` says why
    naming_reasons: list[str] = field(default_factory=list)
    naming_seconds: float = 0.0

    @property
    def asked_model(self) -> bool:
        """A model was asked for a plan (its failures count against the backend)."""
        return self.attempts > 0


def new_session_id() -> str:
    return new_id("s-", stamped=True)


# -- writer ops ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCommit:
    """How a plan's commit is described: the session, the plan's label in the subject, the
    trailers, the seed of the checks it picks, and notes for the body."""

    sid: str
    label: str
    trailers: dict[str, Any]
    seed: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplyProposal:
    """`_apply_op`'s argument: a proposal, made into a plan on the writer."""

    proposal: Proposal
    commit: PlanCommit
    here: bool = True  # the writer makes the plan itself when the one made ahead is stale


@dataclass(frozen=True)
class ApplyPlan:
    """`_apply_plan_op`'s argument: a plan for the sampled memories, the share of its
    assignments to check (0: a lexical plan, not measured), and its commit."""

    plan: Plan
    sampled: list[str]
    check_fraction: float
    commit: PlanCommit


@dataclass(frozen=True)
class RevertCommit:
    """`_revert_op`'s argument: the commit to revert and the revert's subject and trailers."""

    sha: str
    subject: str
    trailers: dict[str, Any]


@dataclass(frozen=True)
class Record:
    """`_record_op`'s argument: an empty commit's subject, body and trailers."""

    subject: str
    body: str
    trailers: dict[str, Any]


@dataclass(frozen=True)
class SizePolicy:
    """`_size_policy_op`'s argument: the session, its trailers, one slice's plan (made off
    the writer, `_size_view_op`) and the largest a merge may make a cluster."""

    sid: str
    trailers: dict[str, Any]
    plan: Plan
    max_size: int


def _snapshot_op(ctx: WriteContext) -> StoreState:
    """What the session's snapshot is taken from, off the writer: the committed copies of
    the hot clusters (`ctx.hot_clusters`, one dict copy) and the unsorted shards' lists
    (the unsorted memories only). The sample is chosen and the clusters copied on the
    session's thread (issue 26: both read the whole store)."""
    unsorted = {name: list(mems) for name, mems in ctx.state.unsorted.items()}
    return StoreState(ctx.hot_clusters(), {}, unsorted)


@dataclass
class ApplyResult:
    sha: str | None = None
    revert_sha: str | None = None
    problems: list[str] = field(default_factory=list)  # plan rejected before any change
    invariant_problems: list[str] = field(default_factory=list)
    moved: int = 0
    checks: list[Check] = field(default_factory=list)
    assigned: int = 0  # assignments the lexical coherence check looked at (all of them)
    incoherent: list[str] = field(default_factory=list)
    retrievable: tuple[float, float] = (1.0, 1.0)  # share of pseudo-queries found: before, after
    retrieval_problem: str | None = None
    stale: bool = False  # the plan made off the writer no longer held: nothing was done

    @property
    def commits(self) -> list[str]:
        """The commits it made: the plan's, and its revert if an invariant failed."""
        return [x for x in (self.sha, self.revert_sha) if x]

    def rejected(self, most: int) -> str:
        """Why it was not kept, in at most `most` problems ("" when it was)."""
        return "; ".join((self.problems + self.invariant_problems)[:most])


def _apply_op(ctx: WriteContext, arg: ApplyProposal) -> ApplyResult:
    """Make the proposal's plan against the state as it is now, and apply it."""
    try:
        made = arg.proposal.make(ctx.state, arg.here, ctx.cluster_names())
    except StalePlan:
        return ApplyResult(stale=True)
    if made is None:
        return ApplyResult()
    plan, sampled = made
    return _apply_plan_op(ctx, ApplyPlan(plan, sampled, arg.proposal.check_fraction, arg.commit))


def _apply_plan_op(ctx: WriteContext, arg: ApplyPlan) -> ApplyResult:
    """Validate, apply, commit, check the invariants (revert at once when they fail), and
    pick the assignments to check."""
    plan, sampled, check_fraction, how = arg.plan, arg.sampled, arg.check_fraction, arg.commit
    sid, trailers = how.sid, how.trailers
    state = ctx.state
    res = ApplyResult()
    # memories removed from the store meanwhile are no longer part of the sample
    found = state.locate_many(sampled)
    present = [mid for mid in sampled if mid in found]
    plan.assign = {
        mid: ref for mid, ref in plan.assign.items() if mid in found or mid not in sampled
    }
    res.problems = validate_plan(plan, present, state, ctx.cluster_names())
    if res.problems:
        return res
    # the names before of the clusters the plan may rename (only those it describes)
    old_names = {pc.ref: c.name for pc in plan.clusters if (c := state.clusters.get(pc.ref))}
    # a model's plan (the lexical ones are not checked) is measured before and after
    baseline = _Baseline.take(state, plan) if check_fraction > 0 else None
    before = Before(state, ctx)  # the places the plan changes, as they were
    applied = apply_plan(state, plan, touch=before)
    res.moved = applied.moved
    renamed = [
        cid
        for cid in applied.changed
        if cid in applied.created.values()
        or old_names.get(cid) not in (None, state.clusters[cid].name)
    ]
    subject, body = plan.commit_text(
        state, sid, how.label, len(present), [*applied.notes, *how.notes]
    )
    moved = {found[mid][2].scope for mid in present}
    res.sha = ctx.commit(subject, body, {**trailers, **scopes_trailer(moved)})
    dropped = [m.id for m in applied.dropped]  # (the names: the commit's change included)
    res.invariant_problems = check_touched(before, state, dropped, renamed, ctx.cluster_names())
    if res.invariant_problems and res.sha:
        res.revert_sha = _revert_op(
            ctx,
            RevertCommit(
                res.sha,
                f"revert: session {sid} broke an invariant: {res.invariant_problems[0]}",
                {**trailers, "kind": "revert", "reason": "invariant", "status": "rolled_back"},
            ),
        )
        return res
    final = {mid: applied.created.get(ref, ref) for mid, ref in plan.assign.items()}
    if baseline is not None:  # a model's plan: the index's BM25 of the clusters now
        scored = ClusterScores(state.clusters)
        res.checks = pick_checks(state, final, check_fraction, random.Random(how.seed), scored)
        baseline.compare(state, final, sorted(applied.changed), res, scored)
    return res


@dataclass
class _Baseline:
    """The clusters before a model's plan, for the label-free checks after it: the lexical
    coherence of every assignment, and retrievability (`organize.validation`)."""

    clusters: dict[str, Cluster]
    home: dict[str, str | None]

    @classmethod
    def take(cls, state: StoreState, plan: Plan) -> _Baseline:
        clusters = {cid: copy.copy(c) for cid, c in state.clusters.items()}
        for c in clusters.values():
            c.memories = list(c.memories)
        home: dict[str, str | None] = {}
        for mid in plan.assign:
            where = state.locate(mid)
            home[mid] = where[1] if where is not None and where[0] == "cluster" else None
        return cls(clusters, home)

    def compare(
        self,
        state: StoreState,
        final: dict[str, str],
        touched: list[str],
        res: ApplyResult,
        scored: ClusterScores,
    ) -> None:
        res.assigned = len(final)
        res.incoherent = [
            mid for mid, cid in final.items() if not lexical_ok(state, mid, cid, scored)
        ]
        moved = [mid for mid, cid in final.items() if self.home.get(mid) != cid]
        b, a, notes = retrievability(
            self.clusters, state.clusters, moved, self.home, final, touched, 1, scored
        )
        res.retrievable = (b, a)
        res.retrieval_problem = retrievability_problem(b, a, notes)


def _revert_op(ctx: WriteContext, arg: RevertCommit) -> str:
    """`git revert` a session commit. If git made the revert commit but re-reading the files
    it touched failed, the whole state is reloaded from disk, so it matches HEAD."""
    head, sha = ctx.git.head(), arg.sha
    try:
        return str(ctx.revert(sha, arg.subject, arg.trailers))
    except StoreError:
        new = ctx.git.head()
        if new == head:
            raise
        log.warning("reloading the whole store after reverting %s", sha[:10])
        ctx.reload_all()
        return str(new)


def _size_view_op(ctx: WriteContext) -> dict[str, Cluster] | None:
    """The committed copies of the store's hot clusters, which a size-policy slice is
    planned on, off the writer (issue 26: a slice planned on the writer read every cluster
    there); None when the daemon is stopping."""
    return None if ctx.w.closing else ctx.hot_clusters()


def _size_policy_op(ctx: WriteContext, arg: SizePolicy) -> ApplyResult:
    """Apply one slice's plan to the store as it is now, validated and checked as every
    plan; a merge whose clusters grew past the maximum meanwhile is left out."""
    plan, hot = arg.plan, ctx.state.clusters
    plan.clusters = [
        pc
        for pc in plan.clusters
        if sum(len(hot[c].memories) for c in (pc.ref, *pc.merge_from) if c in hot) <= arg.max_size
        or not pc.merge_from
    ]
    if plan.is_empty():
        return ApplyResult()
    how = PlanCommit(arg.sid, "size policy", arg.trailers)
    return _apply_plan_op(ctx, ApplyPlan(plan, list(plan.assign), 0.0, how))


def _record_op(ctx: WriteContext, arg: Record) -> str | None:
    """An empty commit that records a session's failure, so `git log` / `clagd log` show it
    even when nothing in the store changed."""
    return ctx.record(arg.subject, arg.body, arg.trailers)


# -- the session -------------------------------------------------------------------------


def run_session(
    submit: Submit,
    backend: Backend | None,
    config: Config,
    prompts_dir: Path | None = None,
    trigger: str = "manual",
    access: Mapping[str, int] | None = None,
    session_id: str | None = None,
    seed: int | None = None,
    gate: GateResult | None = None,
    memo: SessionMemo | None = None,
    scope: str | None = None,
) -> SessionOutcome:
    """Run one session to its end and say what happened. `backend` None (or a
    `NoneBackend`) means the lexical organizer; so does a `gate` verdict that the model may
    not organize (the outcome says why). `memo`: what sessions remember of this store (its
    engine's; None: a fresh one). `scope`: that scope's memories and clusters only (None:
    every scope, each on its own). Raises only for errors of the store itself."""
    memo = memo if memo is not None else SessionMemo()
    organizer = organizer_for(backend, config.session, prompts_dir, gate, memo.newest)
    session = _Session(submit, organizer, config.session, trigger, session_id, seed, memo.size)
    session.scope = scope
    session.out.reasons.extend(gate_note(backend, gate))
    return session.run(access)


class _Session:
    """One session's run: its outcome, and the steps that fill it in."""

    def __init__(
        self,
        submit: Submit,
        organizer: Organizer,
        cfg: SessionConfig,
        trigger: str,
        session_id: str | None,
        seed: int | None,
        size_memo: SizeMemo,
    ) -> None:
        self.start = time.monotonic()
        self.size_memo = size_memo  # the store's (`SessionMemo.size`)
        self.submit = submit
        self.organizer = organizer
        self.cfg = cfg
        self.trigger = trigger
        backend = organizer.backend
        self.out = SessionOutcome(
            session_id or new_session_id(), trigger, backend.name, backend.model
        )
        self.base_seed = seed if seed is not None else backend.seed
        self.scope: str | None = None  # a session of one scope sees only its memories
        self.access: Mapping[str, int] | None = None  # the store's, when it runs

    @property
    def sid(self) -> str:
        return self.out.session_id

    def trailers(
        self, kind: str = "cluster", backend: Backend | None = None, **extra: Any
    ) -> dict[str, Any]:
        """The commit trailers: this session, the backend that made the plan (the
        session's own unless `backend` says otherwise), then `extra`."""
        b = backend or self.organizer.backend
        t = {"kind": kind, "session": self.sid, "trigger": self.trigger}
        return {**t, "backend": b.name, "model": b.model, **extra}

    def snapshot(self) -> Snapshot:
        """The memories to organize now (off the writer, from the committed copies)."""
        view: StoreState = self.submit(_snapshot_op).result()
        return take_snapshot(view, self.cfg.sample_size, self.access, self.scope)

    def run(self, access: Mapping[str, int] | None) -> SessionOutcome:
        self.access = access
        snap = self.snapshot()
        self.out.sampled = len(snap.sample)
        if not snap.sample:
            self.out.reasons.append("nothing to organize")
            return self.finish("noop")
        status: SessionStatus | None = None
        verdict = self.organize(snap)
        if verdict == "conflict":
            return self.finish("failed")
        if verdict == "rejected":
            fallback = self.organizer.fallback
            if fallback is None:
                return self.finish("failed")
            status = self.fall_back(fallback, snap)
        self.size_policy()
        return self.finish(status or ("accepted" if self.out.commits else "noop"))

    def organize(self, snap: Snapshot) -> Verdict:
        """Every attempt the organizer allows, until a plan is kept."""
        for attempt in range(1, self.organizer.attempts + 1):
            seed = self.base_seed + (attempt - 1) * SEED_STEP
            tag = self.organizer.tag(attempt, seed)
            verdict, _res = self.attempt(
                self.organizer, snap, seed, tag, self.trailers(**tag.trailers)
            )
            if verdict != "rejected":
                return verdict
        return "rejected"

    def attempt(
        self,
        organizer: Organizer,
        snap: Snapshot,
        seed: int,
        tag: Tag,
        trailers: dict[str, Any],
        notes: list[str] | None = None,
    ) -> tuple[Verdict, ApplyResult | None]:
        """Obtain a plan, apply it (validated on the writer), judge it, keep or revert it."""
        out = self.out
        how = PlanCommit(self.sid, tag.label, trailers, seed, tuple(notes or ()))
        for tries_left in range(STALE_RETRIES, -1, -1):
            try:
                proposal = organizer.propose(snap, seed, out)
            except (BackendError, PlanError) as exc:
                out.reasons.append(f"{tag.who}{exc}")
                return "rejected", None
            arg = ApplyProposal(proposal, how, here=tries_left == 0)
            res: ApplyResult = self.submit(_apply_op, arg).result()
            if not res.stale:
                break
            snap = self.snapshot()  # a write changed what the plan read: again, off the writer
        out.commits += res.commits
        if res.problems:
            out.reasons.append(f"{tag.who}plan rejected: {'; '.join(res.problems[:4])}")
            return "rejected", res
        if res.invariant_problems:
            shown = "; ".join(res.invariant_problems[:3])
            out.reasons.append(f"{tag.who}invariant failed, reverted: {shown}")
            return "rejected", res
        judged = organizer.judge(res.checks, seed, out)
        if judged is not None:
            verdict = self.keep_or_revert(res, tag, *self.label_free(res, *judged))
            if verdict != "kept":
                return verdict, res
        out.moved = res.moved
        return "kept", res

    def label_free(
        self, res: ApplyResult, rate: float, notes: list[str]
    ) -> tuple[float, list[str]]:
        """Fold the checks that need no labels into the judged error rate: lexical coherence
        on every assignment, and retrievability before and after."""
        if res.assigned:
            lexical = len(res.incoherent) / res.assigned
            if lexical > self.cfg.max_error_rate:
                rate = max(rate, lexical)
                notes = [f"{len(res.incoherent)} of {res.assigned} assignments lexically "
                         "incoherent", *notes]  # fmt: skip
        if res.retrieval_problem:
            rate, notes = 1.0, [res.retrieval_problem, *notes]
        return rate, notes

    def keep_or_revert(self, res: ApplyResult, tag: Tag, rate: float, notes: list[str]) -> Verdict:
        """Revert an applied plan whose judged error rate is too high."""
        out, most = self.out, self.cfg.max_error_rate
        out.error_rate = rate
        if rate <= most:
            out.reasons.extend(notes[:3])
            return "kept"
        out.reasons.append(
            f"{tag.who}validation error rate {rate:.0%} > {most:.0%} ({'; '.join(notes[:3])})"
        )
        if not res.sha:
            return "rejected"
        try:
            rsha = self.submit(
                _revert_op,
                RevertCommit(
                    res.sha,
                    f"revert: session {self.sid}: validation error rate {rate:.0%}",
                    self.trailers("revert", reason="validation", status="rolled_back"),
                ),
            ).result()
        except Conflict as exc:
            # a later commit (an ingest routed into a new cluster) touched the same files:
            # git refuses, the plan stays, the outcome says so
            out.reasons.append(f"cannot revert {res.sha[:10]}: {exc}")
            return "conflict"
        out.commits.append(rsha)
        return "rejected"

    def fall_back(self, fallback: Organizer, snap: Snapshot) -> SessionStatus:
        """The fallback organizer on the same sample, once; the outcome says why."""
        out = self.out
        primary = self.organizer.backend.name
        tag = fallback.tag(1, self.base_seed)
        tag = Tag(tag.label, tag.trailers, f"{tag.who}fallback ")
        extra = {**tag.trailers, "status": "fallback", "fallback": primary}
        trailers = self.trailers(backend=fallback.backend, **extra)
        notes = [f"SLM plan rejected: {w}" for w in out.reasons[-4:]]
        verdict, res = self.attempt(fallback, snap, self.base_seed, tag, trailers, notes)
        if verdict != "kept":
            status: SessionStatus = "rolled_back" if out.commits else "failed"
            self.record(status)
            return status
        out.reasons.append("lexical organizer applied to the sample")
        if res is None or not res.sha:
            self.record("fallback")
        return "fallback"

    def record(self, status: SessionStatus) -> None:
        """An empty commit that says the model's plan was not kept."""
        out = self.out
        body = "\n".join(f"- {r}" for r in out.reasons)
        subject = f"session: {self.sid} {status.replace('_', ' ')}: the SLM plan was not kept"
        try:
            sha = self.submit(
                _record_op, Record(subject, body, self.trailers("session", status=status))
            ).result()
        except Exception as exc:  # noqa: BLE001 - the outcome still reports the failure
            log.warning("could not record session %s in git: %s", self.sid, exc)
            return
        if sha:
            out.commits.append(sha)

    def size_policy(self) -> None:
        """Slices of the size policy, writes running between them, until nothing is left,
        `SIZE_SLICES` ran or the session has run `SIZE_SECONDS` (the next one goes on)."""
        trailers, most = self.trailers(policy="size"), self.cfg.max_cluster_size
        for _ in range(SIZE_SLICES):
            view = self.submit(_size_view_op).result()
            if view is None:  # the slices done so far stay committed, as after a kill
                self.out.reasons.append("size policy abandoned: the daemon is stopping")
                return
            memo = self.size_memo
            part = size_slice(StoreState(view), self.cfg, memo, scope=self.scope)  # off writer
            if part.plan is not None:
                arg = SizePolicy(self.sid, trailers, part.plan, most)
                res: ApplyResult = self.submit(_size_policy_op, arg).result()
                self.out.commits += res.commits
                if res.problems or res.invariant_problems:
                    memo.seen.clear()  # what this slice saw is looked at again
                    self.out.reasons.append(f"size policy skipped: {res.rejected(2)}")
                    return
            if not part.more or time.monotonic() - self.start > SIZE_SECONDS:
                return

    def finish(self, status: SessionStatus) -> SessionOutcome:
        out = self.out
        out.status = status
        out.seconds = time.monotonic() - self.start
        log.info(
            "session %s (%s, %s/%s): %s%s",
            self.sid,
            self.trigger,
            out.backend,
            out.model,
            status,
            f" - {'; '.join(out.reasons[-3:])}" if out.reasons else "",
        )
        return out


# -- the engine's hook --------------------------------------------------------------------


class _AccessCounts(Protocol):
    def most_accessed(self, n: int) -> list[str]: ...


class SessionHost(Protocol):
    """What the runner needs of an engine (`engine.core.Engine`; organize/ sits below it)."""

    @property
    def config(self) -> Config: ...

    @property
    def writer(self) -> Writer: ...

    @property
    def paths(self) -> Paths: ...

    @property
    def stats(self) -> _AccessCounts: ...

    @property
    def session_memo(self) -> SessionMemo: ...


def _gate(engine: SessionHost, chosen: Backend | None) -> GateResult | None:
    """The competence gate's verdict on the chosen model: cached in .clagd/gate/, measured
    on first use (a few calls on the shipped labelled set); None for no model, or when
    `backend.gate.enabled` is off."""
    if chosen is None or isinstance(chosen, NoneBackend) or not engine.config.backend.gate.enabled:
        return None
    from clagd.organize.gate import gate_for

    return gate_for(chosen, engine.config, engine.paths.runtime / "gate", engine.paths.prompts)


def engine_session_runner(backends: BackendManager) -> Callable[..., SessionOutcome]:
    """The engine's `session_runner` hook: run a session on an engine with the backend the
    manager (`slm.BackendManager`) has chosen, or the one `backend` names."""

    def runner(
        engine: SessionHost,
        trigger: str = "manual",
        backend: str | None = None,
        scope: str | None = None,
    ) -> SessionOutcome:
        chosen: Backend | None
        if backend == NoneBackend.name:
            chosen = NoneBackend()
        else:
            chosen = backends.get()
            if backend and (chosen is None or chosen.name != backend):
                raise ClagdError(
                    f"backend {backend!r} is not available ({backends.reason})", code="backend"
                )
        ranked = engine.stats.most_accessed(engine.config.session.sample_size)
        access = {mid: len(ranked) - i for i, mid in enumerate(ranked)}
        outcome = run_session(
            engine.writer.submit,
            chosen,
            engine.config,
            prompts_dir=engine.paths.prompts,
            trigger=trigger,
            access=access,
            gate=_gate(engine, chosen),
            memo=engine.session_memo,
            scope=scope,
        )
        if outcome.status in FAILED_STATUSES and outcome.asked_model:
            backends.record_failure("; ".join(outcome.reasons[-2:]))
        return outcome

    return runner
