"""What a pause says about a caller's turn: how long the quiet must last before it is the end.

At each pause in a turn (the VAD heard the speech stop), three cues decide (engine/whisper_stream.py):
how long the VAD has heard no speech, what the pause reading's words say (`reading_says`: the
turn-completion table, engine/turn.py, on the last words, and Whisper's punctuation), and whether
the SSM's end-of-turn head, weighing those words, called the end in this pause (`quiet_needed`).
"""

from __future__ import annotations

from typing import Optional

from .textnorm import normalize
from .turn import TurnCompletion

# End of turn: quiet (by the VAD, which flags the end of speech ~70 ms after it) for at least
CONFIRMED_QUIET_S = 0.2  # ... after a pause reading the words do not call unfinished, once the SSM's
# end-of-turn head, weighing Whisper's words through the turn table (StreamDecoder.words_source),
# has called the end in this pause too (it hears how the voice stops);
COMPLETE_QUIET_S = 0.8  # ... after one that reads as finished without the head (see reading_says),
INCOMPLETE_QUIET_S = 1.0  # ... and after one that reads unfinished ("my number is", "It's...") or
# cannot tell: a hold-off, longer than the 0.4-0.8 s pauses callers make inside a turn.
# The words' cues: the turn-completion table's P(end | last words) (engine/turn.py) below
# UNFINISHED_P, or Whisper's "..." (it writes that where speech breaks off), call a reading
# unfinished: the table is sure about open clauses and digit groups ("... number is" ~0, "... at
# 762" ~0, "I would like to" 0.03). It is lukewarm about finished sentences it never saw
# (0.4-0.65), so a reading is finished with terminal punctuation and P >= UNFINISHED_P, or
# without it (Whisper leaves numbers bare: "zip code 48820") at P >= UNPUNCTUATED_P.
UNFINISHED_P = 0.15
UNPUNCTUATED_P = 0.5
# Chosen on synthetic turns in training voices (engine.train.eval_set's seen_voices group, 40
# turns, 61 pauses of 0.4-0.8 s at commas and digit groups): there the words alone call 17 of the
# 61 pauses finished ("My name is Daniel Evans." | "That's E, V, A, N, S."), so without the head
# COMPLETE_QUIET_S 0.5 took 31 % of pauses for ends, 0.8 s 4.9 %, with the end 523 ms p50 after
# the last word either way (the head confirms most ends ~0.25 s after the speech stops; the rest
# of the latency is the pause reading waiting for the reader). A caller who pauses between two
# whole sentences cannot be told from one who has finished by the words: on real-dev speakers'
# clips joined with 0.4-0.8 s pauses (bench/real_turns.py) only the head can, and on real
# voices it hears ends less well than on the synthetic ones it learned from (MODEL_CARD.md).
WORDLESS_QUIET_S = 0.3  # a sound in which Whisper read no word (a cough, a click) is over after this
SENTENCE_END = (".", "?", "!")
CUT_OFF = ("...", "-", "\u2014", "\u2026")  # how Whisper ends a word or thought it hears cut off


def quiet_needed(text: Optional[str], says: int, heard_end: bool) -> float:
    """Seconds of quiet after which a pause whose reading is `text` ends the turn; `heard_end`:
    a head that hears the voice (the SSM's end-of-turn head, the pause head) called the end."""
    if not text:
        return WORDLESS_QUIET_S
    if says == UNFINISHED:
        return INCOMPLETE_QUIET_S
    if heard_end:
        return CONFIRMED_QUIET_S
    return COMPLETE_QUIET_S if says == FINISHED else INCOMPLETE_QUIET_S


UNFINISHED, OPEN, FINISHED = 0, 1, 2  # what a reading's words say about the turn


def reading_says(text: str, turns: Optional[TurnCompletion]) -> int:
    """Whether a reading of the turn so far reads as a finished turn (FINISHED), an unfinished
    one (UNFINISHED), or cannot tell (OPEN); see UNFINISHED_P."""
    text = text.rstrip()
    if not text or text.endswith(CUT_OFF):
        return UNFINISHED
    punctuated = text.endswith(SENTENCE_END)
    if turns is None:
        return FINISHED if punctuated else OPEN
    p = turns.probability(table_words(text))
    if p < UNFINISHED_P:
        return UNFINISHED
    return FINISHED if punctuated or p >= UNPUNCTUATED_P else OPEN


def reads_finished(text: str, turns: Optional[TurnCompletion]) -> bool:
    return reading_says(text, turns) == FINISHED


DIGIT_NAMES = "zero one two three four five six seven eight nine".split()


def table_words(text: str) -> list[str]:
    """A reading as the table spells its words: lowercase words, and numbers Whisper wrote in
    digits ("762", "555-1234") read digit by digit, as callers say codes and phone numbers
    (the table collapses a run of digit words into one token, engine/turn.py)."""
    words: list[str] = []
    for token in text.split():
        bare = token.strip(".,?!;:\"'()")
        if bare and all(c.isdigit() or c in ",-" for c in bare) and any(c.isdigit() for c in bare):
            words += [DIGIT_NAMES[int(c)] for c in bare if c.isdigit()]
        else:
            words += normalize(token).split()
    return words
