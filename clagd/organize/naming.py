"""Cluster profiles written by a model: names, one-sentence descriptions and tags.

When the competence gate allows a model to `name` but not to `organize`, a session takes
the lexical organizer's grouping and asks the model only for the profiles (CLAG's cluster
profiles, which stage-1 cluster retrieval matches) of the clusters the plan creates or
changes. The calls are batched (`BATCH` clusters per call, one closed schema that names
each `G<i>`), each bounded by a timeout, all of them by a deadline; whatever the model did
not name in time, or named badly (a name outside 2-5 words, one already taken, words copied
from the prompt), keeps the lexical organizer's profile, and the run says why
(`NamingRun.rejected`). The gate's `name` task measures exactly this call.

The prompt shows the answer's shape without a value to copy: its earlier version showed
`"name": "two to five words"`, and Qwen2.5-Coder-1.5B wrote exactly that for every group
of most calls (LoCoMo conversation 1: 9 of 52 clusters named, the rest dropped as taken).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clagd.errors import BackendError
from clagd.model import Memory
from clagd.organize.plan import (
    DESCRIPTION_MAX_CHARS,
    MAX_TAGS,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    TAG_MAX_CHARS,
)
from clagd.organize.plan_checks import name_problem
from clagd.organize.prompts import Messages, clip
from clagd.scopes import DEFAULT_SCOPE
from clagd.slm.base import Backend
from clagd.slm.schema import Schema, array, closed_object, string

BATCH = 4  # clusters per naming call
SHOWN = 6  # memories shown per cluster (the most recent)
SHOWN_CHARS = 160
NAMING_PROMPT = (
    "You write short profiles for groups of memories of an AI assistant. A profile is what "
    "a later search matches, so it says what the memories are about and what they will be "
    "used for, in plain words a user would type.\n"
    "For every group give, in your own words: a name of two to five words that fits this "
    'group and no other (specific: people, places, things; not "user notes"), a '
    "one-sentence description, and up to 5 one-word tags.\n"
    'Answer with JSON only, one entry per group: {"groups": {"G1": {"name": ..., '
    '"description": ..., "tags": [...]}, ...}}'
)
# part of the gate's cache key: a verdict measured with another naming prompt is measured again
PROMPT_HASH = hashlib.sha256(NAMING_PROMPT.encode()).hexdigest()[:12]
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> str:
    """`text`'s words, casefolded, one space around each (for whole-word containment)."""
    return " " + " ".join(_WORD.findall(text.casefold())) + " "


_PROMPT_WORDS = _words(NAMING_PROMPT)


def copies_prompt(text: str) -> bool:
    """Whether `text` is only words of the naming prompt, in its order ("two to five
    words", "user notes"): what a model writes when it copies the instructions."""
    words = _words(text)
    return words.strip() != "" and words in _PROMPT_WORDS


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    tags: tuple[str, ...] = ()


@dataclass
class NamingRun:
    """What the naming calls gave: a profile per group key, and what they cost."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    asked: int = 0  # groups sent to the model
    calls: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)  # failed calls, the deadline
    # group key -> why the model's answer for it was not used (the first ones are reported)
    rejected: dict[str, str] = field(default_factory=dict)

    def reject(self, key: str, why: str) -> None:
        """The model's profile for `key` is not used, for this reason."""
        self.profiles.pop(key, None)
        self.rejected[key] = why

    @property
    def per_cluster(self) -> float:
        return self.seconds / self.asked if self.asked else 0.0

    def note(self, backend: Backend) -> str:
        rejected = f", {len(self.rejected)} answers rejected" if self.rejected else ""
        return (
            f"{backend.name} {backend.model} named {len(self.profiles)} of {self.asked} "
            f"clusters in {self.calls} calls{rejected}, {self.seconds:.1f} s "
            f"({self.per_cluster:.1f} s per cluster)"
        )

    def reasons(self, most: int = 3) -> list[str]:
        """Why groups kept their lexical profile: the first failed calls and rejections."""
        out = [f"naming: {e}" for e in self.errors[:most]]
        return out + [f"naming rejected: {w}" for w in list(self.rejected.values())[:most]]


def naming_schema(keys: Sequence[str]) -> Schema:
    profile = closed_object(
        {
            "name": string(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS),
            "description": string(max_length=DESCRIPTION_MAX_CHARS),
            "tags": array(string(min_length=1, max_length=TAG_MAX_CHARS), MAX_TAGS),
        }
    )
    return closed_object({"groups": closed_object({k: profile for k in keys})})


def naming_messages(groups: Sequence[tuple[str, Sequence[Memory]]]) -> Messages:
    lines = []
    for key, mems in groups:
        recent = sorted(mems, key=lambda m: m.created_at)[-SHOWN:]
        lines.append(f"{key} ({len(mems)} memories):")
        lines += [f"- {clip(m.content, SHOWN_CHARS)}" for m in recent]
    user = "\n".join(lines) + "\nAnswer:"
    return [{"role": "system", "content": NAMING_PROMPT}, {"role": "user", "content": user}]


def _profile(raw: object, taken: set[str]) -> Profile | str:
    """A model's profile if it is usable (a 2-5 word name nobody else has, in the model's
    own words), else why not."""
    if not isinstance(raw, dict):
        return "no profile in the answer"
    name = _SPACE.sub(" ", str(raw.get("name", ""))).strip()
    desc = _SPACE.sub(" ", str(raw.get("description", ""))).strip()[:DESCRIPTION_MAX_CHARS]
    if problem := name_problem(name):
        return problem
    for what, text in (("name", name), ("description", desc)):
        if copies_prompt(text):
            return f"{what} {text!r} copies the prompt"
    if name.casefold() in taken:
        return f"name {name!r} is taken by another cluster"
    tags = raw.get("tags") if isinstance(raw.get("tags"), list) else []
    clean = [str(t).strip()[:TAG_MAX_CHARS] for t in tags or [] if str(t).strip()]
    return Profile(name, desc, tuple(dict.fromkeys(clean))[:MAX_TAGS])


def read_profiles(
    data: object, keys: Sequence[str], taken: set[str]
) -> tuple[dict[str, Profile], dict[str, str]]:
    """The usable profiles of a naming answer by key, and why each other key's is not;
    `taken` (casefolded names) grows by the names used."""
    answered = data.get("groups") if isinstance(data, dict) else None
    out: dict[str, Profile] = {}
    rejected: dict[str, str] = {}
    for k in keys:
        got = _profile((answered or {}).get(k) if isinstance(answered, dict) else None, taken)
        if isinstance(got, str):
            rejected[k] = got
        else:
            out[k] = got
            taken.add(got.name.casefold())
    return out, rejected


def _scope_of(group: tuple[str, Sequence[Memory]]) -> str:
    return group[1][0].scope if group[1] else DEFAULT_SCOPE


def _batches(
    groups: Sequence[tuple[str, Sequence[Memory]]], batch: int
) -> list[Sequence[tuple[str, Sequence[Memory]]]]:
    """`groups` in calls of at most `batch`, each of one scope's groups only (in their
    order, scope by scope): a call shows the model one user's memories, so no word of
    another scope's can reach a name it writes."""
    by_scope: dict[str, list[tuple[str, Sequence[Memory]]]] = {}
    for g in groups:
        by_scope.setdefault(_scope_of(g), []).append(g)
    size = max(1, batch)
    return [ones[i : i + size] for ones in by_scope.values() for i in range(0, len(ones), size)]


def name_groups(
    backend: Backend,
    groups: Sequence[tuple[str, Sequence[Memory]]],
    taken: Mapping[str, set[str]] | None = None,
    timeout: float | None = None,
    deadline: float | None = None,
    seed: int = 42,
    batch: int = BATCH,
) -> NamingRun:
    """Profiles for `groups` ((key, memories) each), `batch` groups of one scope per call.
    `taken`: per scope, the casefolded names its other clusters keep (a model's name equal
    to one is not used; names are unique within a scope). `deadline` (time.monotonic())
    stops asking; the groups left keep no model profile."""
    run = NamingRun()
    used = {scope: set(names) for scope, names in (taken or {}).items()}
    start = time.monotonic()
    parts = _batches(groups, batch)
    for i, part in enumerate(parts):
        if deadline is not None and time.monotonic() >= deadline:
            unasked = sum(len(p) for p in parts[i:])
            run.errors.append(f"naming deadline reached; {unasked} groups not asked")
            break
        keys = [f"G{j}" for j in range(1, len(part) + 1)]
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        call_timeout = (
            min(x for x in (timeout, left) if x is not None) if (timeout or left) else None
        )
        msgs = naming_messages([(k, mems) for k, (_key, mems) in zip(keys, part)])
        run.asked += len(part)
        run.calls += 1
        try:
            res = backend.chat_json(msgs, naming_schema(keys), seed=seed, timeout=call_timeout)
        except BackendError as exc:
            run.prompt_tokens += exc.prompt_tokens
            run.completion_tokens += exc.completion_tokens
            run.errors.append(str(exc)[:200])
            continue
        run.prompt_tokens += res.prompt_tokens
        run.completion_tokens += res.completion_tokens
        got, why = read_profiles(res.data, keys, used.setdefault(_scope_of(part[0]), set()))
        for k, (key, _mems) in zip(keys, part):
            if k in got:
                run.profiles[key] = got[k]
            elif k in why:
                run.reject(key, why[k])
    run.seconds = time.monotonic() - start
    return run
