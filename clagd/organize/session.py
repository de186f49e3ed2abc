"""A clustering session: sample, prompt, SLM plan, apply, validate, keep or revert.

The session never touches the store directly. Everything that reads or changes it runs as an
operation on the single writer, through one callable:

    submit(op, *args) -> concurrent.futures.Future      # writer.submit
    op(ctx, *args)  runs on the writer thread, with
        ctx.state                                        # store.StoreState
        ctx.touch_cluster(cid) / ctx.touch_shard(name)   # before changing a file
        ctx.commit(subject, body, trailers) -> sha | None
        ctx.revert(sha, subject, trailers) -> sha

The operations are `_snapshot_op` (copies of the sample and the clusters), `_apply_op`
(validate against the state at that moment, apply, commit, check invariants, revert at once if
they fail), `_revert_op`, `_fallback_op` (the lexical organizer on the same sample) and
`_size_policy_op`. The SLM calls happen between operations, so the writer (ingest, queries'
index snapshots) is never blocked by a model.

Outcome statuses: accepted (an SLM plan is kept), rolled_back (reverted and nothing replaced
it), fallback (the SLM failed twice; the lexical organizer's plan is kept), failed (not even
the fallback could be applied), noop (nothing to sample, or nothing changed).
"""

from __future__ import annotations

import copy
import logging
import math
import random
import secrets
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clagd.config import Config
from clagd.errors import BackendError, ClagdError, Conflict, StoreError
from clagd.model import Cluster, Memory, parse_time
from clagd.organize.plan import (
    NEW_PREFIX,
    Aliases,
    Plan,
    PlanCluster,
    PlanError,
    apply_plan,
    build_schema,
    check_invariants,
    parse_plan,
    size_policy,
    validate_plan,
)
from clagd.organize.similarity import cluster_terms, label_terms, terms
from clagd.slm.base import Backend
from clagd.slm.none import MODEL as NONE_MODEL
from clagd.slm.none import NAME as NONE_NAME
from clagd.slm.none import lexical_plan
from clagd.slm.schema import closed_object, one_of
from clagd.store.files import template_dir
from clagd.text import estimate_tokens

log = logging.getLogger("clagd.session")

Submit = Callable[..., Any]  # writer.submit: (op, *args) -> Future
MAX_CANDIDATE_CLUSTERS = 8
MAX_NEW_PER_CHUNK = 6
MAX_CHECKS = 20
MEMORY_CHARS = 240


@dataclass
class SessionOutcome:
    session_id: str
    trigger: str
    backend: str
    model: str
    status: str = "noop"  # accepted | rolled_back | fallback | failed | noop
    reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    commits: list[str] = field(default_factory=list)
    sampled: int = 0
    moved: int = 0
    attempts: int = 0
    calls: int = 0
    error_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_session_id() -> str:
    return "s-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


# -- prompts -----------------------------------------------------------------------------


def load_prompt(prompts_dir: Path | None, name: str) -> str:
    """`<store>/prompts/<name>` (user-editable, versioned with the memories), else the copy
    shipped with clagd."""
    for d in ([Path(prompts_dir)] if prompts_dir else []) + [template_dir() / "prompts"]:
        path = d / name
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise ClagdError(f"prompt template {name} not found in {prompts_dir}")


ORGANIZE_FORMAT = (
    '{"clusters": [{"id": "N1", "name": "two to five words", "description": "One sentence.", '
    '"tags": ["word"], "merge": ["C2"]}], "assign": {"M1": "C1", "M2": "N1"}, '
    '"conflicts": [{"newer": "M2", "older": "M1"}], "reason": "One short sentence."}\n'
    "ids: memories M1..M<n>; existing clusters C1..C<c>; new clusters N1..N<k>"
)
VALIDATE_FORMAT = '{"verdicts": {"A1": "yes", "A2": "no"}} with one verdict per check'


def _render(template: str, **values: str) -> str:
    return string.Template(template).safe_substitute(**values).strip()


def _clip(text: str, n: int = MEMORY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _day(m: Memory) -> str:
    t = parse_time(m.created_at)
    return t.strftime("%Y-%m-%d") if t else ""


# -- snapshot (writer op) ---------------------------------------------------------------


@dataclass
class Snapshot:
    sample: list[Memory]
    home: dict[str, str | None]  # sampled memory id -> its cluster id (None: unsorted)
    clusters: dict[str, Cluster]  # copies of every hot cluster
    total: int


def choose_sample(
    state: Any, size: int, access: Mapping[str, int] | None = None
) -> list[tuple[Memory, str | None]]:
    """Unsorted memories first (oldest first), then the most recently added clustered ones
    and the most accessed, interleaved, up to `size`."""
    picked: dict[str, tuple[Memory, str | None]] = {}
    for mems in state.unsorted.values():
        for m in sorted(mems, key=lambda m: m.created_at):
            if len(picked) < size:
                picked.setdefault(m.id, (m, None))
    clustered = [(m, cid) for cid, c in state.clusters.items() for m in c.memories]
    recent = sorted(clustered, key=lambda p: p[0].created_at, reverse=True)
    hot = sorted(clustered, key=lambda p: -(access or {}).get(p[0].id, 0)) if access else []
    for i in range(max(len(recent), len(hot))):
        for seq in (recent, hot):
            if len(picked) >= size:
                break
            if i < len(seq):
                picked.setdefault(seq[i][0].id, seq[i])
    return list(picked.values())


def _snapshot_op(ctx: Any, size: int, access: Mapping[str, int] | None) -> Snapshot:
    state = ctx.state
    sample = choose_sample(state, size, access)
    total = sum(len(c.memories) for c in state.clusters.values()) + sum(
        len(v) for v in state.unsorted.values()
    )
    return Snapshot(
        sample=[copy.deepcopy(m) for m, _ in sample],
        home={m.id: cid for m, cid in sample},
        clusters={cid: copy.deepcopy(c) for cid, c in state.clusters.items()},
        total=total,
    )


# -- proposing a plan (SLM calls, off the writer) ----------------------------------------


@dataclass
class _Chunk:
    memories: list[Memory]
    clusters: list[Cluster]


def _candidates(mems: list[Memory], snap: Snapshot, limit: int) -> list[Cluster]:
    """The clusters a chunk's memories live in, then the lexically closest others."""
    own = []
    for m in mems:
        cid = snap.home.get(m.id)
        if cid and cid in snap.clusters and snap.clusters[cid] not in own:
            own.append(snap.clusters[cid])
    words: set[str] = set()
    for m in mems:
        words |= terms(m.content)
    others = [c for c in snap.clusters.values() if c not in own]
    others.sort(key=lambda c: (-len(words & cluster_terms(c)), -len(c.memories), c.id))
    return own + others[: max(0, limit - len(own))]


def _organize_messages(
    template: str, mems: list[Memory], clusters: list[Cluster], max_new: int
) -> list[dict[str, str]]:
    fmt = (
        ORGANIZE_FORMAT.replace("<n>", str(len(mems)))
        .replace("<c>", str(len(clusters)))
        .replace("<k>", str(max_new))
    )
    if not clusters:
        fmt = fmt.replace("existing clusters C1..C0; ", "no existing clusters; ")
    system = _render(template, answer_format=fmt)
    lines = ["Existing clusters:"]
    if not clusters:
        lines.append("(none)")
    for i, c in enumerate(clusters, 1):
        ex = f' e.g. "{_clip(c.memories[0].content, 80)}"' if c.memories else ""
        tags = f" [{', '.join(c.tags)}]" if c.tags else ""
        lines.append(
            f'C{i} "{c.name}": {_clip(c.description, 120)}{tags} ({len(c.memories)} memories){ex}'
        )
    lines.append("Memories:")
    for i, m in enumerate(mems, 1):
        day = _day(m)
        lines.append(f"M{i}: {_clip(m.content)}{f' ({day})' if day else ''}")
    if max_new:
        lines.append(f"You may create up to {max_new} new clusters (N1..N{max_new}).")
    lines.append("Answer:")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def _output_reserve(n_mems: int, max_new: int) -> int:
    return 40 + 10 * n_mems + 60 * max_new


def make_chunks(
    snap: Snapshot, template: str, chunk_size: int, context_tokens: int, coarse: bool
) -> list[_Chunk]:
    """Split the sample so that every call (prompt + answer) fits the context window.

    Coarse to fine: on a large store the sample is first ordered by its closest existing
    cluster (a cheap lexical pass), so each chunk covers one broad area and the SLM refines
    clusters inside it.
    """
    mems = list(snap.sample)
    if coarse and snap.clusters:
        order = {cid: i for i, cid in enumerate(sorted(snap.clusters))}
        profile = {cid: cluster_terms(c) for cid, c in snap.clusters.items()}

        def area(m: Memory) -> tuple[int, str]:
            cid = snap.home.get(m.id)
            if cid is None:
                w = terms(m.content)
                cid = max(profile, key=lambda k: (len(w & profile[k]), k))
            return (order.get(cid, -1), m.created_at)

        mems.sort(key=area)
    out: list[_Chunk] = []
    pending = [mems[i : i + max(1, chunk_size)] for i in range(0, len(mems), max(1, chunk_size))]
    while pending:
        part = pending.pop(0)
        clusters = _candidates(part, snap, MAX_CANDIDATE_CLUSTERS)
        max_new = min(MAX_NEW_PER_CHUNK, max(1, math.ceil(len(part) / 2)))
        msgs = _organize_messages(template, part, clusters, max_new)
        need = sum(estimate_tokens(m["content"]) for m in msgs) + _output_reserve(
            len(part), max_new
        )
        if need > context_tokens and len(part) > 1:
            half = len(part) // 2
            pending[:0] = [part[:half], part[half:]]
            continue
        while need > context_tokens and len(clusters) > 1:
            clusters = clusters[:-1]
            msgs = _organize_messages(template, part, clusters, max_new)
            need = sum(estimate_tokens(m["content"]) for m in msgs) + _output_reserve(
                len(part), max_new
            )
        out.append(_Chunk(part, clusters))
    return out


def _propose_chunk(
    backend: Backend, template: str, chunk: _Chunk, seed: int, outcome: SessionOutcome
) -> Plan:
    max_new = min(MAX_NEW_PER_CHUNK, max(1, math.ceil(len(chunk.memories) / 2)))
    aliases = Aliases.make([m.id for m in chunk.memories], [c.id for c in chunk.clusters], max_new)
    schema = build_schema(list(aliases.memories), list(aliases.clusters), max_new)
    msgs = _organize_messages(template, chunk.memories, chunk.clusters, max_new)
    outcome.calls += 1
    res = backend.chat_json(msgs, schema, seed=seed)
    outcome.prompt_tokens += res.prompt_tokens
    outcome.completion_tokens += res.completion_tokens
    return parse_plan(res.data, aliases)


def combine(plans: list[Plan]) -> Plan:
    """One plan from the chunks' plans. New clusters are renumbered per chunk, and new
    clusters with the same name (case-insensitive) in different chunks become one."""
    out = Plan()
    by_ref: dict[str, PlanCluster] = {}
    new_by_name: dict[str, tuple[int, str]] = {}  # name -> (chunk, ref)
    merged: set[str] = set()
    reasons = []
    for i, p in enumerate(plans, 1):
        remap: dict[str, str] = {}
        for pc in p.clusters:
            if pc.ref.startswith(NEW_PREFIX):
                key = pc.name.casefold()
                if key in new_by_name and new_by_name[key][0] != i:
                    remap[pc.ref] = new_by_name[key][1]
                    continue
                ref = f"{NEW_PREFIX}{i}-{pc.ref[len(NEW_PREFIX) :]}"
                remap[pc.ref] = ref
                new_by_name.setdefault(key, (i, ref))
                pc = PlanCluster(ref, pc.name, pc.description, pc.tags, pc.merge_from)
            elif pc.ref in by_ref:
                continue  # an existing cluster renamed in two chunks: the first one wins
            srcs = [s for s in pc.merge_from if s not in merged and s != pc.ref]
            merged.update(srcs)
            pc = PlanCluster(pc.ref, pc.name, pc.description, pc.tags, srcs)
            by_ref[pc.ref] = pc
            out.clusters.append(pc)
        for mid, ref in p.assign.items():
            out.assign[mid] = remap.get(ref, ref)
        out.conflicts.extend(p.conflicts)
        if p.reason:
            reasons.append(p.reason)
    out.reason = " ".join(reasons)[:600]
    return out


# -- applying (writer ops) ---------------------------------------------------------------


@dataclass
class Check:
    mid: str
    content: str
    cid: str
    cluster: str  # name: description
    examples: list[str]
    lexical_ok: bool


@dataclass
class ApplyResult:
    sha: str | None = None
    revert_sha: str | None = None
    problems: list[str] = field(default_factory=list)  # plan rejected before any change
    invariant_problems: list[str] = field(default_factory=list)
    moved: int = 0
    checks: list[Check] = field(default_factory=list)


def _all_ids(state: Any) -> set[str]:
    ids = {m.id for c in state.clusters.values() for m in c.memories}
    ids |= {m.id for c in state.archived.values() for m in c.memories}
    ids |= {m.id for mems in state.unsorted.values() for m in mems}
    return ids


def _lexical_ok(state: Any, mid: str, cid: str) -> bool:
    """An assignment is lexically incoherent only when the memory shares no term with its
    cluster while another cluster shares at least two: SLM plans group by use, not words."""
    m = state.memory(mid)
    own = state.clusters.get(cid)
    if m is None or own is None:
        return False
    words = terms(m.content)
    if not words:
        return True
    mine = label_terms(own)
    for x in own.memories:
        if x.id != mid:
            mine |= terms(x.content)
    if words & mine:
        return True
    best_other = max(
        (len(words & cluster_terms(c)) for k, c in state.clusters.items() if k != cid),
        default=0,
    )
    return best_other < 2


def _pick_checks(
    state: Any, assign: dict[str, str], fraction: float, rng: random.Random
) -> list[Check]:
    items = sorted(assign.items())
    if not items or fraction <= 0:
        return []
    n = min(len(items), MAX_CHECKS, max(1, round(fraction * len(items))))
    out = []
    for mid, cid in rng.sample(items, n):
        c = state.clusters.get(cid)
        m = state.memory(mid)
        if c is None or m is None:
            continue
        others = [_clip(x.content, 100) for x in c.memories if x.id != mid][:2]
        out.append(
            Check(
                mid,
                _clip(m.content, 160),
                cid,
                f"{c.name}: {_clip(c.description, 120)}",
                others,
                _lexical_ok(state, mid, cid),
            )
        )
    return out


def _commit_text(
    plan: Plan, state: Any, sid: str, label: str, n: int, notes: list[str]
) -> tuple[str, str]:
    new = sum(1 for pc in plan.clusters if pc.ref.startswith(NEW_PREFIX))
    merges = sum(len(pc.merge_from) for pc in plan.clusters)
    subject = f"cluster: session {sid} ({label}): {n} memories, {new} new clusters"
    if merges:
        subject += f", {merges} merged"
    body = plan.summary(state)
    if plan.reason:
        body += ["", f"Reason: {plan.reason}"]
    if notes:
        body += ["", *notes]
    return subject, "\n".join(body)


def _apply_op(
    ctx: Any,
    plan: Plan,
    sampled: list[str],
    sid: str,
    label: str,
    trailers: dict[str, Any],
    check_fraction: float,
    seed: int,
    extra_notes: list[str] | None = None,
) -> ApplyResult:
    state = ctx.state
    res = ApplyResult()
    # memories removed from the store meanwhile are no longer part of the sample
    present = [mid for mid in sampled if state.locate(mid) is not None]
    plan.assign = {
        mid: ref for mid, ref in plan.assign.items() if mid in present or mid not in sampled
    }
    res.problems = validate_plan(plan, present, state)
    if res.problems:
        return res
    before = _all_ids(state)
    old_names = {cid: c.name for cid, c in state.clusters.items()}
    applied = apply_plan(state, plan, touch=ctx)
    res.moved = applied.moved
    renamed = [
        cid
        for cid in applied.changed
        if cid in applied.created.values()
        or old_names.get(cid) not in (None, state.clusters[cid].name)
    ]
    subject, body = _commit_text(
        plan, state, sid, label, len(present), applied.notes + (extra_notes or [])
    )
    res.sha = ctx.commit(subject, body, trailers)
    res.invariant_problems = check_invariants(
        before, state, dropped=[m.id for m in applied.dropped], renamed=renamed
    )
    if res.invariant_problems and res.sha:
        res.revert_sha = _revert_op(
            ctx,
            res.sha,
            f"revert: session {sid} broke an invariant: {res.invariant_problems[0]}",
            {**trailers, "kind": "revert", "reason": "invariant", "status": "rolled_back"},
        )
        return res
    final = {mid: applied.created.get(ref, ref) for mid, ref in plan.assign.items()}
    res.checks = _pick_checks(state, final, check_fraction, random.Random(seed))
    return res


def _revert_op(ctx: Any, sha: str, subject: str, trailers: dict[str, Any]) -> str:
    """`git revert` a session commit. If git made the revert commit but re-reading the files
    it touched failed, the whole state is reloaded from disk, so it matches HEAD."""
    head = ctx.git.head()
    try:
        return str(ctx.revert(sha, subject, trailers))
    except StoreError:
        new = ctx.git.head()
        if new == head:
            raise
        log.warning("reloading the whole store after reverting %s", sha[:10])
        ctx.reload_all()
        return str(new)


def _fallback_op(
    ctx: Any,
    sampled: list[str],
    sid: str,
    trailers: dict[str, Any],
    cfg: Any,
    why: list[str],
) -> ApplyResult:
    state = ctx.state
    mems = []
    for mid in sampled:
        where = state.locate(mid)
        if where is not None and where[0] in ("cluster", "unsorted"):
            m = state.memory(mid)
            if m is not None:
                mems.append(m)
    if not mems:
        return ApplyResult()
    plan = lexical_plan(mems, list(state.clusters.values()), cfg)
    notes = [f"SLM plan rejected: {w}" for w in why[-4:]]
    return _apply_op(
        ctx, plan, [m.id for m in mems], sid, "lexical", trailers, 0.0, 0, extra_notes=notes
    )


def _size_policy_op(ctx: Any, sid: str, trailers: dict[str, Any], cfg: Any) -> ApplyResult:
    state = ctx.state
    plan = size_policy(state, cfg.max_cluster_size, cfg.merge_similarity, cfg.min_cluster_size)
    if plan is None:
        return ApplyResult()
    sampled = list(plan.assign)
    return _apply_op(ctx, plan, sampled, sid, "size policy", trailers, 0.0, 0)


# -- the session -------------------------------------------------------------------------


def _semantic_errors(
    backend: Backend | None,
    checks: list[Check],
    prompts_dir: Path | None,
    seed: int,
    outcome: SessionOutcome,
) -> tuple[float, list[str]]:
    """Share of checked assignments judged wrong: by the SLM (yes/no) when it answers, and by
    lexical coherence (a memory sharing nothing with its cluster but much with another)."""
    if not checks:
        return 0.0, []
    verdicts: dict[str, str] = {}
    notes: list[str] = []
    if backend is not None:
        keys = [f"A{i}" for i in range(1, len(checks) + 1)]
        schema = closed_object(
            {"verdicts": closed_object({k: one_of(["yes", "no"]) for k in keys})}
        )
        lines = []
        for k, ch in zip(keys, checks):
            held = " ".join(f'"{e}"' for e in ch.examples) or "(nothing else yet)"
            lines.append(f'{k}: memory "{ch.content}"\n    cluster "{ch.cluster}". Holds: {held}')
        system = _render(load_prompt(prompts_dir, "validate.md"), answer_format=VALIDATE_FORMAT)
        msgs = [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n".join(lines) + "\nAnswer:"},
        ]
        try:
            outcome.calls += 1
            res = backend.chat_json(msgs, schema, seed=seed)
            outcome.prompt_tokens += res.prompt_tokens
            outcome.completion_tokens += res.completion_tokens
            verdicts = dict(zip([c.mid for c in checks], (res.data["verdicts"][k] for k in keys)))
        except (BackendError, KeyError, TypeError) as exc:
            notes.append(f"SLM validation unavailable ({exc}); lexical check only")
    wrong = 0
    for ch in checks:
        if verdicts.get(ch.mid) == "no" or not ch.lexical_ok:
            wrong += 1
            why = "validator said no" if verdicts.get(ch.mid) == "no" else "lexically incoherent"
            notes.append(f"{ch.mid} in {ch.cluster.split(':')[0]!r}: {why}")
    return wrong / len(checks), notes


def run_session(
    submit: Submit,
    backend: Backend | None,
    config: Config,
    prompts_dir: Path | None = None,
    trigger: str = "manual",
    access: Mapping[str, int] | None = None,
    session_id: str | None = None,
    seed: int | None = None,
) -> SessionOutcome:
    """Run one session to its end and say what happened. `backend` None means the lexical
    organizer (`none`). Raises only for errors of the store itself (the writer failing)."""
    start = time.monotonic()
    cfg = config.session
    sid = session_id or new_session_id()
    if backend is None:
        name, model = NONE_NAME, NONE_MODEL
    else:
        name, model = backend.name, backend.model
    out = SessionOutcome(sid, trigger, name, model)
    base_seed = seed if seed is not None else _backend_seed(config, name)

    def trailers(kind: str = "cluster", **extra: Any) -> dict[str, Any]:
        t = {"kind": kind, "session": sid, "trigger": trigger, "backend": name, "model": model}
        return {**t, **extra}

    def finish(status: str) -> SessionOutcome:
        out.status = status
        out.seconds = time.monotonic() - start
        log.info(
            "session %s (%s, %s/%s): %s%s",
            sid,
            trigger,
            name,
            model,
            status,
            f" - {'; '.join(out.reasons[-3:])}" if out.reasons else "",
        )
        return out

    snap: Snapshot = submit(_snapshot_op, cfg.sample_size, access).result()
    sampled = [m.id for m in snap.sample]
    out.sampled = len(sampled)
    if not sampled:
        out.reasons.append("nothing to organize")
        return finish("noop")

    accepted = False
    if backend is not None:
        template = load_prompt(prompts_dir, "organize.md")
        coarse = snap.total > cfg.coarse_threshold
        chunks = make_chunks(snap, template, cfg.chunk_size, backend.context_tokens, coarse)
        for attempt in range(2):
            out.attempts += 1
            s = base_seed + attempt * 7919
            try:
                plan = combine([_propose_chunk(backend, template, ch, s, out) for ch in chunks])
            except (BackendError, PlanError) as exc:
                out.reasons.append(f"attempt {attempt + 1}: {exc}")
                continue
            res: ApplyResult = submit(
                _apply_op,
                plan,
                sampled,
                sid,
                f"{name} attempt {attempt + 1}",
                trailers(attempt=attempt + 1, seed=s, status="applied"),
                cfg.validate_fraction,
                s,
            ).result()
            if res.problems:
                shown = "; ".join(res.problems[:4])
                out.reasons.append(f"attempt {attempt + 1}: plan rejected: {shown}")
                continue
            out.commits += [x for x in (res.sha, res.revert_sha) if x]
            if res.invariant_problems:
                shown = "; ".join(res.invariant_problems[:3])
                out.reasons.append(f"attempt {attempt + 1}: invariant failed, reverted: {shown}")
                continue
            rate, notes = _semantic_errors(backend, res.checks, prompts_dir, s, out)
            out.error_rate = rate
            if rate > cfg.max_error_rate:
                out.reasons.append(
                    f"attempt {attempt + 1}: validation error rate {rate:.0%} > "
                    f"{cfg.max_error_rate:.0%} ({'; '.join(notes[:3])})"
                )
                if res.sha:
                    try:
                        rsha = submit(
                            _revert_op,
                            res.sha,
                            f"revert: session {sid}: validation error rate {rate:.0%}",
                            trailers("revert", reason="validation", status="rolled_back"),
                        ).result()
                    except Conflict as exc:
                        # a later commit (an ingest routed into a new cluster) touched the
                        # same files: git refuses, the plan stays, the outcome says so
                        out.reasons.append(f"cannot revert {res.sha[:10]}: {exc}")
                        return finish("failed")
                    out.commits.append(rsha)
                continue
            if notes:
                out.reasons.extend(notes[:3])
            out.moved = res.moved
            accepted = True
            break
        if not accepted:
            fb_trailers = {
                **trailers(status="fallback"),
                "backend": NONE_NAME,
                "model": NONE_MODEL,
                "fallback": name,
            }
            fb = submit(_fallback_op, sampled, sid, fb_trailers, cfg, out.reasons).result()
            out.commits += [x for x in (fb.sha, fb.revert_sha) if x]
            if fb.problems or fb.invariant_problems:
                out.reasons.append(
                    "lexical fallback failed: "
                    + "; ".join((fb.problems + fb.invariant_problems)[:3])
                )
                status = "rolled_back" if out.commits else "failed"
                _record(submit, sid, trailers, status, out)
                _size_policy(submit, sid, trailers, cfg, out)
                return finish(status)
            out.moved = fb.moved
            out.reasons.append("lexical organizer applied to the sample")
            if not fb.sha:
                _record(submit, sid, trailers, "fallback", out)
            _size_policy(submit, sid, trailers, cfg, out)
            return finish("fallback")
    else:
        res = submit(_fallback_op, sampled, sid, trailers(), cfg, []).result()
        if res.problems or res.invariant_problems:
            out.commits += [x for x in (res.sha, res.revert_sha) if x]
            out.reasons.append(
                "lexical plan rejected: " + "; ".join((res.problems + res.invariant_problems)[:3])
            )
            return finish("failed")
        out.commits += [x for x in (res.sha,) if x]
        out.moved = res.moved
    _size_policy(submit, sid, trailers, cfg, out)
    return finish("accepted" if out.commits else "noop")


def _record_op(ctx: Any, subject: str, body: str, trailers: dict[str, Any]) -> str | None:
    """An empty commit that records a session's failure, so `git log` / `clagd log` show it
    even when nothing in the store changed."""
    return ctx.record(subject, body, trailers)


def _record(
    submit: Submit,
    sid: str,
    trailers: Callable[..., dict[str, Any]],
    status: str,
    out: SessionOutcome,
) -> None:
    body = "\n".join(f"- {r}" for r in out.reasons)
    subject = f"session: {sid} {status.replace('_', ' ')}: the SLM plan was not kept"
    try:
        sha = submit(_record_op, subject, body, trailers("session", status=status)).result()
    except Exception as exc:  # noqa: BLE001 - the outcome still reports the failure
        log.warning("could not record session %s in git: %s", sid, exc)
        return
    if sha:
        out.commits.append(sha)


def _size_policy(
    submit: Submit, sid: str, trailers: Callable[..., dict[str, Any]], cfg: Any, out: SessionOutcome
) -> None:
    res = submit(_size_policy_op, sid, trailers(policy="size"), cfg).result()
    out.commits += [x for x in (res.sha, res.revert_sha) if x]
    if res.problems or res.invariant_problems:
        out.reasons.append(
            "size policy skipped: " + "; ".join((res.problems + res.invariant_problems)[:2])
        )


def _backend_seed(config: Config, name: str) -> int:
    if name == "ollama":
        return int(config.backend.ollama.seed)
    if name == "llamacpp":
        return int(config.backend.llamacpp.seed)
    return 0


def engine_session_runner(backends: Any) -> Callable[..., dict[str, Any]]:
    """The `Engine.session_runner` hook: run a session on an engine with the backend the
    manager (`slm.BackendManager`) has chosen, or the one `backend` names."""

    def runner(engine: Any, trigger: str = "manual", backend: str | None = None) -> dict[str, Any]:
        chosen: Backend | None
        if backend == NONE_NAME:
            chosen = None
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
        )
        if outcome.status in ("fallback", "rolled_back", "failed") and chosen is not None:
            backends.record_failure("; ".join(outcome.reasons[-2:]))
        return outcome.to_dict()

    return runner
