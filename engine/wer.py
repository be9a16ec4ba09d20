"""Word and character error rates (Levenshtein distance over tokens)."""

from __future__ import annotations

from typing import Sequence


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
