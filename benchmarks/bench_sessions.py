"""Per backend: the competence gate's verdict and cost per task, then clustering sessions
(wall time, tokens, accepted vs rolled back).

    python benchmarks/bench_sessions.py [--sessions 3] [--memories 12] [--backends none,llamacpp,ollama]
                                        [--no-gate]

The gate (clagd/organize/gate.py) is measured once per backend: per task (route, organize,
judge) the model's score against the lexical organizer's, allowed or refused, calls,
seconds and tokens. The sessions are then run with the model directly (not gated), so the
table shows what its plans would do; with the gate on, a refused model never gets there.

Each session runs on a fresh store (a real git repo in a temp folder) holding `--memories`
dialogue turns of one LoCoMo conversation (../shared/data/locomo/locomo-dev.json, falling back
to built-in sentences). Backends: `none` (lexical organizer); `llamacpp` when llama-cpp-python
and a GGUF are installed; `ollama` against a real server when one answers with the model,
otherwise against the loopback fake (tests/fake_ollama.py) answering as the competent
stand-in (tests/competent.py: plans from a reference grouping), which measures clagd's own
overhead only, and says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from clagd.config import load_config  # noqa: E402
from clagd.engine.core import Engine  # noqa: E402
from clagd.organize.session import run_session  # noqa: E402
from clagd.slm.llamacpp import LlamaCppBackend  # noqa: E402
from clagd.slm.ollama import OllamaBackend  # noqa: E402
from clagd.store.create import init_store  # noqa: E402

LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
FALLBACK_TEXTS = [
    "User is always cold in the evening",
    "User asked where the heating switch is",
    "User's sister Anna lives in Lyon",
    "Anna's birthday is on 14 June",
    "User prefers aisle seats on long flights",
    "User booked a flight to Rome for 3 May",
    "The quarterly report is due on 30 April",
    "User's manager is called Tom",
]


def memories(n: int, offset: int) -> list[dict]:
    if LOCOMO.exists():
        convs = json.loads(LOCOMO.read_text())
        conv = convs[offset % len(convs)]["conversation"]
        turns = [
            {"content": f"{t['speaker']}: {t['text']}", "metadata": {"dia_id": t["dia_id"]}}
            for k in sorted(
                (k for k in conv if k.startswith("session_") and k[8:].isdigit()),
                key=lambda k: int(k[8:]),
            )
            for t in conv[k]
        ]
        start = (offset * n) % max(1, len(turns) - n)
        return turns[start : start + n]
    return [{"content": t} for t in (FALLBACK_TEXTS * (n // len(FALLBACK_TEXTS) + 1))[:n]]


def gate(make_backend) -> dict | None:  # noqa: ANN001
    """The gate's verdict and per-task cost for one backend (None for `none`)."""
    from clagd.organize.gate import measure

    cfg = load_config(None, env={})
    backend = make_backend(cfg)
    if backend is None:
        return None
    try:
        return measure(backend, None, cfg.backend.gate.margin, cfg=cfg.session).to_dict()
    finally:
        backend.close()


def bench(
    name: str, make_backend, sessions: int, n: int, note: str = "", use_gate: bool = True
) -> dict:  # noqa: E501
    verdict = gate(make_backend) if use_gate else None
    rows = []
    for i in range(sessions):
        with tempfile.TemporaryDirectory() as tmp:
            root, _ = init_store(Path(tmp) / "store")
            cfg = load_config(root, env={})
            cfg.backend.kind = name
            eng = Engine(root, cfg)
            backend = make_backend(cfg)
            try:
                eng.add(memories(n, i))
                t0 = time.monotonic()
                out = run_session(
                    eng.writer.submit, backend, cfg, eng.paths.prompts, trigger="bench"
                )
                rows.append((time.monotonic() - t0, out))
            finally:
                if backend is not None:
                    backend.close()
                eng.close()
    statuses = [o.status for _t, o in rows]
    res = {
        "backend": name + (f" ({note})" if note else ""),
        "model": rows[0][1].model if rows else "",
        "sessions": len(rows),
        "wall_s_mean": statistics.mean(t for t, _o in rows),
        "wall_s_max": max(t for t, _o in rows),
        "prompt_tokens_mean": statistics.mean(o.prompt_tokens for _t, o in rows),
        "completion_tokens_mean": statistics.mean(o.completion_tokens for _t, o in rows),
        "accepted": statuses.count("accepted") / len(rows),
        "rolled_back_or_fallback": sum(s in ("rolled_back", "fallback") for s in statuses)
        / len(rows),
        "statuses": statuses,
        "reasons": [o.reasons[:2] for _t, o in rows if o.status != "accepted"],
        "gate": verdict,
    }
    return res


def print_gate(r: dict) -> None:
    g = r.get("gate")
    if not g:
        return
    print(f"\ngate: {r['backend']} {g['model']}: {g['seconds']:.0f} s, {g['calls']} calls, "
          f"{g['prompt_tokens']} prompt + {g['completion_tokens']} completion tokens")  # fmt: skip
    for task, t in g["tasks"].items():
        cost = g["cost"].get("organize" if task == "name" else task, {})
        print(
            f"  {task:<9} model {t['model']:.2f}  lexical {t['lexical']:.2f}  "
            f"{'allowed' if t['allowed'] else 'refused':<8} {cost.get('seconds', 0):>7.1f} s "
            f"{cost.get('prompt_tokens', 0):>7} + {cost.get('completion_tokens', 0):<6} tok  {t['why']}"
        )
    for c in g["copies"][:3]:
        print(f"  copied: {c}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--memories", type=int, default=12)
    ap.add_argument("--backends", default="none,llamacpp,ollama")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-gate", action="store_true", help="skip the competence gate")
    args = ap.parse_args()
    g = not args.no_gate
    wanted = args.backends.split(",")
    results = []
    if "none" in wanted:
        results.append(bench("none", lambda cfg: None, args.sessions, args.memories))
    if "llamacpp" in wanted:
        probe = LlamaCppBackend(load_config(None, env={}).backend.llamacpp)
        ok, why = probe.available()
        if ok:
            results.append(
                bench(
                    "llamacpp",
                    lambda cfg: LlamaCppBackend(cfg.backend.llamacpp),
                    args.sessions,
                    args.memories,
                    use_gate=g,
                )
            )
        else:
            print(f"llamacpp: skipped ({why})")
    if "ollama" in wanted:
        real = OllamaBackend(load_config(None).backend.ollama)
        ok, why = real.available()
        if ok:
            results.append(
                bench(
                    "ollama",
                    lambda cfg: OllamaBackend(cfg.backend.ollama),
                    args.sessions,
                    args.memories,
                    use_gate=g,
                )
            )
        else:
            from competent import Competent
            from fake_ollama import FakeOllama

            print(f"ollama: no real server ({why}); measuring against the loopback fake")
            with FakeOllama() as srv:
                srv.default = Competent({m["content"]: "conversation notes" for m in
                                         memories(args.memories * args.sessions, 0)})  # fmt: skip

                def make(cfg):  # noqa: ANN001
                    cfg.backend.ollama.host = srv.url
                    return OllamaBackend(cfg.backend.ollama)

                results.append(
                    bench("ollama", make, args.sessions, args.memories, "fake server", g)
                )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"\n{args.sessions} sessions per backend, {args.memories} memories each")
    print(
        f"{'backend':<24}{'model':<34}{'wall s':>8}{'max s':>8}{'prompt tok':>12}{'compl tok':>11}{'accepted':>10}{'rolled back':>13}"
    )
    for r in results:
        print(
            f"{r['backend']:<24}{r['model'][:33]:<34}{r['wall_s_mean']:>8.2f}{r['wall_s_max']:>8.2f}"
            f"{r['prompt_tokens_mean']:>12.0f}{r['completion_tokens_mean']:>11.0f}"
            f"{r['accepted']:>10.0%}{r['rolled_back_or_fallback']:>13.0%}"
        )
    for r in results:
        for reasons in r["reasons"]:
            print(f"  {r['backend']}: {'; '.join(reasons)[:300]}")
    for r in results:
        print_gate(r)


if __name__ == "__main__":
    main()
