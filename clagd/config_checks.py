"""Range and choice checks of every configuration value, one function per section.

`_fill` in config.py checks that each key exists and has the right type; these check that
the value makes sense (a `max_clients: 0` would make every request `busy`, `k1: .nan` every
query empty). Each error names the key and the file, and `clagd run` exits with status 78.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from clagd.errors import ConfigError

_REF_RE = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._/-]+(?<![./])$")
# a git remote: a configured remote's name, or a URL or path (scp-like `host:path` too)
_REMOTE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def valid_remote(remote: str) -> bool:
    """A remote name (`origin`) or a URL or path (`ssh://...`, `host:path`, `/srv/x.git`,
    `./x`); never something git would take for an option (a leading `-`), nor one with
    white space or control characters."""
    if not remote or remote.startswith("-") or any(c.isspace() or ord(c) < 32 for c in remote):
        return False
    return bool(_REMOTE_NAME_RE.match(remote)) or "/" in remote or ":" in remote


class _Checker:
    def __init__(self, section: Any, prefix: str, source: str) -> None:
        self.s, self.prefix, self.source = section, prefix, source

    def fail(self, key: str, what: str) -> None:
        value = getattr(self.s, key)
        raise ConfigError(f"{self.source}: '{self.prefix}.{key}' must be {what}, got {value!r}")

    def at_least(self, low: float, *keys: str) -> None:
        for k in keys:
            if getattr(self.s, k) < low:
                self.fail(k, f">= {low:g}")

    def above(self, low: float, *keys: str) -> None:
        for k in keys:
            if getattr(self.s, k) <= low:
                self.fail(k, f"> {low:g}")

    def within(self, low: float, high: float, *keys: str) -> None:
        for k in keys:
            if not low <= getattr(self.s, k) <= high:
                self.fail(k, f"from {low:g} to {high:g}")

    def one_of(self, key: str, choices: tuple[str, ...]) -> None:
        if getattr(self.s, key) not in choices:
            self.fail(key, "one of " + ", ".join(choices))


def _finite(obj: Any, prefix: str, source: str) -> None:
    """No NaN or infinity anywhere: every comparison with NaN is false."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value):
            _finite(value, path, source)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: '{path}' must be a finite number, got {value!r}")


def check_backend(c: _Checker) -> None:
    c.at_least(0, "recheck_seconds")
    o = _Checker(c.s.ollama, c.prefix + ".ollama", c.source)
    o.within(0, 2, "temperature")
    o.at_least(256, "num_ctx")
    o.above(0, "timeout")
    lc = _Checker(c.s.llamacpp, c.prefix + ".llamacpp", c.source)
    lc.within(0, 2, "temperature")
    lc.at_least(256, "n_ctx")
    lc.at_least(1, "n_threads", "max_tokens")
    lc.above(0, "timeout")
    g = _Checker(c.s.gate, c.prefix + ".gate", c.source)
    g.at_least(0, "margin")
    g.above(0, "timeout", "total_seconds")
    from clagd.config import GATE_TASKS, gate_tasks

    named = [t.strip() for t in str(c.s.gate.tasks).split(",") if t.strip()]
    wrong = [t for t in named if t not in GATE_TASKS]
    if wrong or not gate_tasks(c.s.gate.tasks):
        listed = ", ".join(GATE_TASKS)
        g.fail("tasks", f"a comma-separated list of {listed} (got {c.s.gate.tasks!r})")


def check_session(c: _Checker) -> None:
    c.at_least(1, "memory_add_threshold", "dialogue_round_threshold", "sample_size")
    c.at_least(1, "chunk_size", "min_cluster_size", "coarse_threshold", "target_cluster_size")
    c.at_least(0, "interval_minutes")
    c.within(0, 1, "validate_fraction", "max_error_rate", "merge_similarity")
    c.above(0, "episode_gap_minutes", "naming_timeout", "naming_seconds")
    if c.s.max_cluster_size < c.s.min_cluster_size:
        c.fail("max_cluster_size", f">= session.min_cluster_size ({c.s.min_cluster_size})")


def check_retrieval(c: _Checker) -> None:
    c.within(1, 100, "max_memories")
    c.at_least(0, "token_budget", "cluster_weight", "neighbor_weight", "freshness_weight")
    c.at_least(0, "neighbor_gap_minutes", "second_neighbor_weight")
    c.one_of("neighbors", ("time", "cluster"))
    c.at_least(0, "confidence_weight", "superseded_penalty")
    c.at_least(1, "top_clusters", "slm_refine_candidates")
    c.above(0, "k1", "freshness_half_life_days", "slm_refine_timeout")
    c.within(0, 1, "b", "min_relative_score", "min_term_rarity", "recency_tie")
    c.one_of("idf", ("lucene", "okapi"))


def check_archive(c: _Checker) -> None:
    c.at_least(0, "cold_after_days", "min_size", "interval_hours")


def check_inbox(c: _Checker) -> None:
    c.at_least(1, "max_file_bytes", "max_items_per_file", "max_batch")
    c.at_least(0, "debounce_seconds", "settle_seconds")
    c.within(0.1, 86400, "rescan_seconds")  # 0 would spin a core on an idle daemon
    c.one_of("observer", ("auto", "inotify", "polling"))
    c.above(0, "open_max_seconds")


def check_ingest(c: _Checker) -> None:
    c.at_least(0, "route_min_score", "route_margin", "route_inline_max", "route_delay_seconds")


def check_server(c: _Checker) -> None:
    c.at_least(64, "max_request_bytes")
    c.above(0, "read_timeout")
    c.at_least(1, "max_clients")
    c.within(0, 16, "query_processes")
    c.within(0, 19, "background_nice")


def check_replication(c: _Checker) -> None:
    c.above(0, "retry_seconds")
    if c.s.remote and not valid_remote(c.s.remote):
        c.fail("remote", "a git remote name or a URL or path (not starting with '-')")
    c.within(0.1, 86400, "follow_seconds")
    if c.s.branch and not _REF_RE.match(c.s.branch):
        c.fail("branch", "a valid git branch name")


def check_git(c: _Checker) -> None:
    c.at_least(0, "gc_interval_minutes")
    if c.s.branch and not _REF_RE.match(c.s.branch):
        c.fail("branch", "a valid git branch name")


SECTIONS: dict[str, Callable[[_Checker], None]] = {
    "backend": check_backend,
    "session": check_session,
    "retrieval": check_retrieval,
    "archive": check_archive,
    "inbox": check_inbox,
    "ingest": check_ingest,
    "server": check_server,
    "replication": check_replication,
    "git": check_git,
}


def check_config(cfg: Any, source: str) -> None:
    """Raise ConfigError for the first value out of range or not among its choices."""
    _finite(cfg, "", source)
    for name, check in SECTIONS.items():
        section = getattr(cfg, name, None)
        if section is not None:
            check(_Checker(section, name, source))
