"""LoCoMo's answer scores: normalized token F1 and BLEU-1.

F1 follows LoCoMo's `task_eval/evaluation.py` (Maharana et al., ACL 2024): lower case, drop
punctuation, drop "a", "an", "the" and "and", drop commas, Porter-stem every word, token F1
with multiplicity. Category 1 (multi-hop) answers are lists: prediction and gold answer are
split on commas and each gold part is scored by its best predicted part, then averaged;
category 3 gold answers keep only what precedes the first ";". The stemmer is PyStemmer's
original Porter algorithm (LoCoMo uses NLTK's `PorterStemmer`, whose default mode differs
from the original on a few rare words).

BLEU-1 is clipped unigram precision times the brevity penalty over lower-cased word and
punctuation tokens (the score CLAG and A-Mem report beside F1), 0 when nothing matches.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter

import Stemmer

_porter = Stemmer.Stemmer("porter")
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = set(string.punctuation)
_BLEU_TOKENS = re.compile(r"\w+|[^\w\s]")


def normalize_answer(s: str) -> str:
    s = s.replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _stems(text: str) -> list[str]:
    return [_porter.stemWord(w) for w in normalize_answer(text).split()]


def f1_score(prediction: str, truth: str) -> float:
    """Token F1 of two normalized, stemmed strings."""
    pred, gold = _stems(prediction), _stems(truth)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_multi(prediction: str, truth: str) -> float:
    """Category 1: the mean over gold parts of the best F1 of any predicted part."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in truth.split(",")]
    return sum(max(f1_score(p, g) for p in preds) for g in golds) / len(golds)


def locomo_f1(prediction: str, truth: str, category: int) -> float:
    """F1 the way LoCoMo scores a question of `category`."""
    if category == 3:
        truth = truth.split(";")[0].strip()
    if category == 1:
        return f1_multi(prediction, truth)
    return f1_score(prediction, truth)


def bleu1(prediction: str, truth: str) -> float:
    pred = _BLEU_TOKENS.findall(prediction.lower())
    ref = _BLEU_TOKENS.findall(truth.lower())
    if not pred or not ref:
        return 0.0
    clipped = sum((Counter(pred) & Counter(ref)).values())
    if clipped == 0:
        return 0.0
    bp = 1.0 if len(pred) > len(ref) else math.exp(1 - len(ref) / len(pred))
    return bp * clipped / len(pred)
