"""Commit messages: written with trailers that say what kind of change each commit is
(`format_message`), and read back for `clagd log` (`read_log`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRAILER_PREFIX = "Clagd-"
_FIELD = "\x1f"
_RECORD = "\x1e"


def _printable(text: str) -> str:
    """Commit messages hold no control characters but newlines and tabs (a memory's content
    quoted in a body may have any)."""
    return "".join(c if c >= " " or c in "\n\t" else " " for c in text)


def format_message(subject: str, body: str = "", trailers: dict[str, Any] | None = None) -> str:
    subject, body = _printable(subject), _printable(body)
    parts = [subject.strip().splitlines()[0][:200] if subject.strip() else "clagd change"]
    if body.strip():
        parts.append(body.strip())
    if trailers:
        parts.append(
            "\n".join(
                f"{TRAILER_PREFIX}{k.replace('_', '-').title()}: {' '.join(str(v).split())}"
                for k, v in trailers.items()
                if v is not None and str(v) != ""
            )
        )
    return "\n\n".join(parts) + "\n"


@dataclass(frozen=True)
class CommitInfo:
    """One commit as `GitStore.log` reads it: its clagd trailers (keys lowercased, without
    the `Clagd-` prefix) and its kind (`outside` for a commit clagd did not make)."""

    commit: str
    date: str
    subject: str
    kind: str
    trailers: dict[str, str]
    parents: tuple[str, ...]


def read_log(run: Callable[..., str], n: int, rev: str) -> list[CommitInfo]:
    """The last `n` commits of `rev`, newest first. `run` runs git (`GitRunner.run`)."""
    fmt = _FIELD.join(["%H", "%aI", "%s", "%(trailers:only,unfold)", "%P"]) + _RECORD
    out = run("log", f"-n{int(n)}", f"--format={fmt}", rev)
    entries = []
    for rec in out.split(_RECORD):
        rec = rec.strip("\n")
        if not rec:
            continue
        sha, date, subject, trailer_text, parents = (rec.split(_FIELD) + [""] * 5)[:5]
        trailers = _trailers(trailer_text)
        kind = trailers.get("kind", "outside")
        entries.append(CommitInfo(sha, date, subject, kind, trailers, tuple(parents.split())))
    return entries


def _trailers(text: str) -> dict[str, str]:
    """clagd's trailers of one message, by lower-case name without the prefix."""
    trailers: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.startswith(TRAILER_PREFIX):
            trailers[k[len(TRAILER_PREFIX) :].lower()] = v.strip()
    return trailers
