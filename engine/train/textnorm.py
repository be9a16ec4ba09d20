"""English text normalizer: written text -> the transcript alphabet the STT model emits.

The target alphabet is lowercase a-z, the apostrophe and single spaces. Everything a
caller can say with digits or symbols is spelled out the way it is usually spoken:

    "$12.50"        -> "twelve dollars and fifty cents"
    "3:05 pm"       -> "three oh five p m"
    "03/15/2024"    -> "march fifteenth twenty twenty four"
    "21st"          -> "twenty first"
    "AB-1234"       -> "a b one two three four"   (IDs: letters and digits one by one)
    "1,250"         -> "one thousand two hundred fifty"

The same function normalizes references and hypotheses for WER, so both sides agree.
"""

import re
import unicodedata

ALPHABET = "abcdefghijklmnopqrstuvwxyz' "  # the CTC output symbols (plus blank)

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                     "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
MONTHS = ("january february march april may june july august september october "
          "november december").split()
SYMBOLS = {"&": " and ", "%": " percent ", "+": " plus ", "@": " at ", "#": " number ",
           "=": " equals "}
ID_DIGITS_MIN = 5  # a bare number with this many digits or more is read digit by digit


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


def digits_words(s: str) -> str:
    """Read a digit string one digit at a time: '0412' -> 'zero four one two'."""
    return " ".join(ONES[int(c)] for c in s if c.isdigit())


def spell(s: str) -> str:
    """Read an ID one character at a time: 'AB12' -> 'a b one two'."""
    out = []
    for c in s:
        if c.isdigit():
            out.append(ONES[int(c)])
        elif c.isalpha():
            out.append(c.lower())
    return " ".join(out)


def _money(m: re.Match) -> str:
    dollars = int(m.group(1).replace(",", ""))
    cents = int((m.group(2) or "0").ljust(2, "0")[:2])
    parts = []
    if dollars or not cents:
        parts.append(number_to_words(dollars) + (" dollar" if dollars == 1 else " dollars"))
    if cents:
        parts.append(number_to_words(cents) + (" cent" if cents == 1 else " cents"))
    return " " + " and ".join(parts) + " "


def _time(m: re.Match) -> str:
    h, mnt, ampm = int(m.group(1)), int(m.group(2)), (m.group(3) or "")
    if mnt == 0:
        words = number_to_words(h) + (" o'clock" if not ampm else "")
    elif mnt < 10:
        words = number_to_words(h) + " oh " + ONES[mnt]
    else:
        words = number_to_words(h) + " " + number_to_words(mnt)
    if ampm:
        words += " " + " ".join(ampm.lower().replace(".", ""))
    return " " + words + " "


def _date(m: re.Match) -> str:
    mo, day, yr = int(m.group(1)), int(m.group(2)), m.group(3)
    if not (1 <= mo <= 12 and 1 <= day <= 31):
        return " " + spell(m.group(0)) + " "
    words = MONTHS[mo - 1] + " " + ordinal_words(day)
    if yr:
        y = int(yr) + (2000 if len(yr) == 2 else 0)
        words += " " + year_words(y)
    return " " + words + " "


def _number(m: re.Match) -> str:
    s = m.group(0)
    if "." in s:
        whole, frac = s.split(".", 1)
        return " " + number_to_words(int(whole.replace(",", "") or 0)) + " point " + digits_words(frac) + " "
    plain = s.replace(",", "")
    if "," not in s and (len(plain) >= ID_DIGITS_MIN or (len(plain) > 1 and plain[0] == "0")):
        return " " + digits_words(plain) + " "
    n = int(plain)
    if "," not in s and len(plain) == 4 and 1100 <= n <= 2099:
        return " " + year_words(n) + " "
    return " " + number_to_words(n) + " "


def _mixed_id(m: re.Match) -> str:
    return " " + spell(m.group(0)) + " "


def normalize(text: str) -> str:
    """Written English -> lowercase letters, apostrophes and single spaces."""
    t = unicodedata.normalize("NFKD", text)
    t = "".join(c for c in t if not unicodedata.combining(c))
    t = t.replace("\u2019", "'").replace("\u2018", "'")
    t = re.sub(r"\$\s?(\d[\d,]*)(?:\.(\d{1,2}))?", _money, t)
    t = re.sub(r"\b(\d{1,2}):(\d{2})\s?([AaPp]\.?[Mm]\.?)?(?![\w])", _time, t)
    t = re.sub(r"\b(\d{1,2})/(\d{1,2})(?:/(\d{4}|\d{2}))?\b", _date, t)
    t = re.sub(r"\b(\d+)(st|nd|rd|th)\b", lambda m: " " + ordinal_words(int(m.group(1))) + " ", t)
    # IDs that mix letters and digits ("AB1234", "4B") are read character by character;
    # hyphenated all-caps IDs ("AB-12") likewise.
    t = re.sub(r"\b(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z0-9]+\b", _mixed_id, t)
    t = re.sub(r"\b[A-Z](?:[-.][A-Z])+\b\.?", lambda m: " " + spell(m.group(0)) + " ", t)
    t = re.sub(r"\d[\d,]*(?:\.\d+)?", _number, t)
    for sym, word in SYMBOLS.items():
        t = t.replace(sym, word)
    t = t.lower()
    t = re.sub(r"[^a-z' ]+", " ", t)
    # Keep apostrophes only inside words ("don't", "o'clock"), not as quotes.
    t = re.sub(r"(?<![a-z])'|'(?![a-z])", " ", t)
    return " ".join(t.split())
