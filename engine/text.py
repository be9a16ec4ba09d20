"""TTS text front-end: written text -> spoken words -> Piper joe's phoneme ids, incrementally.

    normalize_text("Your total is $12.50, due 3/15.")  -> "Your total is twelve dollars and fifty cents, due March fifteenth."
    phonemize("Hello there.")                          -> Phrase(ids=[1, 0, 20, ...], words=[...])
    IncrementalText: push(delta) -> phrases released as soon as they are stable

Normalization keeps case and punctuation (espeak-ng uses them for intonation) and reads
numbers the way a contact-center agent would: amounts and counts as numbers, digit strings
and IDs one character at a time in groups, times and dates in full. Phonemes come from
the espeak-ng bridge bundled with piper-tts, so ids are exactly those Piper joe was
trained on (BOS "^", PAD "_" between phonemes, EOS "$").
"""

from __future__ import annotations

import re
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .textnorm import SYMBOL_WORDS, read_forms, read_numbers, read_symbols, spell

MAX_PHRASE_CHARS = 400  # longer input is cut at word boundaries: bounded work per phrase
MAX_PENDING_CHARS = 256_000  # IncrementalText refuses more unreleased text than this
RELEASE_WORDS = 6  # with no punctuation, release once this many words are complete ...
LOOKAHEAD_WORDS = 2  # ... keeping the last ones back: "$12 million", "3:30 pm" stay whole
SCAN_CHARS = 8 * MAX_PHRASE_CHARS  # how far ahead IncrementalText looks for a cut
PHRASE_END = ".!?;:,"  # punctuation that ends a phrase when followed by whitespace

PAD, BOS, EOS, WORD_GAP = "_", "^", "$", " "
LETTER_NAMES = {"A": "ay", "a": "ay"}  # espeak reads a lone "A" as the article "uh"
ABBREVIATIONS = {
    "mr.": "Mister", "mrs.": "Missus", "ms.": "Miz", "dr.": "Doctor", "prof.": "Professor",
    "jr.": "Junior", "sr.": "Senior", "st.": "Street", "ave.": "Avenue", "rd.": "Road",
    "blvd.": "Boulevard", "apt.": "Apartment", "dept.": "Department", "etc.": "et cetera",
    "e.g.": "for example", "i.e.": "that is", "vs.": "versus", "approx.": "approximately",
    "no.": "number", "min.": "minutes", "hr.": "hour", "hrs.": "hours", "inc.": "Incorporated",
    "co.": "Company", "corp.": "Corporation", "mt.": "Mount", "ft.": "feet", "lbs.": "pounds",
    "oz.": "ounces", "jan.": "January", "feb.": "February", "mar.": "March", "apr.": "April",
    "jun.": "June", "jul.": "July", "aug.": "August", "sep.": "September", "sept.": "September",
    "a.m.": "A M", "p.m.": "P M", "oct.": "October", "nov.": "November", "dec.": "December",
}
TAG = re.compile(r"<[^<>]{0,200}>")  # SSML-looking tags are dropped, their text kept


def _say_letter(c: str) -> str:
    """A spelled letter as Parley's voice should say it: espeak reads a lone "A" as "uh"."""
    return LETTER_NAMES.get(c, c.upper())


def _abbreviation(m: re.Match) -> str:
    return ABBREVIATIONS.get(m.group(0).lower(), m.group(0))


def clean_text(text: str) -> str:
    """Drop what cannot be spoken: control characters, tags, emoji and other scripts."""
    text = TAG.sub(" ", text)
    text = unicodedata.normalize("NFKD", text)
    out = []
    for c in text:
        if unicodedata.combining(c):
            continue
        if c in "\u2018\u2019\u02bc":
            out.append("'")
        elif c in "\u201c\u201d":
            out.append('"')
        elif c in "\u2013\u2014":  # a dash between clauses is a pause
            out.append(", ")
        elif c == "\u2026":
            out.append("...")
        elif c.isascii() and (c.isprintable() or c in "\n\t"):
            out.append(c if c.isprintable() else " ")
        elif unicodedata.category(c)[0] in "ZC":
            out.append(" ")
        elif c in SYMBOL_WORDS:
            out.append(c)
        else:
            out.append(" ")  # emoji, other scripts: not readable by an English voice
    return "".join(out)


SPOKEN_AS_WORDS = ("OK", "US", "USA", "TV", "AM", "PM", "ID")  # caps that espeak-ng reads right


def _spell_acronyms(text: str) -> str:
    """All-caps words in mixed-case text are acronyms: spell them ("IBM" -> "I B M")."""
    if not re.search(r"[a-z]", text):  # all-caps text is shouting, not acronyms
        return text
    return re.sub(r"\b[A-Z]{2,4}\b", lambda m: m.group(0) if m.group(0) in SPOKEN_AS_WORDS
                  else " " + spell(m.group(0), _say_letter) + " ", text)


def normalize_text(text: str) -> str:
    """Written English -> the words to speak, keeping case and phrase punctuation.

    The reading of numbers, money, times, dates and IDs is engine/textnorm.py's, shared with
    the STT labels and WER; abbreviations and acronyms are this voice's pronunciation."""
    t = re.sub(r"\S{41,}", " ", clean_text(text))  # no 40+ character "words": garbage, URLs
    t = re.sub(r"\b(?:[A-Za-z]{1,5}\.){1,3}(?=\s|$)", _abbreviation, t)
    t = read_forms(t, _say_letter)
    t = _spell_acronyms(t)  # before plain numbers: "CALL 911 NOW" stays shouting
    t = read_symbols(read_numbers(t))
    t = re.sub(r"[\"()\[\]{}*_~^`|\\<>]", " ", t)
    t = re.sub(r"\s*([,;:.!?])(?:\s*[,;:.!?])*", r"\1", t)  # ", ." -> ","
    t = re.sub(r"(?<=[,;:.!?])(?=\w)", " ", t)
    t = " ".join(t.split())
    return t.lstrip(" ,;:.!?")  # a phrase may end with its comma (intonation), never start with one


def spoken_words(normalized: str) -> list[str]:
    """The words of normalized text, without punctuation (what WordMarks report)."""
    return [w for w in (re.sub(r"[^\w']", "", tok) for tok in normalized.split()) if w]


# -- phonemes ----------------------------------------------------------------------------------

_PHONEMIZER_LOCK = threading.Lock()
_PHONEMIZER = None
_ID_MAP: Optional[dict[str, list[int]]] = None


PHONEME_IDS = Path(__file__).resolve().parent / "weights" / "phoneme_ids.json"  # Piper joe's table


def phoneme_id_map() -> dict[str, list[int]]:
    """Piper joe's phoneme -> ids table (copied from the voice's config, so the voice package
    is needed only to make training data, not to speak)."""
    global _ID_MAP
    if _ID_MAP is None:
        import json

        _ID_MAP = json.loads(PHONEME_IDS.read_text(encoding="utf-8"))
    return _ID_MAP


def espeak_phonemes(text: str) -> list[tuple[list[str], bool]]:
    """Normalized text -> [(phonemes of a clause run, ends a sentence)] via piper's espeak-ng."""
    global _PHONEMIZER
    from piper.phonemize_espeak import EspeakPhonemizer

    with _PHONEMIZER_LOCK:  # the espeak-ng bridge is one global C state
        if _PHONEMIZER is None:
            _PHONEMIZER = EspeakPhonemizer()
        sentences = _PHONEMIZER.phonemize("en-us", text)
    ends = re.search(r"[.!?]\W*$", text) is not None
    return [(s, i < len(sentences) - 1 or ends) for i, s in enumerate(sentences) if s]


N_PHONEME_IDS = 256  # Piper's num_symbols
BOS_ID, EOS_ID, PAD_ID, GAP_ID = 1, 2, 0, 3


@dataclass
class Phrase:
    """One released piece of text, ready for the acoustic model.

    ids continue the utterance's id sequence: a sentence opens with BOS and closes with
    EOS exactly as in Piper's training data; a phrase cut mid-sentence ends with a word gap.
    word_starts[i] is the index in ids where words[i] starts.
    """

    text: str
    ids: list[int] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    word_starts: list[int] = field(default_factory=list)


def phonemize(text: str, open_sentence: bool = False, close: bool = True) -> tuple[Phrase, bool]:
    """Normalized phrase -> (Phrase, whether a sentence is still open after it).

    open_sentence: the previous phrase ended mid-sentence, so no BOS at the start;
    close: this is the end of the text, so the last sentence gets its EOS.
    """
    id_map = phoneme_id_map()
    phrase = Phrase(text)
    words = spoken_words(text)
    groups: list[int] = []  # id index where each space-separated phoneme group starts
    sentences = espeak_phonemes(text)
    for k, (phonemes, ends) in enumerate(sentences):
        ends = ends or (close and k == len(sentences) - 1)
        if not open_sentence:
            phrase.ids += [BOS_ID, PAD_ID]
        in_group = False
        for p in phonemes:
            if p == WORD_GAP:
                in_group = False
            elif not in_group and p not in PHRASE_END:
                groups.append(len(phrase.ids))
                in_group = True
            for i in id_map.get(p, []):  # unknown symbols are skipped, never an error
                phrase.ids += [i, PAD_ID]
        if ends:
            phrase.ids.append(EOS_ID)
            open_sentence = False
        else:
            if phonemes[-1] != WORD_GAP:  # espeak already ends ",", ";", ":" with a gap
                phrase.ids += [GAP_ID, PAD_ID]
            open_sentence = True
    phrase.words = words
    phrase.word_starts = _align_words(len(words), groups)
    return phrase, open_sentence


def _align_words(n_words: int, groups: list[int]) -> list[int]:
    """Word i -> its phoneme group start; espeak sometimes merges words ("I am" -> "aɪɐm"),
    so when the counts differ the words are spread monotonically over the groups."""
    if not groups:
        return [0] * n_words
    if len(groups) == n_words:
        return groups
    return [groups[min(len(groups) - 1, i * len(groups) // max(1, n_words))] for i in range(n_words)]


# -- incremental release -----------------------------------------------------------------------

ABBREVIATION_ENDS = tuple(ABBREVIATIONS) + ("a.m.", "p.m.")


class IncrementalText:
    """Text deltas in, stable phrases out: a phrase is released at punctuation followed by
    whitespace, or once RELEASE_WORDS + LOOKAHEAD_WORDS words are complete. The cut points
    depend only on the text, so any split of the same text into deltas releases the same
    phrases."""

    def __init__(self) -> None:
        self.pending = ""
        self.open_sentence = False
        self.ended = False

    def push(self, delta: str) -> list[Phrase]:
        if self.ended:
            raise RuntimeError("push() after end()")
        if not isinstance(delta, str):
            raise TypeError(f"text delta must be str, not {type(delta).__name__}")
        if len(self.pending) + len(delta) > MAX_PENDING_CHARS:
            raise ValueError(f"more than {MAX_PENDING_CHARS} characters of unreleased text")
        self.pending += delta
        return self._release(final=False)

    def end(self) -> list[Phrase]:
        self.ended = True
        return self._release(final=True)

    def _release(self, final: bool) -> list[Phrase]:
        phrases = []
        while True:
            cut = self._next_cut()
            if cut is None:
                break
            phrases += self._emit(self.pending[:cut])
            self.pending = self.pending[cut:]
        if final and (self.pending.strip() or self.open_sentence):
            phrases += self._emit(self.pending, final=True)
            self.pending = ""
        return phrases

    def _next_cut(self) -> Optional[int]:
        """End of the first stable phrase in pending, or None.

        Each rule fires at a point in the text (where the evidence is complete); the rule
        that fires first wins, so the cut never depends on how the text was split in deltas.
        """
        text = self.pending[:SCAN_CHARS]  # a cut always lies early: bounded work per phrase
        candidates = []  # (where the rule fires, where it cuts)
        for m in re.finditer(r"[.!?;:,]+[\"')\]]*\s", text):
            before = text[: m.start() + 1].split()
            if m.group(0)[0] == "." and before and before[-1].lower().endswith(ABBREVIATION_ENDS):
                continue  # "Dr. Smith", "9 a.m. tomorrow"
            candidates.append((m.end(), m.end()))
            break
        words = list(re.finditer(r"\S+\s", text))
        if len(words) >= RELEASE_WORDS + LOOKAHEAD_WORDS:
            candidates.append((words[RELEASE_WORDS + LOOKAHEAD_WORDS - 1].end(), words[RELEASE_WORDS - 1].end()))
        long_word = re.search(r"\S{%d}" % MAX_PHRASE_CHARS, text)
        if long_word:  # one enormous "word": cut it anyway
            candidates.append((long_word.end(), long_word.end()))
        if not candidates and len(self.pending) > SCAN_CHARS:
            candidates.append((SCAN_CHARS, text.rfind(" ", 0, MAX_PHRASE_CHARS) + 1 or MAX_PHRASE_CHARS))
        return min(candidates)[1] if candidates else None

    def _emit(self, raw: str, final: bool = False) -> list[Phrase]:
        normalized = normalize_text(raw)
        if not spoken_words(normalized):
            if final and self.open_sentence:  # close the sentence the last phrase left open
                self.open_sentence = False
                return [Phrase("", [EOS_ID])]
            return []
        phrase, self.open_sentence = phonemize(normalized, self.open_sentence, close=final)
        return [phrase] if phrase.ids else []
