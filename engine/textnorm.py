"""How Parley reads written English aloud: the one normalizer for serving, labels and scoring.

Numbers, money, times, dates, ordinals, phone numbers and IDs are read the way a
contact-center agent says them, and every user of written text reads them the same way:

    read_forms + read_numbers   the TTS front end (engine/text.py) keeps case and punctuation
    normalize                   STT training labels: the same reading in the transcript
                                alphabet (lowercase a-z, apostrophe, single spaces)
    engine.wer.normalize_for_wer  scoring, built on normalize
    gateway/responders/spoken.py  builds its number words from these tables

    "$12.50"        -> "twelve dollars and fifty cents"
    "$3.5 million"  -> "three point five million dollars"
    "3:05 pm"       -> "three oh five P M"
    "03/15/2024"    -> "March fifteenth, twenty twenty four"   (also "2024-03-15")
    "March 15"      -> "March fifteenth"        (a day above 31 stays a number: "May 45")
    "21st"          -> "twenty first"
    "1,250"         -> "one thousand two hundred fifty"
    "0412", "41230" -> digit by digit; over six digits in groups of three ("one two three, ...")
    "555-123-4567"  -> "five five five, one two three, four five six seven"
    "AB-1234"       -> "A B one two three four"   (IDs: letters and digits one by one)

Pronunciation for Parley's own voice (abbreviations, acronyms spelled out, the letter name
"ay") is not a reading and stays in engine/text.py: STT labels must follow what the
synthesising voices of the training data said, not how espeak-ng is best steered.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

ALPHABET = "abcdefghijklmnopqrstuvwxyz' "  # the STT model's CTC output symbols (plus blank)

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                     "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
MONTHS = ("january february march april may june july august september october "
          "november december").split()
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
SYMBOL_WORDS = {"&": " and ", "%": " percent", "+": " plus ", "@": " at ", "=": " equals ",
                "#": " number ", "°": " degrees ", "€": " euros ", "£": " pounds "}
ID_DIGITS_MIN = 5  # a bare number with this many digits or more is read digit by digit
DIGIT_GROUPS_OVER = 6  # ... and in groups of three (a pause each) when longer than this

SayLetter = Callable[[str], str]


# -- words for numbers -------------------------------------------------------------------------

def number_to_words(n: int) -> str:
    """Cardinal number in words, e.g. 1250 -> 'one thousand two hundred fifty'."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_to_words(rest))
    for scale, name in SCALES:
        if n >= scale:
            rest = n % scale
            head = number_to_words(n // scale) + " " + name
            return head + ("" if rest == 0 else " " + number_to_words(rest))
    raise AssertionError(n)


def ordinal_words(n: int) -> str:
    """Ordinal number in words, e.g. 21 -> 'twenty first'."""
    words = number_to_words(n).split()
    last = words[-1]
    if last in ORDINAL_IRREGULAR:
        words[-1] = ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def year_words(n: int) -> str:
    """A year as spoken: 1999 -> 'nineteen ninety nine', 2005 -> 'two thousand five'."""
    if 2000 <= n <= 2009 or n % 1000 == 0:
        return number_to_words(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return number_to_words(hi) + " hundred"
    tail = number_to_words(lo) if lo >= 10 else "oh " + ONES[lo]
    return number_to_words(hi) + " " + tail


def digits_words(s: str, group: int = 0) -> str:
    """'0412' -> 'zero four one two'; with group=3, a comma every 3 digits (a pause)."""
    words = [ONES[int(c)] for c in s if c.isdigit()]
    if group and len(words) > group + 1:
        chunks = [" ".join(words[i:i + group]) for i in range(0, len(words), group)]
        return ", ".join(chunks)
    return " ".join(words)


def spell(s: str, say_letter: SayLetter = str.upper) -> str:
    """An ID read one character at a time: 'AB12' -> 'A B one two'."""
    out = []
    for c in s:
        if c.isdigit():
            out.append(ONES[int(c)])
        elif c.isalpha():
            out.append(say_letter(c))
    return " ".join(out)


# -- the readings ------------------------------------------------------------------------------

def _money(m: re.Match) -> str:
    dollars = int(m.group(1).replace(",", ""))
    cents = int((m.group(2) or "0").ljust(2, "0")[:2])
    scale = m.group(3)
    if scale:  # "$3.5 million" -> "three point five million dollars"
        amount = number_to_words(dollars) + (" point " + digits_words(m.group(2)) if m.group(2) else "")
        return f"{amount} {scale} dollars"
    parts = []
    if dollars or not cents:
        parts.append(number_to_words(dollars) + (" dollar" if dollars == 1 else " dollars"))
    if cents:
        parts.append(number_to_words(cents) + (" cent" if cents == 1 else " cents"))
    return " and ".join(parts)


def _time(m: re.Match) -> str:
    hour, minute, ampm = int(m.group(1)), int(m.group(2)), (m.group(3) or "").lower().replace(".", "")
    if hour > 24 or minute > 59:
        return digits_words(m.group(1)) + " " + digits_words(m.group(2))
    if minute == 0:
        words = number_to_words(hour) + ("" if ampm else " o'clock")
    elif minute < 10:
        words = number_to_words(hour) + " oh " + ONES[minute]
    else:
        words = number_to_words(hour) + " " + number_to_words(minute)
    return words + (" " + " ".join(ampm.upper()) if ampm else "")


def _date(m: re.Match) -> str:
    month, day, year = int(m.group(1)), int(m.group(2)), m.group(3)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return digits_words(m.group(0))
    words = MONTHS[month - 1].capitalize() + " " + ordinal_words(day)
    if year:
        words += ", " + year_words(int(year) + (2000 if len(year) == 2 else 0))
    return words


def _iso_date(m: re.Match) -> str:
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return digits_words(m.group(0))
    return f"{MONTHS[month - 1].capitalize()} {ordinal_words(day)}, {year_words(year)}"


def _month_day(m: re.Match) -> str:
    day = int(m.group(2))
    return f"{m.group(1)} {ordinal_words(day)}" if 1 <= day <= 31 else m.group(0)


def _number(s: str) -> str:
    if "." in s:
        whole, frac = s.split(".", 1)
        return number_to_words(int(whole.replace(",", "") or 0)) + " point " + digits_words(frac)
    plain = s.replace(",", "")
    if "," not in s and (len(plain) >= ID_DIGITS_MIN or (len(plain) > 1 and plain[0] == "0")):
        return digits_words(plain, group=3 if len(plain) > DIGIT_GROUPS_OVER else 0)  # account/order numbers
    n = int(plain)
    if "," not in s and len(plain) == 4 and 1100 <= n <= 2099:
        return year_words(n)
    return number_to_words(n)


def _phone(m: re.Match) -> str:
    """'555-123-4567' / '(555) 123-4567' -> digit groups separated by pauses."""
    return ", ".join(digits_words(g) for g in re.findall(r"\d+", m.group(0)))


MONEY = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:\s?(million|billion|thousand|trillion)\b)?")
PHONE = re.compile(r"\(?\b\d{3}\)?[-. ]\d{3}[-.]\d{4}\b")
ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
TIME = re.compile(r"\b(\d{1,2}):(\d{2})\s?([AaPp]\.?[Mm]\b)?")
DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})(?:/(\d{4}|\d{2}))?\b")
MONTH_DAY = re.compile(r"\b(" + "|".join(mo.capitalize() for mo in MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?\b(?![:.,]?\d)")
ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
PERCENT = re.compile(r"\b(\d+(?:\.\d+)?)\s?%")
MIXED_ID = re.compile(r"\b(?=[A-Za-z-]*\d)(?=[\d-]*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*\b")  # AB1234, 4B, X-9
NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")  # "737-8": a dash, not a minus


def read_forms(text: str, say_letter: SayLetter = str.upper) -> str:
    """Money, phone numbers, dates, times, ordinals, percentages and IDs in words, case and
    punctuation kept. Plain numbers are left for read_numbers: a caller may look at the text
    between the two passes (engine/text.py spells acronyms there, before digits become words)."""
    t = MONEY.sub(lambda m: " " + _money(m) + " ", text)
    t = PHONE.sub(lambda m: " " + _phone(m) + " ", t)
    t = ISO_DATE.sub(lambda m: " " + _iso_date(m) + " ", t)
    t = TIME.sub(lambda m: " " + _time(m) + " ", t)
    t = DATE.sub(lambda m: " " + _date(m) + " ", t)
    t = MONTH_DAY.sub(_month_day, t)
    t = ORDINAL.sub(lambda m: " " + ordinal_words(int(m.group(1))) + " ", t)
    t = PERCENT.sub(lambda m: " " + _number(m.group(1)) + " percent", t)
    return MIXED_ID.sub(lambda m: " " + spell(m.group(0), say_letter) + " ", t)


def read_numbers(text: str) -> str:
    """Every remaining number in words: '1,250' -> 'one thousand two hundred fifty', '-5' ->
    'minus five', '3.14' -> 'three point one four', '1999' -> 'nineteen ninety nine'."""
    return NUMBER.sub(lambda m: (" minus " if m.group(0).startswith("-") else " ")
                      + _number(m.group(0).lstrip("-")) + " ", text)


def read_symbols(text: str) -> str:
    for symbol, words in SYMBOL_WORDS.items():
        text = text.replace(symbol, words)
    return text


# -- the transcript alphabet (STT labels) --------------------------------------------------------

SPELLED_CAPS = re.compile(r"\b[A-Z](?:[-.][A-Z])+\b\.?")  # "S-M-I-T-H", "U.S.A."


def normalize(text: str) -> str:
    """Written English -> lowercase letters, apostrophes and single spaces, read as above."""
    t = unicodedata.normalize("NFKD", text)
    t = "".join(c for c in t if not unicodedata.combining(c))
    t = t.replace("\u2019", "'").replace("\u2018", "'")
    t = read_forms(t)
    t = SPELLED_CAPS.sub(lambda m: " " + spell(m.group(0)) + " ", t)
    t = read_symbols(read_numbers(t))
    t = t.lower()
    t = re.sub(r"[^a-z' ]+", " ", t)
    # Keep apostrophes only inside words ("don't", "o'clock"), not as quotes.
    t = re.sub(r"(?<![a-z])'|'(?![a-z])", " ", t)
    return " ".join(t.split())
