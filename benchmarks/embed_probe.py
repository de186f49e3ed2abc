"""Does SmolLM2's embedding (mean-pooled, llama.cpp embedding mode) added to the lexical score
route the gate set's probes better than the lexical router alone?

    PYTHONPATH=. python benchmarks/embed_probe.py

A proxy only (docs/sessions.md, "Embedding signal"): the 14 filed probes of
clagd/organize/gate_set.yaml, each a forced choice among its scene's 5 clusters; the lexical
score is the gate's IDF-weighted overlap (normalized to the best), the embedding score the
cosine z-normalized across the candidates, added with weight w ("alone": embedding only).
"""

from __future__ import annotations

import time

import numpy as np
from llama_cpp import Llama

from clagd.organize.gate import NEW, _profile, load_gate_set, overlap_rank
from clagd.slm.llamacpp import default_gguf

Row = tuple[str, list[str], list[float], list[float]]


def main() -> None:
    llm = Llama(model_path=default_gguf(), embedding=True, n_ctx=512, n_threads=2, verbose=False)
    count = 0

    def emb(text: str) -> np.ndarray:
        nonlocal count
        count += 1
        v = np.asarray(llm.embed(text), dtype=np.float64)
        if v.ndim == 2:
            v = v.mean(axis=0)
        return v / (np.linalg.norm(v) or 1.0)

    scenes, _hash = load_gate_set()
    start = time.monotonic()
    rows: list[Row] = []
    for s in scenes:
        profiles = [_profile(c) for c in s.clusters]
        pe = [emb(p) for p in profiles]
        for text, truth in s.probes:
            if truth == NEW:
                continue
            lexical = {i: sc for sc, i in overlap_rank(text, profiles)}
            best = max(lexical.values()) or 1.0
            e = emb(text)
            rows.append(
                (
                    truth,
                    [c.name for c in s.clusters],
                    [lexical[i] / best for i in range(len(profiles))],
                    [float(e @ p) for p in pe],
                )
            )
    per_text = (time.monotonic() - start) / count
    for w in (0.0, 0.25, 0.5, 1.0, 2.0, None):
        hits = 0
        for truth, names, lex, cos in rows:
            c = np.asarray(cos)
            z = (c - c.mean()) / (c.std() or 1.0)
            score = z if w is None else np.asarray(lex) + w * z
            hits += names[int(np.argmax(score))] == truth
        label = "embedding alone" if w is None else f"lexical + {w:g} x embedding"
        print(f"{label:<28} routing accuracy {hits}/{len(rows)} = {hits / len(rows):.2f}")
    print(f"{per_text:.3f} s per embedding")


if __name__ == "__main__":
    main()
