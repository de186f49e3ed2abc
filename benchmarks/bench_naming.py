"""Seconds per naming call and per cluster for a GGUF model: the session's naming call
(`clagd.organize.naming.name_groups`, 4 clusters per call) on the competence gate set's
reference groups (4 scenes x 3 groups of 4 memories), the profiles it wrote, and how many
were usable (2-5 word names, none taken twice).

    python benchmarks/bench_naming.py GGUF [--threads 1] [--calls 3] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta

from clagd.config import LlamaCppConfig
from clagd.model import Memory
from clagd.organize.gate import T0, load_gate_set
from clagd.organize.naming import name_groups
from clagd.slm.llamacpp import LlamaCppBackend


def groups() -> list[tuple[str, list[Memory]]]:
    out = []
    scenes, _h = load_gate_set()
    for s in scenes:
        for g, name in sorted(s.groups.items()):
            mems = [
                Memory.new(t, created_at=(T0 + timedelta(minutes=i)).isoformat())
                for i, (t, grp) in enumerate(s.plan)
                if grp == g
            ]
            out.append((name, mems))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=3, help="naming calls to make")
    ap.add_argument("--batch", type=int, default=4, help="clusters per call")
    args = ap.parse_args()
    todo = groups()[: args.calls * args.batch]
    cfg = LlamaCppConfig(model_path=args.gguf, n_ctx=4096, n_threads=args.threads, timeout=900)
    backend = LlamaCppBackend(cfg)
    try:
        t0 = time.monotonic()
        backend.chat_json(
            [{"role": "user", "content": "Say yes."}],
            {"type": "object", "properties": {"a": {"enum": ["yes"]}}, "required": ["a"]},
        )
        load = time.monotonic() - t0
        run = name_groups(backend, todo, timeout=900, batch=args.batch)
    finally:
        backend.close()
    out = {
        "model": backend.model,
        "threads": args.threads,
        "load_and_first_call_s": round(load, 1),
        "calls": run.calls,
        "clusters": run.asked,
        "named": len(run.profiles),
        "seconds": round(run.seconds, 1),
        "seconds_per_call": round(run.seconds / max(1, run.calls), 1),
        "seconds_per_cluster": round(run.per_cluster, 1),
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "errors": run.errors,
        "profiles": {k: [p.name, p.description, list(p.tags)] for k, p in run.profiles.items()},
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
