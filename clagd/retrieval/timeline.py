"""The store's memories in time order, wherever they are filed: the time neighbours.

In a conversation the reply to a matching turn is often the answer, and shares no word with
the question; so a memory is lifted by the BM25 of the memories just before and after it.
Those used to be its neighbours inside its cluster. But the organizer cuts an episode into
clusters of about a dozen turns, and ingest routing files single turns into older clusters
by topic, so the turn just before the answer often sits in another cluster, and the
neighbour inside the cluster is from another day. A `Timeline` links each memory to the
memories just before and after it in time (ties by id), when they are no further apart than
a gap, whatever cluster, archive shard or unsorted area holds them (docs/retrieval.md,
"Time neighbours").

Like an index snapshot a timeline is immutable: `updated` returns a new one. The order
changes only when memories come or go (a session that moves memories between clusters
keeps every slot), so an update is a merge of the few new slots into the kept order: a
binary search per new memory plus one copy of the arrays, never a sort of the store.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_NO_LINKS = np.zeros(0, dtype=np.int32)


# hex digit -> its value (255: not a hex digit), for the ids' bytes
_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i


def id_keys(ids: Sequence[str]) -> np.ndarray:
    """The tie-break key of each memory id, as uint64: a memory id is "m-" and 16 hex digits
    (`model.memory_id`), so its number sorts like the id itself; decoded in one numpy pass
    (100k ids in a few ms). Any other id (hand-built in a test or a tool) is keyed by its
    first 8 bytes."""
    n = len(ids)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    joined = "".join(ids)
    if len(joined) == 18 * n and joined.isascii():
        raw = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).reshape(n, 18)
        nib = _HEX[raw[:, 2:]]
        if (raw[:, 0] == ord("m")).all() and (raw[:, 1] == ord("-")).all() and (nib < 16).all():
            octets = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2])
            return octets.view(">u8").reshape(n).astype(np.uint64)
    return np.asarray([_key(i) for i in ids], dtype=np.uint64)


def _key(mid: str) -> int:
    if len(mid) == 18 and mid.startswith("m-"):
        try:
            return int(mid[2:], 16)
        except ValueError:
            pass
    return int.from_bytes(mid.encode("utf-8")[:8].ljust(8, b"\0"), "big")


class Timeline:
    """Live memory slots in (created_at, id) order, and each slot's time neighbours.

    `prev[slot]` / `next[slot]`: the slot just before / after in time, -1 when there is
    none within `gap` seconds. A memory of unknown time has no time neighbours."""

    __slots__ = ("gap", "order", "ts", "key", "prev", "next")

    def __init__(self, gap_seconds: float) -> None:
        self.gap = float(gap_seconds)
        self.order = np.zeros(0, dtype=np.int64)  # live slots, in time order
        self.ts = np.zeros(0, dtype=np.float64)  # their times (-inf: unknown)
        self.key = np.zeros(0, dtype=np.uint64)  # their id keys (ties)
        self.prev = _NO_LINKS
        self.next = _NO_LINKS

    def updated(
        self, alive: np.ndarray, ts: np.ndarray, base: int, new_ids: Sequence[str]
    ) -> Timeline:
        """The timeline of a new snapshot: `alive` and `ts` over all its slots, slots from
        `base` on are new (`new_ids[i]` is the id of slot `base + i`); every slot this
        timeline orders is below `base`."""
        fresh = np.flatnonzero(alive[base:]) + base
        order, tk, ik = self.order, self.ts, self.key
        removed = np.count_nonzero(alive[:base]) != len(order)
        if removed:
            keep = alive[order]
            order, tk, ik = order[keep], tk[keep], ik[keep]
        elif not len(fresh) and len(self.prev) == len(alive):
            return self  # the same memories (a session moved them between clusters)
        at = np.zeros(0, dtype=np.int64)  # where the fresh slots landed in the order
        if len(fresh):
            keys = id_keys(new_ids)[fresh - base]
            order, tk, ik, at = _merge(order, tk, ik, fresh, ts[fresh], keys)
        out = self._copy(order, tk, ik)
        if removed or not len(self.order):
            out._link(len(alive))
        else:  # only additions: relink around them, keep every other link
            out._relink(self, at, len(alive))
        return out

    def _copy(self, order: np.ndarray, tk: np.ndarray, ik: np.ndarray) -> Timeline:
        out = Timeline(self.gap)
        out.order, out.ts, out.key = order, tk, ik
        return out

    def _relink(self, old: Timeline, at: np.ndarray, n: int) -> None:
        """The links after additions only: the old ones (copied, the new slots unlinked),
        then recomputed at the new slots' positions and beside them."""
        pad = np.full(n - len(old.prev), -1, dtype=np.int32)
        prev = np.concatenate((old.prev, pad))
        nxt = np.concatenate((old.next, pad))
        last = len(self.order) - 1
        near = np.unique(np.clip(np.concatenate((at - 1, at, at + 1)), 0, last))
        slots = self.order[near]
        with np.errstate(invalid="ignore"):  # -inf - -inf: unknown times never link
            before = (near > 0) & (self.ts[near] - self.ts[np.maximum(near - 1, 0)] <= self.gap)
            after = (near < last) & (
                self.ts[np.minimum(near + 1, last)] - self.ts[near] <= self.gap
            )
        prev[slots] = np.where(before, self.order[np.maximum(near - 1, 0)], -1)
        nxt[slots] = np.where(after, self.order[np.minimum(near + 1, last)], -1)
        self.prev, self.next = prev, nxt

    def _link(self, n: int) -> None:
        prev = np.full(n, -1, dtype=np.int32)
        nxt = np.full(n, -1, dtype=np.int32)
        if len(self.order) > 1:
            with np.errstate(invalid="ignore"):  # -inf - -inf: unknown times never link
                ok = np.diff(self.ts) <= self.gap
            a, b = self.order[:-1][ok], self.order[1:][ok]
            nxt[a] = b
            prev[b] = a
        self.prev, self.next = prev, nxt


def _merge(
    order: np.ndarray,
    tk: np.ndarray,
    ik: np.ndarray,
    fresh: np.ndarray,
    nts: np.ndarray,
    nk: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`fresh` slots (times `nts`, id keys `nk`) merged into the (time, id key) order: each
    one's place by binary search on the time, then on the key among equal times; also the
    positions where they landed."""
    nts = np.where(np.isnan(nts), -np.inf, nts)
    o = np.argsort(nts, kind="stable")
    by_time = nts[o]
    if not np.all(by_time[1:] > by_time[:-1]):  # equal times: by id key too
        o = np.lexsort((nk, nts))
    fresh, nts, nk = fresh[o], nts[o], nk[o]
    if not len(order):  # a whole store (a build, a compaction): nothing to merge into
        return fresh, nts, nk, np.arange(len(fresh))
    pos = np.searchsorted(tk, nts, side="left")
    if np.any(np.searchsorted(tk, nts, side="right") > pos):
        # equal times: by id key too, in one search over (time, key) pairs (a burst often
        # shares one second; a search per memory held the GIL ~12 ms for 500 of them)
        pos = np.searchsorted(_pairs(tk, ik), _pairs(nts, nk))
    return (
        np.insert(order, pos, fresh),
        np.insert(tk, pos, nts),
        np.insert(ik, pos, nk),
        pos + np.arange(len(pos)),  # each one lands after the fresh slots before it
    )


_PAIR = np.dtype([("t", "<f8"), ("k", "<u8")])


def _pairs(ts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(time, id key) records: numpy orders and searches them field by field."""
    out = np.empty(len(ts), dtype=_PAIR)
    out["t"], out["k"] = ts, keys
    return out
