"""One reading of written numbers (engine/textnorm.py): the TTS says what the STT labels write.

The voice keeps case and punctuation and adds its own pronunciation (abbreviations, acronyms,
the letter name "ay"); the labels are the same words in the transcript alphabet."""

import re

import pytest

from engine.text import normalize_text
from engine.textnorm import normalize


def in_alphabet(spoken: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]+", " ", spoken.lower()).split())


@pytest.mark.parametrize("written", [
    "Your total is $1,249.99, due 3/15/2024.",
    "$3.5 million and $2 billion",
    "Call 555-123-4567 or (555) 123-4567 at 9:30 pm",
    "On 2024-03-05, March 15 and the 21st, at 10:00",
    "ticket 1234567890, order 0412, zip code 02139",
    "It is -5 degrees, 45% off, pi is 3.14",
    "May 45 people came in 1999 and 2005",
    "Room 4B on floor 12",
])
def test_the_voice_and_the_labels_read_numbers_alike(written):
    assert normalize(written) == in_alphabet(normalize_text(written))


def test_a_day_above_31_stays_a_number():
    assert normalize_text("May 45 people") == "May forty five people"
    assert normalize("March 15") == "march fifteenth"


def test_dashes_and_ellipses_are_pauses():
    assert normalize_text("Yes\u2014of course\u2026 right") == "Yes, of course. right"  # used to raise TypeError
