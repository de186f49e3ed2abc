"""The supersede rule (`clagd/ingest/supersede.py`) on the cases it is built around; the
labelled set (`benchmarks/data/supersede_pairs.yaml`) measures it at large."""

from __future__ import annotations

import pytest

from clagd.ingest.supersede import changed_value


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Alice's phone number is 0151 111", "Alice's phone number is 0151 222"),
        ("Alice's phone number is 0151 111", "Alice's phone number changed to 0160 222"),
        ("Kemal lives in Lisbon", "Kemal now lives in Lyon"),
        (
            "The dentist appointment is on Monday at 3pm",
            "The dentist appointment is on Tuesday at 4pm",
        ),
        ("Farid's flat is at 40 Mill Road", "Farid's flat is at 53 Station Road"),
        ("Alice has 2 cats", "Alice has 3 cats"),
    ],
)
def test_a_changed_value_of_one_statement_is_an_update(old: str, new: str) -> None:
    assert changed_value(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Alice's phone number is 0151 111", "Bob's phone number is 0151 222"),  # subject
        ("Alice's flight to Paris leaves at 9am", "Alice's flight to Rome leaves at 9am"),
        ("Alice's phone number is 0151 111", "Alice's work phone number is 0151 222"),
        ("Alice has a dog", "Alice has a dog and a cat"),  # an addition
        ("Alice likes coffee", "Alice does not like coffee"),  # a negation
        ("Alice met Bob on Monday", "Alice met Bob on Friday"),  # an event, again
        ("tight loop note 7", "tight loop note 8"),  # numbered things
        ("Room 12 is booked for Friday", "Room 14 is booked for Friday"),
        ("Alice lives in Berlin", "Alice lives in Berlin now"),  # the same value
        (
            "The user's dentist is Dr. Weber in Hamburg",
            "The user's dentist is Dr. Novak in Hamburg",
        ),
    ],
)
def test_other_pairs_are_not(old: str, new: str) -> None:
    assert not changed_value(old, new)


def test_a_long_memory_is_never_compared() -> None:
    """Only statements of one fact are compared: the same one-place change at the end of a
    text over MAX_WORDS words is no update (the alignment would be quadratic in its length
    on the writer thread: 24 memories of 12,000 words held it for minutes)."""
    from clagd.ingest.supersede import MAX_WORDS

    body = " ".join(f"w{i}" for i in range(MAX_WORDS))
    short_old, short_new = "Alice's phone number is 0151 111", "Alice's phone number is 0151 222"
    assert changed_value(short_old, short_new)
    assert not changed_value(f"{short_old} {body}", f"{short_new} {body}")
