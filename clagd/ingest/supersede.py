"""Facts that change: one memory superseding another, without any model.

`changed_value(old, new)` is the rule: `new` says what `old` says with other values (a
number, a name, a place, a date) in one place of the sentence, and nothing else changes:
"Alice's phone number is 0151 111" then "Alice's phone number is 0151 222". It is built
for precision (hiding a true fact is worse than missing an update) and measured on a
labelled set (`benchmarks/bench_supersede.py`). What it refuses, on purpose: a change at
the start of the sentence (another subject: "Bob's phone number is ..."), a change
followed by another value (the changed word names which thing: "the flight to Rome
leaves at 9"), added or removed words other than "now" and the like (an addition, a
negation, another attribute: "work phone"), past events ("Alice met Bob on Monday").

`link(ctx, old, new)` writes the link both ways: the newer memory's `metadata.supersedes`
names the older one, whose copy in its place (cluster, archive or unsorted shard) gets
`metadata.superseded_by`; queries leave it out unless asked (`superseded`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from difflib import SequenceMatcher

import numpy as np

from clagd.model import LINK_KEYS, SUPERSEDED_BY, SUPERSEDES, Memory, parse_epoch
from clagd.retrieval.index import Index
from clagd.retrieval.scoring import top
from clagd.store.writer import WriteContext

_TOKEN_RE = re.compile(r"\w+(?:['’.:/@+-]\w+)*")
_MONTHS_DAYS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday "
    "friday saturday sunday today tomorrow yesterday".split()
)
# words an update adds or drops around the same statement ("... is now 0151 222")
_FILLER = frozenset("now currently actually new newly recently updated".split())
# the verbs of a change, which an update may say in place of the old verb ("... changed
# to 0151 222" for "... is 0151 111")
_CHANGE_WORDS = _FILLER | frozenset("is are changed to moved became has been switched".split())
# what may stand between two changed values of one statement ("Tuesday at 4pm")
_JOINERS = frozenset("at on in and of from to the a".split())
# past events happen again; they do not replace each other ("Alice met Bob on Monday")
_EVENT_VERBS = frozenset(
    "went saw met ate bought took made got did ran flew drove came gave found told said "
    "wrote won lost visited watched played cooked tried attended heard read sang spent "
    "talked called asked walked travelled traveled finished celebrated".split()
)
_STATE_VERBS = frozenset(
    "moved changed switched relocated married renamed updated based named scheduled "
    "rescheduled located called set".split()
)
# a number after one of these numbers one of several things ("note 7", "part 2", "room 12")
_LABELS = frozenset(
    "number no nr note notes part item items step chapter round page episode version room "
    "ticket bus line entry task story session week day level floor gate seat table track "
    "issue case order invoice batch lot unit exhibit figure section act scene season".split()
)
# a verb after the change: the change was in the subject ("Flight LH 400 is on time")
_SUBJECT_END = frozenset("is are was were has have had does do will".split())
_NEGATIONS = frozenset("not no never n't don't doesn't isn't aren't won't".split())
# the candidates looked at per new memory: the older memories it scores best against
CANDIDATES = 5
# a statement of one fact is a sentence or two: longer memories are never compared (the
# word alignment is quadratic in their length, and it runs on the writer thread)
MAX_WORDS = 80


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def _is_value(tok: str, i: int, prev: str | None) -> bool:
    """A number, a date, a name or a place: digits, a month or weekday, an address, or
    a capitalized word that does not start a sentence."""
    low = tok.lower()
    if any(ch.isdigit() for ch in tok) or "@" in tok or low in _MONTHS_DAYS:
        return True
    sentence_start = i == 0 or (prev is not None and prev.endswith((".", "!", "?")))
    return tok[:1].isupper() and not sentence_start


def _values(toks: list[str]) -> list[bool]:
    return [_is_value(t, i, toks[i - 1] if i else None) for i, t in enumerate(toks)]


@dataclass(frozen=True)
class _Side:
    toks: list[str]
    low: list[str]
    val: list[bool]

    @classmethod
    def of(cls, text: str) -> _Side:
        toks = _tokens(text)
        return cls(toks, [t.lower() for t in toks], _values(toks))


def _event(side: _Side, upto: int) -> bool:
    """A past event verb before the change: an event, not a state."""
    for w in side.low[:upto]:
        if w in _STATE_VERBS:
            continue
        if w in _EVENT_VERBS or (w.endswith("ed") and len(w) > 4):
            return True
    return False


def changed_value(old: str, new: str) -> bool:
    """Whether `new` restates `old` with other values in one place (see the module)."""
    a, b = _Side.of(old), _Side.of(new)
    if a.low == b.low or min(len(a.low), len(b.low)) < 3:
        return False
    if max(len(a.low), len(b.low)) > MAX_WORDS:
        return False
    if _NEGATIONS.intersection(a.low) != _NEGATIONS.intersection(b.low):
        return False
    ops = SequenceMatcher(None, a.low, b.low, autojunk=False).get_opcodes()
    # words only added or dropped must be fillers ("now"); what is left is the change
    changes: list[tuple[str, int, int, int, int]] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        words = a.low[i1:i2] + b.low[j1:j2]
        if all(w in (_CHANGE_WORDS if tag == "replace" else _FILLER) for w in words):
            continue
        changes.append((tag, i1, i2, j1, j2))
    if not changes:
        return False
    first_a, first_b = changes[0][1], changes[0][3]
    last_a, last_b = changes[-1][2], changes[-1][4]
    # the same subject and frame before the change: two words at least, no change there
    if first_a < 2 or first_b < 2 or _frame(a.low[:first_a]) != _frame(b.low[:first_b]):
        return False
    if _event(a, first_a):
        return False
    # a numbered thing ("note 7" then "note 8") or a change in the subject: several things
    v0 = next((i for i in range(first_a, last_a) if a.val[i]), first_a)
    if a.low[v0 - 1] in _LABELS or _SUBJECT_END.intersection(a.low[last_a:]):
        return False
    equal = sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag == "equal")
    if equal < 0.5 * max(len(_frame(a.low)), len(_frame(b.low))):
        return False
    # nothing after the change names a value (past the rest of a changed name: "Station
    # Road"): the changed word would say which thing
    if _value_after(a, last_a) or _value_after(b, last_b):
        return False
    return _one_place(a, b, changes)


def _frame(words: list[str]) -> list[str]:
    """The words before a change, without the verbs of a change ("is now", "changed to")."""
    return [w for w in words if w not in _CHANGE_WORDS]


def _value_after(side: _Side, end: int) -> bool:
    """A value after position `end`, past the run of values that continues the change."""
    i = end
    while i < len(side.val) and side.val[i]:
        i += 1
    return any(side.val[i:])


def _one_place(a: _Side, b: _Side, changes: list[tuple[str, int, int, int, int]]) -> bool:
    """Each changed stretch swaps values for values (a short connector may change with
    them), and the stretches are one place: only joiners between them."""
    for (_, _, i2, _, _), (_, n1, _, _, _) in zip(changes, changes[1:]):
        if not all(w in _JOINERS for w in a.low[i2:n1]):
            return False
    span_a = range(changes[0][1], changes[-1][2])
    span_b = range(changes[0][3], changes[-1][4])
    va = {a.low[i] for i in span_a if a.val[i]}
    vb = {b.low[j] for j in span_b if b.val[j]}
    if not va or not vb or va == vb:
        return False
    for tag, i1, i2, j1, j2 in changes:
        words_a = [w for w, v in zip(a.low[i1:i2], a.val[i1:i2]) if not (v or w in _CHANGE_WORDS)]
        words_b = [w for w, v in zip(b.low[j1:j2], b.val[j1:j2]) if not (v or w in _CHANGE_WORDS)]
        if len(words_a) + len(words_b) > 2:
            return False
        if tag == "replace" and not (any(a.val[i1:i2]) and any(b.val[j1:j2])):
            return False
        if tag != "replace" and (words_a or words_b):
            return False
    return True


def _scope(m: Memory) -> str:
    return str(getattr(m, "scope", "default"))


def newer_first(a: Memory, b: Memory) -> tuple[Memory, Memory]:
    """(newer, older) by `created_at`; on a tie (or an unknown time) `a`, the arrival."""
    ta, tb = parse_epoch(a.created_at), parse_epoch(b.created_at)
    if ta is not None and tb is not None and tb > ta:
        return b, a
    return a, b


def find(index: Index, fresh: Iterable[Memory]) -> dict[str, Memory]:
    """For each new memory that restates an older one with changed values: new id -> the
    older memory (live, not superseded, same scope), among the `CANDIDATES` it scores best
    against, and among the new ones before it in the batch."""
    out: dict[str, Memory] = {}
    seen: list[Memory] = []
    m = index.memories
    taken: set[str] = set()
    for new in fresh:
        if len(_tokens(new.content)) > MAX_WORDS:
            continue  # not one fact: never superseding, nor superseded within the batch
        q = index.term_ids(new.content)
        olds: list[Memory] = []
        if q and m.n_alive:
            s = index.memory_bm25.scores(q)
            if index.any_hidden:
                s[m.hid] = 0.0
            # among the memories that match at all (a few hundred of 100k: `top`'s partition
            # of every slot cost 9 ms an `add` at 100k memories); ties stay by slot
            hit = np.flatnonzero(s > 0)
            olds = [m.mems[int(i)] for i in hit[top(s[hit], CANDIDATES)].tolist()]
        olds += seen
        for old in olds:
            if old.id in taken or old.id == new.id or _scope(old) != _scope(new):
                continue
            if changed_value(old.content, new.content):
                out[new.id] = old
                taken.add(old.id)
                break
        seen.append(new)
    return out


def link(ctx: WriteContext, old_id: str, new_id: str) -> bool:
    """Mark the stored memory `old_id` superseded by `new_id` where it lives (a changed
    copy: snapshots hold the stored object). False when it is not in the store (the
    caller gives the new memory its `supersedes` itself)."""
    state = ctx.state
    for area, clusters in (("cluster", state.clusters), ("archive", state.archived)):
        for c in clusters.values():
            for i, m in enumerate(c.memories):
                if m.id == old_id:
                    (ctx.touch_cluster if area == "cluster" else ctx.touch_archive)(c.id)
                    c.memories[i] = with_meta(m, SUPERSEDED_BY, new_id)
                    return True
    for name, mems in state.unsorted.items():
        for i, m in enumerate(mems):
            if m.id == old_id:
                ctx.touch_shard(name)
                mems[i] = with_meta(m, SUPERSEDED_BY, new_id)
                return True
    return False


def with_meta(m: Memory, key: str, value: str) -> Memory:
    """A copy of `m` (every field kept) with `metadata[key] = value`."""
    return replace(m, metadata={**m.metadata, key: value})


def successor(new: Memory, old_id: str) -> Memory:
    """`new` naming the memory it supersedes."""
    return with_meta(new, SUPERSEDES, old_id)


def release(ctx: WriteContext, gone: set[str]) -> int:
    """Drop every link to a memory in `gone` (forgotten): the memory it superseded is
    current again, the one that superseded it names nothing. Returns how many changed."""
    state, n = ctx.state, 0
    areas = (("cluster", state.clusters), ("archive", state.archived))
    for area, clusters in areas:
        for c in clusters.values():
            for i, m in enumerate(c.memories):
                if _links_to(m, gone):
                    (ctx.touch_cluster if area == "cluster" else ctx.touch_archive)(c.id)
                    c.memories[i], n = _unlinked(m, gone), n + 1
    for name, mems in state.unsorted.items():
        for i, m in enumerate(mems):
            if _links_to(m, gone):
                ctx.touch_shard(name)
                mems[i], n = _unlinked(m, gone), n + 1
    return n


def _links_to(m: Memory, gone: set[str]) -> bool:
    return bool(m.metadata) and any(_str(m.metadata.get(k)) in gone for k in LINK_KEYS)


def _unlinked(m: Memory, gone: set[str]) -> Memory:
    meta = {k: v for k, v in m.metadata.items() if not (k in LINK_KEYS and _str(v) in gone)}
    return replace(m, metadata=meta)


def _str(v: object) -> str:
    return v if isinstance(v, str) else ""
