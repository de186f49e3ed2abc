"""The junk small models wrote when measured (issue 15), as answers for the loopback servers:
the prompt's first example copied word for word, a looping summary, one cluster for
everything, a NEW for everything. Each works for any plan schema; for the gate's routing and
judging requests they answer the way those models did (one choice for all, always "yes")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fake_ollama import is_plan_request

Answer = dict[str, Any]
LOOP = "she's a little baby, " * 12


def _ids(req: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    props = req["format"]["properties"]
    mems = list(props["assign"]["required"])
    targets = props["clusters"]["items"]["properties"]["id"]["enum"]
    return mems, [t for t in targets if t[0] == "C"], [t for t in targets if t[0] == "N"]


def _other(req: dict[str, Any]) -> Answer:
    props = req["format"]["properties"]
    if "verdicts" in props:  # the validator says yes to everything
        return {"content": {"verdicts": {k: "yes" for k in props["verdicts"]["required"]}}}
    if "routes" in props:
        keys = props["routes"]["required"]
        first = props["routes"]["properties"][keys[0]]["enum"][0]
        return {"content": {"routes": {k: first for k in keys}}}
    return {"content": {}}


def _plan_or_other(make: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable:
    def answer(req: dict[str, Any]) -> Answer:
        return {"content": make(req)} if is_plan_request(req) else _other(req)

    return answer


def _copied(req: dict[str, Any]) -> dict[str, Any]:
    mems, _c, new = _ids(req)
    return {
        "clusters": [
            {"id": "N1", "name": "user comfort at home",
             "description": "What keeps the user comfortable at home, such as warmth and heating.",
             "tags": ["comfort", "heating"]},
            {"id": new[1] if len(new) > 1 else "N1", "name": "user family members",
             "description": "People in the user's family, where they live and their dates.",
             "tags": ["family", "birthdays"]},
        ][: 2 if len(new) > 1 else 1],
        "assign": {m: ("N1" if i < 2 or len(new) < 2 else new[1]) for i, m in enumerate(mems)},
        "conflicts": [],
        "reason": "Feeling cold and the heating switch serve the same task; Anna's facts serve "
        "family tasks.",
    }  # fmt: skip


def _looping(req: dict[str, Any]) -> dict[str, Any]:
    mems, _c, new = _ids(req)
    half = len(mems) // 2
    return {
        "clusters": [
            {"id": new[0], "name": "little baby", "description": LOOP[:200], "tags": ["baby"]},
            {"id": new[1], "name": "little baby girl", "description": LOOP[:200], "tags": ["baby"]},
        ],
        "assign": {m: new[0] if i < half else new[1] for i, m in enumerate(mems)},
        "conflicts": [],
        "reason": LOOP[:300],
    }


def _all_in_one(req: dict[str, Any]) -> dict[str, Any]:
    mems, _c, new = _ids(req)
    return {
        "clusters": [{"id": new[0], "name": "user notes", "description": "Notes.", "tags": []}],
        "assign": {m: new[0] for m in mems},
        "conflicts": [],
        "reason": "All notes.",
    }


def _new_for_everything(req: dict[str, Any]) -> dict[str, Any]:
    """Every memory to a new cluster, as many as the schema allows; only the first named
    (SmolLM2: "memories go to new clusters it never names")."""
    mems, _c, new = _ids(req)
    used = [new[i % len(new)] for i in range(len(mems))]
    return {
        "clusters": [{"id": new[0], "name": "new topic", "description": "New.", "tags": []}],
        "assign": dict(zip(mems, used)),
        "conflicts": [],
        "reason": "Each memory is new.",
    }


JUNK: dict[str, Callable[[dict[str, Any]], Answer]] = {
    "copied_example": _plan_or_other(_copied),
    "looping_summary": _plan_or_other(_looping),
    "all_in_one": _plan_or_other(_all_in_one),
    "new_for_everything": _plan_or_other(_new_for_everything),
}
