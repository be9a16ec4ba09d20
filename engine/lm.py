"""A word n-gram language model in the ARPA format, for the recognizer's beam search.

    lm = load_lm()                               # the shipped engine/weights/lm.arpa.gz
    lm.log_prob(("my", "name"), "is")            # natural log P(is | my name), with backoff
    write_arpa(sentences, Path("my.arpa.gz"))    # interpolated absolute discounting, order 3

The shipped file is built from the STT training corpus's training texts by
`python -m engine.train.build_lm`; any ARPA file (e.g. KenLM's `lmplz` on your own call
transcripts) can replace it. Words are spelled as the recognizer spells them: lowercase
letters and apostrophes, numbers as words (`engine.train.build_lm.spelled`).
"""

from __future__ import annotations

import gzip
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional, Sequence

from . import weights

SHIPPED_LM = weights.WEIGHTS_DIR / "lm.arpa.gz"
BOS, EOS, UNK = "<s>", "</s>", "<unk>"
LN10 = math.log(10.0)
DISCOUNT = 0.7  # absolute discount per seen n-gram
UNK_LOG10 = -6.0  # an unknown word, before the beam search's per-letter penalty


class NgramLm:
    """Backoff n-gram probabilities: P(w | h) = p(h w) if seen, else bow(h) * P(w | h[1:])."""

    def __init__(self, grams: dict[tuple[str, ...], tuple[float, float]], order: int) -> None:
        self.grams = grams  # n-gram -> (log P, log backoff weight), natural logs
        self.order = order
        self.vocabulary = {g[0] for g in grams if len(g) == 1} - {BOS, UNK}
        self.prefixes = {w[:i] for w in self.vocabulary for i in range(1, len(w) + 1)}
        self.unk = grams.get((UNK,), (UNK_LOG10 * LN10, 0.0))[0]
        # The beam search asks the same few questions over and over: answer them from memory.
        self.log_prob = lru_cache(maxsize=1 << 18)(self.log_prob)  # type: ignore[method-assign]
        self.known_prefix = lru_cache(maxsize=1 << 16)(self.known_prefix)  # type: ignore[method-assign]

    def log_prob(self, context: Sequence[str], word: str) -> float:
        """Natural log P(word | context); context is the preceding words after <s>."""
        history = tuple(context)[-(self.order - 1):] if self.order > 1 else ()
        backoff = 0.0
        while True:
            gram = self.grams.get(history + (word,))
            if gram is not None:
                return backoff + gram[0]
            if not history:
                return backoff + self.unk
            backoff += self.grams.get(history, (0.0, 0.0))[1]
            history = history[1:]

    def known_prefix(self, letters: str) -> int:
        """How many leading letters of a partial word begin some word the model knows."""
        n = len(letters)
        while n and letters[:n] not in self.prefixes:
            n -= 1
        return n


def read_arpa(path: Path) -> NgramLm:
    """An ARPA file (optionally gzipped) -> NgramLm. Raises ValueError on a malformed file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    grams: dict[tuple[str, ...], tuple[float, float]] = {}
    order, section = 0, 0
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("ngram ") or line in ("\\data\\", "\\end\\"):
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                section = int(line[1:-len("-grams:")])
                order = max(order, section)
                continue
            fields = line.split()
            if section == 0 or len(fields) not in (section + 1, section + 2):
                raise ValueError(f"{path}:{number}: not an ARPA {section}-gram line: {line[:80]!r}")
            bow = float(fields[section + 1]) * LN10 if len(fields) == section + 2 else 0.0
            grams[tuple(fields[1:section + 1])] = (float(fields[0]) * LN10, bow)
    if order == 0:
        raise ValueError(f"{path}: no n-grams")
    return NgramLm(grams, order)


@lru_cache(maxsize=4)
def load_lm(path: Optional[Path] = None) -> NgramLm:
    """The shipped language model, or an ARPA file given by path (cached: it is read once)."""
    return read_arpa(Path(path) if path else SHIPPED_LM)


def write_arpa(sentences: Iterable[str], path: Path, order: int = 3, discount: float = DISCOUNT) -> dict:
    """Interpolated absolute discounting with Kneser-Ney continuation unigrams, as ARPA.

    Every sentence is one line of space-separated words. Returns the n-gram counts per order.
    """
    counts: list[dict[tuple[str, ...], int]] = [defaultdict(int) for _ in range(order + 1)]
    continuation: dict[str, set] = defaultdict(set)
    for sentence in sentences:
        words = [BOS] + sentence.split() + [EOS]
        for i in range(1, len(words)):
            continuation[words[i]].add(words[i - 1])
            for n in range(2, min(order, i + 1) + 1):
                counts[n][tuple(words[i - n + 1:i + 1])] += 1
    total = sum(len(v) for v in continuation.values())
    unigram = {(w,): len(v) / total * (1 - 10 ** UNK_LOG10) for w, v in continuation.items()}
    probs: list[dict[tuple[str, ...], float]] = [{}, unigram]
    backoffs: dict[tuple[str, ...], float] = {}
    for n in range(2, order + 1):
        totals: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0])
        for gram, c in counts[n].items():
            totals[gram[:-1]][0] += c
            totals[gram[:-1]][1] += 1
        for history, (seen, distinct) in totals.items():
            backoffs[history] = discount * distinct / seen
        probs.append({})
        for gram, c in counts[n].items():
            seen, _ = totals[gram[:-1]]
            lower = _interpolated(gram[1:], probs, backoffs)
            probs[n][gram] = (c - discount) / seen + backoffs[gram[:-1]] * lower
    probs[1][(BOS,)] = 0.0
    probs[1][(UNK,)] = 10 ** UNK_LOG10
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("\\data\\\n" + "".join(f"ngram {n}={len(probs[n])}\n" for n in range(1, order + 1)))
        for n in range(1, order + 1):
            f.write(f"\n\\{n}-grams:\n")
            for gram, p in sorted(probs[n].items()):
                log_p = math.log10(p) if p > 0 else -99.0
                bow = f"\t{math.log10(backoffs[gram]):.4f}" if n < order and gram in backoffs else ""
                f.write(f"{log_p:.4f}\t{' '.join(gram)}{bow}\n")
        f.write("\n\\end\\\n")
    return {f"{n}-grams": len(probs[n]) for n in range(1, order + 1)}


def _interpolated(gram: tuple[str, ...], probs: list[dict], backoffs: dict) -> float:
    """P(gram[-1] | gram[:-1]) of the model built so far (lower orders only)."""
    if len(gram) == 1:
        return probs[1].get(gram, 10 ** UNK_LOG10)
    if gram in probs[len(gram)]:
        return probs[len(gram)][gram]
    return backoffs.get(gram[:-1], 1.0) * _interpolated(gram[1:], probs, backoffs)
