"""Knowledge updates: does the newer statement of a fact rank above the older one?

    PYTHONPATH=. python benchmarks/bench_knowledge_update.py [--facts 120] [--auto-supersede]
        [--recency-tie X] [--json]

A real store (git, the engine, the lexical organizer): `--facts` facts about 24 people (a
phone number, a city, an employer, an age, a gym, ...) with dated distractors sharing their
words, organized by a clustering session; 60-90 days later each fact is restated with a new
value, in one of several phrasings (the same sentence, "now", "changed to", "new", "since
May"), and each person's question is asked ("What is Alice's phone number?").
Each restatement says the words the question asks about (a lexical memory cannot match
"Where does Alice work?" to "Alice started a new job at Bosch"). A question counts as right when the newer statement ranks above the older (or the older is
not returned at all) among the first 20 hits. With `--auto-supersede` off (the default
here) the ranking alone is measured: no memory is superseded.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from clagd.engine.core import Engine
from clagd.model import iso_utc
from clagd.store.create import init_store

PEOPLE = (
    "Alice Bob Carla Dev Emma Farid Greta Hiro Ines Jonas Kemal Lena Marta Nils Olga Pavel "
    "Quinn Rosa Sami Tara Ugo Vera Wim Yara"
).split()
CITIES = "Berlin Lisbon Porto Leeds York Madrid Vienna Oslo Lyon Turin Ghent Cork".split()
FIRMS = "Siemens Zalando Spotify Nokia Bosch Philips Ikea Lego Adidas Roche".split()
GYMS = "FitBox IronWorks PulseClub CoreLab GymNation".split()
DAYS = "Monday Tuesday Wednesday Thursday Friday".split()


def _facts(rng: random.Random) -> list[tuple[str, str, str, str]]:
    """(person, question, old statement, new statement) per fact: eight attributes."""

    def pick(xs: list[str]) -> tuple[str, str]:
        a, b = rng.sample(xs, 2)
        return a, b

    def num(lo: int, hi: int) -> str:
        return str(rng.randint(lo, hi))

    out = []
    for p in PEOPLE:
        c1, c2 = pick(CITIES)
        f1, f2 = pick(FIRMS)
        g1, g2 = pick(GYMS)
        d1, d2 = pick(DAYS)
        age = rng.randint(22, 60)
        variants = [
            (
                f"What is {p}'s phone number?",
                f"{p}'s phone number is 0151 {num(100, 999)}",
                rng.choice(
                    [
                        f"{p}'s phone number is 0160 {num(100, 999)}",
                        f"{p}'s phone number changed to 0160 {num(100, 999)}",
                        f"{p} has a new phone number: 0176 {num(100, 999)}",
                        f"{p}'s new phone number is 0176 {num(100, 999)}",
                    ]
                ),
            ),
            (
                f"Where does {p} live?",
                f"{p} lives in {c1}",
                rng.choice(
                    [
                        f"{p} lives in {c2}",
                        f"{p} now lives in {c2}",
                        f"{p} moved and lives in {c2} now",
                    ]
                ),
            ),
            (
                f"Where does {p} work?",
                f"{p} works at {f1}",
                rng.choice(
                    [f"{p} works at {f2}", f"{p} works at {f2} now", f"{p} now works for {f2}"]
                ),
            ),
            (
                f"How old is {p}?",
                f"{p} is {age} years old",
                rng.choice(
                    [f"{p} is {age + 1} years old", f"{p} is {age + 1} years old since May"]
                ),
            ),
            (
                f"Which gym does {p} go to?",
                f"{p} goes to the {g1} gym",
                rng.choice([f"{p} goes to the {g2} gym", f"{p} switched to the {g2} gym"]),
            ),
        ]
        for q, old, new in variants:
            out.append((p, q, old, new))
    rng.shuffle(out)
    return out


def _distractors(rng: random.Random, n: int) -> list[str]:
    """Statements that share the facts' words without answering them."""
    forms = [
        "{p} called about the phone bill on {d}",
        "{p} said the gym was crowded on {d}",
        "{p} talked about work and the commute from {c}",
        "{p}'s sister lives near {c}",
        "{p} was tired after work on {d}",
        "{p} asked where the new office will be",
        "{p} lost an old phone on the train to {c}",
        "{p}'s birthday party is in {c} this year",
    ]
    return [
        rng.choice(forms).format(p=rng.choice(PEOPLE), d=rng.choice(DAYS), c=rng.choice(CITIES))
        for _ in range(n)
    ]


def run(n_facts: int, auto_supersede: bool, recency_tie: float | None, seed: int) -> dict:
    rng = random.Random(seed)
    facts = _facts(rng)[:n_facts]
    tmp = Path(tempfile.mkdtemp(prefix="clagd-ku-"))
    try:
        root, _ = init_store(tmp / "store")
        cfg = yaml.safe_load((root / "clagd.yaml").read_text())
        cfg["backend"] = {"kind": "none", "recheck_seconds": 0}
        cfg.setdefault("ingest", {})["auto_supersede"] = auto_supersede
        if recency_tie is not None:
            cfg.setdefault("retrieval", {})["recency_tie"] = recency_tie
        cfg["session"] = {
            "interval_minutes": 0,
            "memory_add_threshold": 10**6,
            "dialogue_round_threshold": 10**6,
        }
        (root / "clagd.yaml").write_text(yaml.safe_dump(cfg))
        eng = Engine(root)
        t0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
        first = [
            {"content": old, "created_at": iso_utc(t0 + timedelta(days=rng.uniform(0, 30)))}
            for _, _, old, _ in facts
        ]
        first += [
            {"content": d, "created_at": iso_utc(t0 + timedelta(days=rng.uniform(0, 90)))}
            for d in _distractors(rng, 2 * len(facts))
        ]
        rng.shuffle(first)
        for i in range(0, len(first), 40):
            eng.add(first[i : i + 40])
        eng.recluster()
        later = [
            {"content": new, "created_at": iso_utc(t0 + timedelta(days=rng.uniform(60, 90)))}
            for _, _, _, new in facts
        ]
        for i in range(0, len(later), 10):
            eng.add(later[i : i + 10])
        right, details = 0, []
        for _, q, old, new in facts:
            hits = [m.content for m in eng.query(q, max_memories=20, count_round=False).memories]
            pos_new = hits.index(new) if new in hits else None
            pos_old = hits.index(old) if old in hits else None
            ok = pos_new is not None and (pos_old is None or pos_new < pos_old)
            right += ok
            details.append({"q": q, "new": pos_new, "old": pos_old, "ok": ok})
        eng.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "facts": len(facts),
        "auto_supersede": auto_supersede,
        "recency_tie": recency_tie,
        "newer_first": round(right / len(facts), 4),
        "right": right,
        "wrong": [d for d in details if not d["ok"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=120)
    ap.add_argument("--auto-supersede", action="store_true")
    ap.add_argument("--recency-tie", type=float, default=None, help="default: the config's")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args.facts, args.auto_supersede, args.recency_tie, args.seed)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"{out['facts']} facts, auto_supersede {out['auto_supersede']}, recency_tie "
        f"{out['recency_tie'] if out['recency_tie'] is not None else 'default'}: the newer "
        f"statement ranks above the older in {out['right']}/{out['facts']} questions "
        f"({out['newer_first']:.3f})"
    )
    for d in out["wrong"][:10]:
        print(f"  {d['q']}: newer at {d['new']}, older at {d['old']}")


if __name__ == "__main__":
    main()
