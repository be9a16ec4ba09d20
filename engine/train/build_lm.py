"""Build the recognizer's word language model (engine/weights/lm.arpa.gz) from text.

    python -m engine.train.build_lm                          # the STT corpus's training texts
    python -m engine.train.build_lm --text my_calls.txt --out my.arpa.gz   # one sentence per line

The corpus's held-out texts (corpus.text_split == "test", which the held-out folders speak)
are never counted. Lines are reduced to what the recognizer spells (lowercase letters,
apostrophes, spaces), so write numbers as words ("two oh four"), as callers say them.
An ARPA file from any other tool (KenLM's lmplz) works as well: pass it as lm= to the
Recognizer, the Runtime or `python -m engine.bench stt --lm`.
"""

import argparse
import json
from pathlib import Path

from engine.lm import SHIPPED_LM, write_arpa
from engine.train.corpus import build_corpus, short_turn_corpus, split_corpus
from engine.stt import VOCAB

SPELLED = set(VOCAB[1:])


def spelled(line: str) -> str:
    """A line as the recognizer spells it: lowercase letters, apostrophes, single spaces."""
    return " ".join("".join(c if c in SPELLED else " " for c in line.lower()).split())


def corpus_sentences() -> list[str]:
    """The training split of the STT corpus and of its short turns, as spelled."""
    train, _ = split_corpus(build_corpus())
    short = [u for u in short_turn_corpus() if u.split == "train"]
    return [spelled(u.text) for u in train + short]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", help="one sentence per line (default: the STT training corpus)")
    parser.add_argument("--out", default=str(SHIPPED_LM))
    parser.add_argument("--order", type=int, default=3)
    args = parser.parse_args()
    if args.text:
        sentences = [spelled(line) for line in Path(args.text).read_text().splitlines()]
    else:
        sentences = corpus_sentences()
    sentences = [s for s in sentences if s]
    counts = write_arpa(sentences, Path(args.out), order=args.order)
    print(json.dumps({"out": args.out, "sentences": len(sentences), **counts}))


if __name__ == "__main__":
    main()
