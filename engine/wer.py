"""Word and character error rates (Levenshtein distance over tokens), and the form both
sides are scored in (normalize_for_wer: engine/textnorm.py's reading, then every run of number
words as one digit string)."""

from __future__ import annotations

import re
from typing import Sequence

from .textnorm import MONTHS, ONES, SCALES, TENS, normalize


def edit_distance(ref: Sequence, hyp: Sequence) -> int:
    """Minimum substitutions + insertions + deletions turning hyp into ref."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h))
        previous = current
    return previous[-1]


def word_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus WER: total word edits / total reference words (texts already normalised)."""
    edits = sum(edit_distance(r.split(), h.split()) for r, h in zip(refs, hyps, strict=True))
    words = sum(len(r.split()) for r in refs)
    return edits / words if words else float(any(h.split() for h in hyps))


def char_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> float:
    edits = sum(edit_distance(r, h) for r, h in zip(refs, hyps, strict=True))
    chars = sum(len(r) for r in refs)
    return edits / chars if chars else float(any(hyps))


# -- the scoring form -------------------------------------------------------------------------
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
