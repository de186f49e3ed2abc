"""Tokenizer shared by the index, the organizer and the eval baselines.

Lowercase, split on anything that is not a letter or digit, drop a modest English stopword
list, then Snowball (Porter2) stems from PyStemmer. Stems are cached per word: the same few
thousand words come back in every memory and every query, so the cache makes tokenizing a
memory cost about one regex pass plus dictionary lookups.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import Stemmer

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
# the same on ASCII text (letters and digits), about twice as fast as the Unicode class
_ASCII_WORD_RE = re.compile(r"[a-z0-9]+")

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further had hadn't has hasn't have haven't
    having he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll
    i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor
    not of off on once only or other ought our ours ourselves out over own same shan't she she'd
    she'll she's should shouldn't so some such than that that's the their theirs them themselves
    then there there's these they they'd they'll they're they've this those through to too under
    until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where
    where's which while who who's whom why why's with won't would wouldn't you you'd you'll
    you're you've your yours yourself yourselves
    s t d ll m re ve don didn doesn isn wasn aren weren hasn haven hadn won wouldn shouldn
    couldn just also yeah oh
    """.split()
)

_stemmer = Stemmer.Stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word)


# word -> index term ("" = dropped), one table per (stem, stopwords) setting; the vocabulary
# of a store is a few tens of thousands of words, so the tables stay small
_TERMS: dict[tuple[bool, bool], dict[str, str]] = {}
_MAX_TERMS = 500_000


def _term_table(stem: bool, stopwords: bool) -> dict[str, str]:
    table = _TERMS.get((stem, stopwords))
    if table is None or len(table) > _MAX_TERMS:
        table = _TERMS[(stem, stopwords)] = {}
    return table


def words(text: str) -> list[str]:
    """Lowercased alphanumeric runs, in order (apostrophes split words: "don't" -> don, t)."""
    low = text.lower()
    return (_ASCII_WORD_RE if low.isascii() else _WORD_RE).findall(low)


# The separator `word_stream` puts after each text's words: a byte that no ASCII text can
# hold, so it never comes out of a text.
WORD_SEP = b"\xff"
# ASCII byte -> its lowercase letter or digit, or a space for anything else (0xff is kept)
_FOLD = bytes(
    ord(chr(c).lower()) if c < 128 and chr(c).isalnum() else (c if c == 0xFF else 0x20)
    for c in range(256)
)


def word_stream(texts: list[str]) -> list[bytes]:
    """`words(t)` of every text, as bytes, each text's words followed by WORD_SEP: for
    tokenizing many memories at once (the start-up loader), one byte translation and one
    split over all of them instead of a regex pass per text (~2x faster). Every text must
    be ASCII (`str.isascii`); on ASCII text the two give the same words."""
    if not texts:
        return []
    joined = " \xff ".join(texts) + " \xff"
    return joined.encode("latin-1").translate(_FOLD).split()


def word_terms(ws: list[str], stem: bool = True, stopwords: bool = True) -> list[str]:
    """The index term of each lowercase word, in order ("" where the word is dropped)."""
    table = _term_table(stem, stopwords)
    out = list(map(table.get, ws))
    if None in out:
        for i, w in enumerate(ws):
            if out[i] is None:
                t = "" if stopwords and w in STOPWORDS else (_stemmer.stemWord(w) if stem else w)
                out[i] = table[w] = t
    return out  # type: ignore[return-value]  # every None was filled


def tokenize(text: str, stem: bool = True, stopwords: bool = True) -> list[str]:
    """Index terms of `text`: lowercase words, stopwords dropped, Snowball-stemmed."""
    return [t for t in word_terms(words(text), stem, stopwords) if t]


def stem(word: str) -> str:
    """The stem `tokenize` would give one lowercase word (for mapping stems back to words)."""
    return _stem(word.lower())


def estimate_tokens(text: str) -> int:
    """A cheap LLM-token estimate: max(words * 4/3, chars / 4), rounded up.

    Subword tokenizers give about 1.3 tokens per English word and about 4 characters per
    token; taking the larger of the two stays close for prose and does not undercount text
    full of numbers, ids or punctuation.
    """
    if not text:
        return 0
    n_words = len(text.split())
    return max(-(-n_words * 4 // 3), -(-len(text) // 4))


# the ASCII characters `str.split()` splits on
_SPACE = np.zeros(256, dtype=bool)
_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


def estimate_tokens_many(texts: list[str]) -> np.ndarray:
    """`estimate_tokens` of each text, the ASCII ones in a few numpy passes over all of
    them together (for the start-up loader: ~3x faster than one call per text)."""
    plain = [t if t.isascii() else "" for t in texts]
    lens = np.fromiter(map(len, plain), dtype=np.int64, count=len(plain))
    raw = np.frombuffer("\n".join(plain).encode("ascii"), dtype=np.uint8)
    space = _SPACE[raw]
    starts = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))
    begin = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1] + 1, out=begin[1:])
    n_words = np.searchsorted(starts, begin + lens) - np.searchsorted(starts, begin)
    out = np.maximum(-(-n_words * 4 // 3), -(-lens // 4))
    for i, t in enumerate(texts):
        if not plain[i] and t:
            out[i] = estimate_tokens(t)
    return out
