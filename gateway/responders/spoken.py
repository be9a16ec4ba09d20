"""Slot values from what callers say: digit strings, yes/no answers and dates.

Parley's STT writes lowercase words, apostrophes and spaces only ("four one two"), so the
parsers read spoken numbers first; digits and punctuation ("412", "3/15") are accepted
too, for typed text and other STT engines. Every parser returns None when it did not
understand, and the flow reprompts.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Optional

from engine import textnorm

# Number, month and weekday words are engine/textnorm.py's, the words Parley's STT labels and
# TTS use, so a slot parser hears exactly what the recognizer was taught to write.
DIGIT_WORDS = {word: value for value, word in enumerate(textnorm.ONES[:10])} | {"nought": 0, "naught": 0}
# Said as digits but also common words, or STT's homophones of digits: a digit only next to
# another number ("four oh two", "for one two"), never on its own ("oh i see", "talk to").
LOOSE_DIGIT_WORDS = {"oh": 0, "o": 0, "won": 1, "to": 2, "too": 2, "for": 4, "ate": 8}
TEENS = {word: value for value, word in enumerate(textnorm.ONES) if value >= 10}
TENS = {word: 10 * value for value, word in enumerate(textnorm.TENS) if value >= 2}
REPEATS = {"double": 2, "triple": 3}

ORDINALS = {textnorm.ordinal_words(day): day for day in (*range(1, 21), 30)}  # first .. twentieth, thirtieth
MONTHS = textnorm.MONTHS
WEEKDAYS = textnorm.WEEKDAYS

YES_PHRASES = ["yes", "yeah", "yep", "yup", "ya", "yah", "sure", "correct", "right", "absolutely",
               "definitely", "affirmative", "okay", "ok", "of course", "i do", "it is", "i did",
               "please do", "uh huh", "mm hmm", "that's right", "go ahead", "no problem",
               "not a problem", "why not", "certainly", "indeed", "yes please"]
NO_PHRASES = ["no", "nope", "nah", "not really", "negative", "i don't", "i do not", "it isn't",
              "it's not", "it is not", "i didn't", "i did not", "never", "wrong", "incorrect",
              "no thanks", "no thank you", "not at all", "don't"]
UNSURE_PHRASES = ["i don't know", "i do not know", "not sure", "maybe", "dunno"]

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """Lowercase word tokens: punctuation dropped, digit runs and '3/15' split apart."""
    return _WORD.findall(text.lower().replace("-", " "))


def normalize(text: str) -> str:
    return " ".join(words(text))


# -- digits ------------------------------------------------------------------------------

def _digit(token: str, loose: bool) -> Optional[int]:
    if token in DIGIT_WORDS:
        return DIGIT_WORDS[token]
    if loose and token in LOOSE_DIGIT_WORDS:
        return LOOSE_DIGIT_WORDS[token]
    return None


def _is_number_word(token: str) -> bool:
    return (token.isdigit() or token in DIGIT_WORDS or token in TEENS or token in TENS
            or token in REPEATS or token == "hundred")


def parse_digits(text: str) -> Optional[str]:
    """'four one two' / '4 1 2' / 'double five' / 'forty one twenty seven' -> '412', '55', '4127'.

    Words that are not numbers are skipped ("it's four one two"); None when no digit was said.
    """
    tokens = words(text)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        near_number = (i > 0 and _is_number_word(tokens[i - 1])) or (
            i + 1 < len(tokens) and _is_number_word(tokens[i + 1]))
        if token.isdigit():
            out.append(token)
        elif token in REPEATS and i + 1 < len(tokens) and _digit(tokens[i + 1], True) is not None:
            out.append(str(_digit(tokens[i + 1], True)) * REPEATS[token])
            i += 1
        elif _digit(token, near_number) is not None:
            value = _digit(token, near_number)
            if i + 1 < len(tokens) and tokens[i + 1] == "hundred":  # "four hundred (and) twelve"
                rest, i = _below_hundred(tokens, i + 2)
                out.append(f"{value * 100 + rest:03d}")
                continue
            out.append(str(value))
        elif token in TEENS:
            out.append(str(TEENS[token]))
        elif token in TENS:
            unit = _digit(tokens[i + 1], True) if i + 1 < len(tokens) else None
            if unit:  # "forty one" -> 41; "forty oh" stays 40 then 0
                out.append(str(TENS[token] + unit))
                i += 1
            else:
                out.append(str(TENS[token]))
        i += 1
    return "".join(out) or None


def _below_hundred(tokens: list[str], i: int) -> tuple[int, int]:
    """The 0-99 after 'hundred' (and the index after it): 'and twelve', 'forty five', ''."""
    if i < len(tokens) and tokens[i] == "and":
        i += 1
    if i < len(tokens) and tokens[i] in TEENS:
        return TEENS[tokens[i]], i + 1
    if i < len(tokens) and tokens[i] in TENS:
        unit = DIGIT_WORDS.get(tokens[i + 1], 0) if i + 1 < len(tokens) else 0
        return TENS[tokens[i]] + unit, i + (2 if unit else 1)
    if i < len(tokens) and tokens[i] in DIGIT_WORDS:
        return DIGIT_WORDS[tokens[i]], i + 1
    return 0, i


def read_digits(digits: str) -> str:
    """'4127550' -> '4 1 2, 7 5 5 0': one digit at a time, a pause every three, never a lone last digit."""
    groups = [digits[i:i + 3] for i in range(0, len(digits), 3)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2:] = [groups[-2] + groups[-1]]
    if len(digits) <= 4:
        groups = [digits]
    return ", ".join(" ".join(group) for group in groups)


# -- yes / no ----------------------------------------------------------------------------

def _phrase_positions(tokens: list[str], phrases: list[str]) -> list[tuple[int, int]]:
    """(start, length) of each phrase found as whole words."""
    found = []
    for phrase in phrases:
        parts = phrase.split()
        for i in range(len(tokens) - len(parts) + 1):
            if tokens[i:i + len(parts)] == parts:
                found.append((i, len(parts)))
    return found


def parse_yes_no(text: str) -> Optional[bool]:
    """'yeah sure' -> True, 'nope' -> False, 'no problem' -> True; the first answer given wins."""
    tokens = words(text)
    if _phrase_positions(tokens, UNSURE_PHRASES):
        return None  # "i don't know" is not a no
    answers = [(i, n, True) for i, n in _phrase_positions(tokens, YES_PHRASES)]
    answers += [(i, n, False) for i, n in _phrase_positions(tokens, NO_PHRASES)]
    if not answers:
        return None
    # The earliest phrase; at one position the longest ("no problem" beats "no").
    answers.sort(key=lambda a: (a[0], -a[1]))
    return answers[0][2]


# -- dates -------------------------------------------------------------------------------

def _day_number(tokens: list[str], i: int) -> tuple[Optional[int], int]:
    """A day of the month at tokens[i]: '3', '3rd', 'third', 'twenty first', 'thirty'. (day, next i)."""
    if i < len(tokens) and tokens[i] == "the":
        i += 1
    if i >= len(tokens):
        return None, i
    token = tokens[i]
    match = re.fullmatch(r"(\d{1,2})(?:st|nd|rd|th)?", token)
    if match:
        return int(match.group(1)), i + 1
    if token in ("twenty", "thirty"):
        tens = TENS[token]
        if i + 1 < len(tokens):
            unit = ORDINALS.get(tokens[i + 1]) or DIGIT_WORDS.get(tokens[i + 1])
            if unit and unit < 10:
                return tens + unit, i + 2
        return tens, i + 1
    value = ORDINALS.get(token) or TEENS.get(token) or DIGIT_WORDS.get(token)
    return (value, i + 1) if value else (None, i)


def _next_date(today: dt.date, month: int, day: int) -> Optional[dt.date]:
    """The date with this month and day on or after today (this year or next); None if no such day."""
    for year in (today.year, today.year + 1):
        try:
            date = dt.date(year, month, day)
        except ValueError:
            continue  # february twenty ninth in a common year: try the next
        if date >= today:
            return date
    return None


def parse_date(text: str, today: Optional[dt.date] = None) -> Optional[dt.date]:
    """'tomorrow', 'next monday', 'march third', 'the third of march', '3/15', 'the fifth', 'in two days'.

    Dates without a year are the next such date (callbacks and appointments lie ahead).
    A bare or 'next' weekday is the first one after today; 'this friday' may be today.
    """
    today = today or dt.date.today()
    tokens = words(text)
    joined = " ".join(tokens)
    if "day after tomorrow" in joined:
        return today + dt.timedelta(days=2)
    for word, days in (("today", 0), ("tonight", 0), ("tomorrow", 1), ("yesterday", -1)):
        if word in tokens:
            return today + dt.timedelta(days=days)
    numeric = re.search(r"\b(\d{1,2})/(\d{1,2})(?:/(\d{2,4}))?\b", text)
    if numeric:  # US order: month/day[/year]
        month, day, year = int(numeric.group(1)), int(numeric.group(2)), numeric.group(3)
        if year:
            try:
                return dt.date(int(year) + (2000 if len(year) == 2 else 0), month, day)
            except ValueError:
                return None
        return _next_date(today, month, day) if 1 <= month <= 12 else None
    for i, token in enumerate(tokens):
        if token in MONTHS:  # "march third", "march the 3rd"
            day, _ = _day_number(tokens, i + 1)
            if day is None and i >= 2 and tokens[i - 1] == "of":  # "the third of march"
                day, _ = _day_number(tokens, _day_start(tokens, i - 1))
            return _next_date(today, MONTHS.index(token) + 1, day) if day else None
    for i, token in enumerate(tokens):
        if token in WEEKDAYS:
            ahead = (WEEKDAYS.index(token) - today.weekday()) % 7
            if ahead == 0 and not (i > 0 and tokens[i - 1] == "this"):
                ahead = 7
            return today + dt.timedelta(days=ahead)
    for i, token in enumerate(tokens):
        if token == "the" and (day := _day_number(tokens, i)[0]):  # "on the fifteenth": this month or next
            return _next_day_of_month(today, day)
    match = re.search(r"\bin (a|one|\d+|\w+) (day|days|week|weeks)\b", joined)
    if match:
        count = 1 if match.group(1) in ("a", "one") else (
            int(match.group(1)) if match.group(1).isdigit() else DIGIT_WORDS.get(match.group(1)))
        if count is not None:
            return today + dt.timedelta(days=count * (7 if match.group(2).startswith("week") else 1))
    return None


def _next_day_of_month(today: dt.date, day: int) -> Optional[dt.date]:
    month, year = today.month, today.year
    for _ in range(12):  # the thirty first is not in every month
        date = _next_date(today, month, day)
        if date is not None and date.year == year and date.month == month:
            return date
        month, year = (1, year + 1) if month == 12 else (month + 1, year)
    return None


def _day_start(tokens: list[str], of_index: int) -> int:
    """Where the day before '... of march' begins: one or two words back ('twenty first')."""
    if of_index >= 2 and tokens[of_index - 2] in ("twenty", "thirty"):
        return of_index - 2
    return of_index - 1


def read_date(date: dt.date) -> str:
    """date(2026, 3, 16) -> 'Monday, March sixteenth'."""
    return f"{WEEKDAYS[date.weekday()].title()}, {MONTHS[date.month - 1].title()} {textnorm.ordinal_words(date.day)}"
