"""A competent stand-in model for the loopback servers: it answers from a reference grouping.

It reads the memories out of the prompt (the `M1: text` / `R1: text` / `A1: memory "text"`
lines clagd writes), looks each one up in the reference (memory text -> group name) and
answers what a good model would: sound plans that group by the reference and name the
groups by their reference names, routes to the right cluster, honest yes/no verdicts. The
gate set's own labels are part of the reference, so this stand-in passes the competence gate
the way a good 1.5B+ model should, and its session plans are accepted end to end.

    fake.default = Competent({"User is always cold": "home comfort", ...})
"""

from __future__ import annotations

import re
from typing import Any

from clagd.organize.gate import NEW, load_gate_set

_DATE = re.compile(r" \(\d{4}-\d{2}-\d{2}\)$")
_CLUSTER = re.compile(r'^C(\d+) "([^"]+)"')


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def gate_reference() -> dict[str, str]:
    ref: dict[str, str] = {}
    scenes, _h = load_gate_set()
    for s in scenes:
        for c in s.clusters:
            for m in c.memories:
                ref[_key(m.content)] = c.name
        for text, cluster in s.probes:
            if cluster != NEW:
                ref[_key(text)] = cluster
        for text, g in s.plan:
            ref[_key(text)] = s.groups[g]
    return ref


def gate_descriptions() -> dict[str, str]:
    scenes, _h = load_gate_set()
    return {s.groups[g]: d for s in scenes for g, d in s.descriptions.items()}


class Competent:
    def __init__(self, reference: dict[str, str] | None = None) -> None:
        self.reference = gate_reference()
        self.reference.update({_key(k): v for k, v in (reference or {}).items()})
        self.descriptions = gate_descriptions()
        self.calls = 0

    def group(self, text: str) -> str | None:
        return self.reference.get(_key(_DATE.sub("", text)))

    def __call__(self, req: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        fmt = req.get("format") or {}
        props = fmt.get("properties", {}) if isinstance(fmt, dict) else {}
        user = req["messages"][-1]["content"]
        if "assign" in props:
            return {"content": self.plan(props, user)}
        if "routes" in props:
            return {"content": self.routes(props, user)}
        if "verdicts" in props:
            return {"content": self.verdicts(props, user)}
        if "groups" in props:
            return {"content": self.profiles(props, user)}
        return {"content": {}}

    def _clusters(self, user: str) -> dict[str, str]:
        out = {}
        for line in user.splitlines():
            m = _CLUSTER.match(line)
            if m:
                out[m.group(2).casefold()] = f"C{m.group(1)}"
        return out

    def plan(self, props: dict[str, Any], user: str) -> dict[str, Any]:
        mems = {}
        for line in user.splitlines():
            m = re.match(r"^(M\d+): (.*)$", line)
            if m:
                mems[m.group(1)] = self.group(m.group(2)) or "other user notes"
        existing = self._clusters(user)
        new_ids = [t for t in props["clusters"]["items"]["properties"]["id"]["enum"] if t[0] == "N"]
        refs: dict[str, str] = {}
        clusters = []
        for name in dict.fromkeys(mems.values()):
            if name.casefold() in existing:
                refs[name] = existing[name.casefold()]
                continue
            refs[name] = new_ids[len(clusters)]
            clusters.append(
                {
                    "id": refs[name],
                    "name": name,
                    "description": f"What the user said about {name}.",
                    "tags": [name.split()[0].casefold().strip("'s")],
                }
            )
        return {
            "clusters": clusters,
            "assign": {a: refs[g] for a, g in mems.items()},
            "conflicts": [],
            "reason": "Grouped by what each memory will be used for.",
        }

    def routes(self, props: dict[str, Any], user: str) -> dict[str, Any]:
        existing = self._clusters(user)
        out = {}
        for line in user.splitlines():
            m = re.match(r"^(R\d+): (.*)$", line)
            if m:
                g = self.group(m.group(2))
                out[m.group(1)] = existing.get((g or "").casefold(), NEW)
        return {"routes": out}

    def profiles(self, props: dict[str, Any], user: str) -> dict[str, Any]:
        """Each group named by its members' reference name (the naming call)."""
        members: dict[str, list[str]] = {}
        key = ""
        for line in user.splitlines():
            head = re.match(r"^(G\d+) \(", line)
            if head:
                key = head.group(1)
            elif line.startswith("- ") and key:
                members.setdefault(key, []).append(self.group(line[2:]) or "other user notes")
        out = {}
        for k in props["groups"]["required"]:
            names = members.get(k) or ["other user notes"]
            name = max(set(names), key=names.count)
            out[k] = {
                "name": name,
                "description": self.descriptions.get(name, f"What the user said about {name}."),
                "tags": [w.strip("'s").casefold() for w in name.split()][:3],
            }
        return {"groups": out}

    def verdicts(self, props: dict[str, Any], user: str) -> dict[str, Any]:
        keys = props["verdicts"]["required"]
        found = re.findall(r'^(A\d+): memory "(.*)"\n\s+cluster "([^:"]+)', user, re.M)
        said = {}
        for k, text, cluster in found:
            g = self.group(text)
            said[k] = "yes" if g is None or g.casefold() == cluster.casefold() else "no"
        return {"verdicts": {k: said.get(k, "yes") for k in keys}}


def pass_gate(fake: Any, backend: Any, config: Any, store: Any) -> Any:
    """Measure `backend` (served by `fake`) with the competent stand-in answering, so the
    gate's verdict is cached in the store and later sessions use the scripted answers."""
    from pathlib import Path

    from clagd.organize.gate import gate_for

    saved = fake.default
    fake.default = Competent()
    try:
        root = Path(store)
        verdict = gate_for(backend, config, root / ".clagd" / "gate", root / "prompts")
    finally:
        fake.default = saved
    assert verdict.may_organize(), verdict.lines()
    return verdict
