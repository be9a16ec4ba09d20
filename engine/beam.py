"""Streaming CTC prefix beam search with a word n-gram language model.

Greedy CTC picks the best letter in every 40 ms frame on its own, so a voice the acoustic
model hears badly comes out as letter soup ("melisoe lite ats"). The prefix beam search
keeps the `beam` likeliest transcripts (summing every frame path that spells each one),
and scores each word as it completes with the language model: alpha * ln P(word | two
words before) + beta, a bonus per word that offsets the LM's cost of saying anything at
all. While a word is still being spelled, letters that begin no known word cost
`OOV_LETTER_PENALTY` each, so the search cannot postpone the LM's verdict by never
ending a word. Unknown words stay possible (names, spellings), at the LM's <unk> price.

Frames arrive one at a time (`push`), so the work is spread over the turn and the final
transcript is ready when the turn ends. Each hypothesis carries its words' frame spans,
for the Final's word times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from .lm import BOS, EOS, NgramLm

NEG_INF = -math.inf
LM_WEIGHT = 0.4  # alpha; chosen with WORD_BONUS and BEAM_WIDTH on the held-out folders without the blind voices
WORD_BONUS = 2.5  # beta (nats per word); re-chosen for the shipped acoustic weights (1.5 before)
BEAM_WIDTH = 32  # 16 before the int8 kernel freed the time: offline WER 0.344 at 16, 0.327 at 32, 0.315 at 64 (the
# selection folders); 64 cost the streaming path RTF 0.047-0.050 on an AVX2 CPU, 32 0.042-0.048
OOV_LETTER_PENALTY = 3.0  # nats (times alpha) per letter that leaves every known word
CANDIDATE_LOG_PROB = -5.0  # letters less likely than this in a frame are not considered


def _log_add(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    return a if b == NEG_INF else a + math.log1p(math.exp(b - a))


@dataclass(slots=True)  # slots: a frame creates and reads hundreds of these
class _Hypothesis:
    blank: float = NEG_INF  # log P(frames so far, ending in blank)
    letter: float = NEG_INF  # log P(frames so far, ending in the last letter)
    lm: float = 0.0  # alpha * LM log P + beta of the completed words
    spans: tuple = ()  # (first frame, last frame) per completed word
    word_start: int = -1  # first frame of the word being spelled
    word_end: int = -1  # its latest letter's frame

    @property
    def acoustic(self) -> float:  # _log_add(blank, letter), inline: the search's most frequent call
        a, b = self.blank, self.letter
        if a < b:
            a, b = b, a
        return a if b == NEG_INF else a + math.log1p(math.exp(b - a))


# A prefix is (completed words, letters of the word being spelled, last token).
Prefix = tuple[tuple[str, ...], str, int]


class CtcBeamSearch:
    """One stream's beam over a turn: push each frame's candidate tokens, read `best()`."""

    def __init__(self, lm: NgramLm, vocab: Sequence[str], blank: int = 0, *, lm_weight: float = LM_WEIGHT,
                 word_bonus: float = WORD_BONUS, beam_width: int = BEAM_WIDTH) -> None:
        self.lm, self.vocab, self.blank = lm, list(vocab), blank
        self.space = self.vocab.index(" ")
        self.lm_weight, self.word_bonus, self.beam_width = lm_weight, word_bonus, beam_width
        self.reset()

    def reset(self) -> None:
        self.beams: dict[Prefix, _Hypothesis] = {((), "", self.blank): _Hypothesis(blank=0.0)}
        self._best: Optional[tuple[list[str], list[tuple[int, int]]]] = None  # best(), until the ranking changes

    def push(self, candidates: Sequence[tuple[int, float]], frame: int) -> None:
        """One frame's (token, log probability) pairs: the blank and the likely letters."""
        blank_lp = next((lp for token, lp in candidates if token == self.blank), NEG_INF)
        letters = [(t, lp) for t, lp in candidates if t != self.blank and lp > CANDIDATE_LOG_PROB]
        if not letters:  # a third of all frames: every hypothesis just waits through a blank
            for hyp in self.beams.values():  # (all scores move alike: best() stays what it was)
                hyp.blank, hyp.letter = hyp.acoustic + blank_lp, NEG_INF
            return
        self._best = None
        grown: dict[Prefix, _Hypothesis] = {}
        for prefix, hyp in self.beams.items():
            words, partial, last = prefix
            acoustic = hyp.acoustic
            stay = self._at(grown, prefix, hyp)
            stay.blank = _log_add(stay.blank, acoustic + blank_lp)
            for token, lp in letters:
                if token == last:  # a repeat without a blank between collapses into the same letter
                    stay.letter = _log_add(stay.letter, hyp.letter + lp)
                    source = hyp.blank + lp
                else:
                    source = acoustic + lp
                if source == NEG_INF:
                    continue
                if token == self.space and not partial:  # a space with no word before it changes nothing
                    target = self._at(grown, (words, partial, token), hyp)
                elif token == self.space:
                    target = self._at(grown, (words + (partial,), "", token), self._complete(hyp, words, partial), source)
                else:  # _at, without making a hypothesis just to copy its fields
                    key, start = (words, partial + self.vocab[token], token), hyp.word_start if partial else frame
                    target = grown.get(key)
                    if target is None:
                        target = grown[key] = _Hypothesis(lm=hyp.lm, spans=hyp.spans, word_start=start, word_end=frame)
                    elif source > target.acoustic:
                        target.spans, target.word_start, target.word_end = hyp.spans, start, frame
                target.letter = _log_add(target.letter, source)
        ranked = sorted(grown.items(), key=self._rank_key)
        self.beams = dict(ranked[: self.beam_width])

    def best(self) -> tuple[list[str], list[tuple[int, int]]]:
        """The likeliest transcript so far, as words and each word's (first, last) frame."""
        if self._best is None:
            self._best = self._rank_best()
        words, spans = self._best
        return list(words), list(spans)

    def _rank_best(self) -> tuple[list[str], list[tuple[int, int]]]:
        best_score, best = NEG_INF, ([], [])
        for (words, partial, _), hyp in self.beams.items():
            if partial:
                hyp = self._complete(hyp, words, partial)
                words = words + (partial,)
            score = hyp.acoustic + hyp.lm + self.lm_weight * self.lm.log_prob(self._context(words), EOS)
            if score > best_score:
                best_score, best = score, (list(words), list(hyp.spans))
        return best

    def _complete(self, hyp: _Hypothesis, words: tuple[str, ...], word: str) -> _Hypothesis:
        """hyp with `word` ended: its LM score added and its frame span recorded."""
        lm = self.lm.log_prob(self._context(words), word)
        if word not in self.lm.vocabulary:
            lm -= OOV_LETTER_PENALTY * (len(word) - self.lm.known_prefix(word))
        return _Hypothesis(hyp.blank, hyp.letter, hyp.lm + self.lm_weight * lm + self.word_bonus,
                           hyp.spans + ((hyp.word_start, hyp.word_end),))

    def _context(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """The words the LM conditions on: the last order - 1 after <s>."""
        return ((BOS,) + words)[1 - self.lm.order:] if self.lm.order > 1 else ()

    def _rank_key(self, item: tuple[Prefix, _Hypothesis]) -> float:
        """Sort key, best first: minus the score of what is spelled so far (with the letters
        that begin no known word charged OOV_LETTER_PENALTY each)."""
        (_, partial, _), hyp = item
        unknown = len(partial) - self.lm.known_prefix(partial) if partial else 0
        return -(hyp.acoustic + hyp.lm - self.lm_weight * OOV_LETTER_PENALTY * unknown)

    @staticmethod
    def _at(grown: dict, prefix: Prefix, like: _Hypothesis, incoming: Optional[float] = None) -> _Hypothesis:
        """The hypothesis for prefix in grown, created from `like` (no probability yet) if new.
        When paths merge, the word times of the likelier incoming path win."""
        hyp = grown.get(prefix)
        if hyp is None:
            hyp = grown[prefix] = _Hypothesis(lm=like.lm, spans=like.spans, word_start=like.word_start,
                                              word_end=like.word_end)
        elif incoming is not None and incoming > hyp.acoustic:
            hyp.spans, hyp.word_start, hyp.word_end = like.spans, like.word_start, like.word_end
        return hyp
