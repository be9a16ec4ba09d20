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


# --- Scoring form for WER -------------------------------------------------------------
# References are written in spoken form ("four one two", "twenty twenty five") while some
# recognisers (Whisper) write digits ("412", "2025"). normalize() spells digits out, but a
# number can be spoken several ways ("four hundred twelve" / "four one two"), so for
# scoring both sides are taken one step further: every run of number words becomes one
# digit string. Fillers and a few spelling variants are dropped / unified on both sides.

DIGIT_VALUES = {w: i for i, w in enumerate(ONES[:10])}
TEEN_VALUES = {w: i for i, w in enumerate(ONES) if i >= 10}
TENS_VALUES = {w: 10 * i for i, w in enumerate(TENS) if i >= 2}
SCALE_VALUES = {name: value for value, name in SCALES}
HUNDRED = "hundred"
ZERO_ALIAS = "oh"  # "three oh five": a zero only between other number words
JOINER = "and"  # "one hundred and five": kept inside a number only after hundred/a scale
FILLERS = frozenset("um umm uh uhm uhh erm hmm mm mhm".split())
SPELLING_VARIANTS = {"ok": "okay"}
# Written conventions normalize() would read differently from how they are spoken:
# "7.45 am" is a time (not "seven point four five"), "January 10" is read "January tenth".
DOTTED_TIME = re.compile(r"\b(\d{1,2})\.(\d{2})(?=\s?[AaPp]\.?[Mm]\b)")
MONTH_DAY = re.compile(r"\b(" + "|".join(MONTHS) + r")\s+(\d{1,2})\b(?![:.,]?\d|st|nd|rd|th)",
                       re.IGNORECASE)


def _word_value(word: str) -> int | None:
    for table in (DIGIT_VALUES, TEEN_VALUES, TENS_VALUES):
        if word in table:
            return table[word]
    return 0 if word == ZERO_ALIAS else None


def _is_number_word(word: str) -> bool:
    return _word_value(word) is not None or word == HUNDRED or word in SCALE_VALUES


class _Phrase:
    """One spoken number being parsed: 'four hundred twelve' or just 'four'."""

    def __init__(self) -> None:
        self.total = 0  # the part already multiplied by a scale (thousand, million...)
        self.current = 0  # the part below the last scale
        self.last = None  # kind of the last word: 'unit', 'teen', 'tens', 'hundred', 'scale'
        self.last_scale: int | None = None

    def add_value(self, word: str) -> bool:
        """Take a digit/teen/tens word if it continues this phrase, else return False."""
        value = _word_value(word)
        kind = "unit" if value < 10 else "teen" if value < 20 else "tens"
        joins = (self.last is None
                 or (self.last == "tens" and kind == "unit" and value > 0)
                 or (self.last in ("hundred", "scale") and value > 0))
        if not joins:
            return False
        self.current += value
        self.last = kind
        return True

    def add_hundred(self) -> bool:
        if self.last is None:
            self.current, self.last = 100, "hundred"
            return True
        if self.last in ("unit", "teen", "tens") and 0 < self.current < 100:
            self.current *= 100
            self.last = "hundred"
            return True
        return False

    def add_scale(self, word: str) -> bool:
        scale = SCALE_VALUES[word]
        if self.last is None:
            self.current = 1
        elif self.last == "scale" or self.current == 0:
            return False
        if self.last_scale is None or scale < self.last_scale:
            self.total += self.current * scale
        else:
            self.total = (self.total + self.current) * scale
        self.current, self.last, self.last_scale = 0, "scale", scale
        return True

    def add(self, word: str) -> bool:
        if word == HUNDRED:
            return self.add_hundred()
        if word in SCALE_VALUES:
            return self.add_scale(word)
        return self.add_value(word)

    def digits(self) -> str:
        return str(self.total + self.current)


def number_words_to_digits(words: list[str]) -> str:
    """A run of number words -> one digit string.

    Each spoken number in the run is parsed on its own and the results are concatenated:
    'four one two' -> '412', 'four hundred twelve' -> '412', 'twenty twenty four' ->
    '2024', 'two thousand five' -> '2005', 'three oh five' -> '305'.
    """
    out, phrase = [], _Phrase()
    for word in words:
        if word == JOINER:
            continue
        if not phrase.add(word):
            out.append(phrase.digits())
            phrase = _Phrase()
            phrase.add(word)
    if phrase.last is not None:
        out.append(phrase.digits())
    return "".join(out)


def _number_runs(words: list[str]) -> list[tuple[int, int]]:
    """(start, end) spans of maximal number-word runs; 'oh' only inside a run, 'and' only
    between hundred/a scale and a following number word."""
    spans, i = [], 0
    while i < len(words):
        if not _is_number_word(words[i]) or words[i] == ZERO_ALIAS:
            i += 1
            continue
        j = i + 1
        while j < len(words):
            nxt = words[j + 1] if j + 1 < len(words) else ""
            if _is_number_word(words[j]) and words[j] != ZERO_ALIAS:
                j += 1
            elif words[j] == ZERO_ALIAS and _is_number_word(_skip_ohs(words, j)):
                j += 1
            elif (words[j] == JOINER and (words[j - 1] == HUNDRED or words[j - 1] in SCALE_VALUES)
                  and _word_value(nxt) not in (None, 0)):
                j += 1
            else:
                break
        spans.append((i, j))
        i = j
    return spans


def _skip_ohs(words: list[str], j: int) -> str:
    """The first word from j on that is not 'oh' ('' at the end)."""
    while j < len(words) and words[j] == ZERO_ALIAS:
        j += 1
    return words[j] if j < len(words) else ""


def _spoken_conventions(text: str) -> str:
    """'7.45 am' -> '7:45 am'; 'January 10' -> 'January 10th' (when 1 <= day <= 31)."""
    text = DOTTED_TIME.sub(r"\1:\2", text)

    def day(m: re.Match) -> str:
        return f"{m.group(1)} {m.group(2)}th" if 1 <= int(m.group(2)) <= 31 else m.group(0)

    return MONTH_DAY.sub(day, text)


def normalize_for_wer(text: str) -> str:
    """The form both reference and hypothesis are scored in: normalize() (after reading
    dotted times and month days as spoken), fillers dropped, spelling variants unified, and
    each run of number words turned into one digit string ("four one two" / "four hundred
    twelve" / "412" -> "412")."""
    spoken = normalize(_spoken_conventions(text))
    words = [SPELLING_VARIANTS.get(w, w) for w in spoken.split() if w not in FILLERS]
    out, last = [], 0
    for start, end in _number_runs(words):
        out += words[last:start]
        out.append(number_words_to_digits(words[start:end]))
        last = end
    out += words[last:]
    return " ".join(out)
