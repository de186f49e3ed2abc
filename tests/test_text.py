from clagd.text import STOPWORDS, estimate_tokens, stem, tokenize


def test_lowercases_splits_and_keeps_digits():
    assert tokenize("Hiking-boots, 42 GB!", stem=False, stopwords=False) == [
        "hiking",
        "boots",
        "42",
        "gb",
    ]


def test_drops_stopwords_and_stems():
    assert tokenize("I was running to the mountains") == ["run", "mountain"]
    assert tokenize("the and of", stopwords=True) == []
    assert tokenize("the and of", stopwords=False, stem=False) == ["the", "and", "of"]


def test_contractions_split_into_stopwords():
    assert tokenize("Don't I'm") == []


def test_unicode_letters_are_words():
    assert tokenize("Café Zürich", stem=False) == ["café", "zürich"]


def test_stem_matches_tokenize():
    assert stem("Adoption") == tokenize("adoption")[0]
    assert "the" in STOPWORDS


def test_estimate_tokens():
    assert estimate_tokens("") == 0
    assert estimate_tokens("one two three") == 4  # ceil(3 * 4 / 3)
    assert estimate_tokens("x" * 400) == 100  # one long "word": chars / 4
    text = "a fairly ordinary sentence about hiking in the mountains"
    assert estimate_tokens(text) >= len(text.split())


def _random_texts(n: int, seed: int) -> list[str]:
    import random
    import string

    rng = random.Random(seed)
    # every ASCII character (controls and \x1c-\x1f, which str.split() splits on, too), and
    # a few non-ASCII ones, including the separator's own character
    chars = [chr(c) for c in range(128)] + list(string.ascii_letters * 3) + ["é", "Σ", "\xff"]
    texts = ["", " ", "a", "Hello, World!", "don't", "x_y", "\x00", "\x1cfoo\x1dbar", "Σ"]
    texts += ["".join(rng.choice(chars) for _ in range(rng.randint(0, 60))) for _ in range(n)]
    return texts


def test_word_stream_gives_the_words_of_each_ascii_text() -> None:
    from clagd.text import WORD_SEP, word_stream, words

    texts = [t for t in _random_texts(3000, seed=1) if t.isascii()]
    expected = [w.encode() for t in texts for w in words(t) + ["\xff"]]
    expected = [WORD_SEP if w == "\xff".encode() else w for w in expected]
    assert word_stream(texts) == expected
    assert word_stream([]) == [] and word_stream(["", ""]) == [WORD_SEP, WORD_SEP]


def test_estimate_tokens_many_equals_one_by_one() -> None:
    from clagd.text import estimate_tokens_many

    texts = _random_texts(3000, seed=2)
    assert estimate_tokens_many(texts).tolist() == [estimate_tokens(t) for t in texts]
    assert estimate_tokens_many([]).tolist() == []
