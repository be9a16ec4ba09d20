"""Turn completion: has the caller finished what they were saying, judging by the words alone?

    turns = load_turns()                                  # engine/weights/turns.json.gz
    turns.probability("my order number is".split())       # ~0: a pause here is mid-turn
    turns.probability("call me back at two oh six five five five one two three four".split())

The acoustic end-of-turn head hears a pause; it cannot know that "my order number is" or
three digits of a ten-digit phone number leave the turn open. This table can: for the last
one, two or three words of a transcript (a trailing run of digit words counts as one token,
"#N", so "...is two oh six" and "...is four one one" share their statistics), how often a
turn ended there against how often the speaker paused there and went on. Those counts come
from turns with their pauses marked (`engine.train.build_turns`: the STT corpus's training
texts, or your own transcripts), and back off from three words to none like an n-gram model.
StreamDecoder (engine/stt.py) adds the result, as log odds, to the acoustic head's.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from . import weights

SHIPPED_TURNS = weights.WEIGHTS_DIR / "turns.json.gz"
ORDER = 3  # tokens of context at most
SMOOTHING = 4.0  # pseudo-counts drawn from the shorter context's estimate
DIGIT_WORDS = frozenset("zero oh one two three four five six seven eight nine".split())
MAX_DIGIT_RUN = 12  # longer runs share one token
BOS = "<s>"
INSIDE_WEIGHT = 0.02  # a word inside a stretch of speech, as a pause that went on

Context = tuple[str, ...]


def contexts(words: Sequence[str], order: int = ORDER) -> list[Context]:
    """The last 0, 1, ... order tokens of "<s> words", a trailing run of digit words collapsed
    into "#<length>" (the longer ones repeat the whole turn when it is shorter)."""
    tokens = [BOS] + list(words)
    run = 0
    while tokens[-1] in DIGIT_WORDS:
        tokens.pop()
        run += 1
    if run:
        tokens.append(f"#{min(run, MAX_DIGIT_RUN)}")
    return [tuple(tokens[max(0, len(tokens) - n):]) if n else () for n in range(order + 1)]


def context(words: Sequence[str], n: int) -> Context:
    """The last n tokens of "<s> words" (see contexts)."""
    return contexts(words, n)[n]


class TurnCompletion:
    """P(the turn is over | its words so far), from counts of (pauses, ends) per context."""

    def __init__(self, counts: dict[Context, tuple[float, float]], order: int = ORDER) -> None:
        self.counts, self.order = counts, order
        self._cached = lru_cache(maxsize=1 << 14)(self._probability)

    def probability(self, words: Sequence[str]) -> float:
        """P(end of turn) after these words (the turn's words so far, oldest first)."""
        return self._cached(tuple(contexts(words, self.order)[1:]))

    def _probability(self, contexts: tuple[Context, ...]) -> float:
        """Backing off from the longest of the contexts (shortest first) to none."""
        pauses, ends = self.counts.get((), (0, 0))
        p = (ends + 1) / (pauses + ends + 2)
        shorter: Context = ()
        for longer in contexts:
            seen = self.counts.get(longer)
            if seen is None or longer == shorter:  # unseen, or the whole turn already
                break
            shorter = longer
            pauses, ends = seen
            p = (ends + SMOOTHING * p) / (pauses + ends + SMOOTHING)
        return p


def count_turns(turns: Iterable[Sequence[Sequence[str]]], order: int = ORDER) -> TurnCompletion:
    """Count from turns given as their stretches of speech (each a list of words): the
    boundary after every stretch but the last is a pause, after the last the turn's end.
    Every word inside a stretch counts INSIDE_WEIGHT of a pause: callers hesitate there too,
    and "I would like to" must not read as finished because no pause was ever marked after it."""
    counts: dict[Context, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for stretches in turns:
        words: list[str] = []
        for i, stretch in enumerate(stretches):
            for j, word in enumerate(stretch):
                words.append(word)
                boundary = j == len(stretch) - 1
                weight = 1.0 if boundary else INSIDE_WEIGHT
                ended = boundary and i == len(stretches) - 1
                for key in set(contexts(words, order)):
                    counts[key][ended] += weight
    return TurnCompletion({k: (round(v[0], 3), round(v[1], 3)) for k, v in counts.items()}, order)


def write_turns(model: TurnCompletion, path: Path) -> int:
    """Save as gzipped JSON; returns the number of contexts."""
    rows = sorted([" ".join(k), p, e] for k, (p, e) in model.counts.items())
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"order": model.order, "contexts": rows}, f, separators=(",", ":"))
    return len(rows)


def load_turns(path: Path = SHIPPED_TURNS) -> TurnCompletion:
    """Read a table written by write_turns (cached: each file is read once, however it is
    named; FileNotFoundError or ValueError naming the path). Every stream shares the table:
    reading the shipped one takes ~0.5 s, which a call's first stream once spent on the
    event loop."""
    return _read_turns(Path(path).resolve())


@lru_cache(maxsize=4)
def _read_turns(path: Path) -> TurnCompletion:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        counts = {tuple(k.split()): (float(p), float(e)) for k, p, e in data["contexts"]}
        return TurnCompletion(counts, int(data["order"]))
    except FileNotFoundError:
        raise
    except (OSError, EOFError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: not a turn-completion table ({error})") from error
