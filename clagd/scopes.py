"""Scopes: which user, agent or run a memory belongs to (mem0's `user_id`, LangGraph's
namespaces). Every memory has one; a store written before scopes holds only the default.

A scope name is `[a-z0-9][a-z0-9_-]{0,62}`: it goes into YAML, commit trailers, log lines
and inbox folder names, so nothing in it needs quoting or escaping. The default scope is
never written into a file (an existing store reads unchanged); any other scope is a `scope:`
key on the memory and on its cluster, and a cluster holds memories of one scope only."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from clagd.errors import BadScope

DEFAULT_SCOPE = "default"
SCOPE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
SCOPE_RULE = (
    "a scope is 1-63 lowercase letters, digits, '_' or '-', starting with a letter or digit"
)


def check_scope(name: object) -> str:
    """`name` if it is a valid scope name, else BadScope naming what was given. None and ""
    are not scopes here: a caller that allows "not given" turns it into DEFAULT_SCOPE first
    (`scope_or_default`)."""
    if not isinstance(name, str) or not SCOPE_RE.fullmatch(name):
        shown = repr(name)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise BadScope(f"invalid scope {shown}: {SCOPE_RULE}")
    return name


def scope_or_default(name: object) -> str:
    """A scope given where one is optional: None or "" is DEFAULT_SCOPE; else `check_scope`."""
    if name is None or name == "":
        return DEFAULT_SCOPE
    return check_scope(name)


def check_scopes(names: Iterable[object] | None) -> tuple[str, ...]:
    """A query's extra scopes (`scopes`), each checked, in order, without repeats."""
    out: list[str] = []
    for n in names or ():
        s = check_scope(n)
        if s not in out:
            out.append(s)
    return tuple(out)


def visible_scopes(scope: object = None, extra: Iterable[object] | None = None) -> frozenset[str]:
    """What a query sees: its scope (default when not given) and the scopes it names."""
    return frozenset((scope_or_default(scope), *check_scopes(extra)))


def scopes_trailer(scopes: Iterable[str]) -> dict[str, str]:
    """The commit trailer (`Clagd-Scopes: alice,bob`) naming the scopes whose memories a
    commit changes: left out when they are the default's alone (every commit before
    scopes, and every commit of a store that uses none), so `log --scope` reads a commit
    without it as the default scope's."""
    names = sorted(set(scopes))
    if not names or names == [DEFAULT_SCOPE]:
        return {}
    return {"scopes": ",".join(names)}


def trailer_scopes(trailers: Mapping[str, str]) -> frozenset[str]:
    """The scopes a commit's trailers name (`scopes_trailer`): the default without one."""
    text = trailers.get("scopes", "")
    names = {n for n in (p.strip() for p in text.split(",")) if SCOPE_RE.fullmatch(n)}
    return frozenset(names or {DEFAULT_SCOPE})
