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
