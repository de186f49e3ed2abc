"""Precision and recall of the supersede rule (`clagd/ingest/supersede.py`) on the labelled
pairs of `benchmarks/data/supersede_pairs.yaml` (issue 24: precision >= 0.95 before
`ingest.auto_supersede` is on by default).

    PYTHONPATH=. python benchmarks/bench_supersede.py [--show-errors] [--json]

A pair counts as predicted when `changed_value(old, new)` holds: the rule the ingest path
applies to the older memories a new one scores best against (BM25), so this measures the
decision, not the candidate search.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from clagd.ingest.supersede import changed_value
from clagd.yamlio import loads

DATA = Path(__file__).resolve().parent / "data" / "supersede_pairs.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--show-errors", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pairs = loads(args.data.read_text(encoding="utf-8"))["pairs"]
    tp = fp = fn = tn = 0
    kinds: Counter[tuple[str, str]] = Counter()
    errors = []
    for p in pairs:
        got = changed_value(p["old"], p["new"])
        want = bool(p["update"])
        tp += got and want
        fp += got and not want
        fn += want and not got
        tn += not want and not got
        kinds[(p["kind"], "hit" if got == want else "miss")] += 1
        if got != want:
            errors.append(("false positive" if got else "missed", p["kind"], p["old"], p["new"]))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    out = {
        "pairs": len(pairs),
        "updates": tp + fn,
        "negatives": fp + tn,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "per_kind": {
            k: {"right": kinds[(k, "hit")], "wrong": kinds[(k, "miss")]}
            for k in sorted({k for k, _ in kinds})
        },
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"{len(pairs)} pairs ({tp + fn} updates, {fp + tn} negatives): "
            f"precision {precision:.3f} ({tp}/{tp + fp}), recall {recall:.3f} ({tp}/{tp + fn})"
        )
        for k, v in out["per_kind"].items():
            print(f"  {k:16} right {v['right']:3}  wrong {v['wrong']:3}")
    if args.show_errors:
        for e in errors:
            print(f"{e[0]:14} [{e[1]}] {e[2]!r} -> {e[3]!r}")


if __name__ == "__main__":
    main()
