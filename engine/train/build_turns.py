"""Build the turn-completion table (engine/weights/turns.json.gz, engine/turn.py).

    python -m engine.train.build_turns                               # the STT corpus's training texts
    python -m engine.train.build_turns --text my_calls.txt --out my.json.gz

With --text, one turn per line, " | " where the speaker paused and went on:
    my order number is | two six oh | four four one
The corpus's turns are split at their segments (the places the STT data may put a pause).
Its texts are distinct, which would make "Yes." one turn among seventy thousand while
"Yes, | my cell is..." recurs in many; so short complete answers are also counted as often
as the corpus's generator says callers give them (SHORT_TURNS samples, repeats kept).
Like the language model, words are spelled as the recognizer spells them, and the
corpus's held-out texts are never counted.
"""

import argparse
import json
import random
from pathlib import Path

from engine.turn import SHIPPED_TURNS, count_turns, write_turns
from engine.train.build_lm import spelled
from engine.train.corpus import SEED, build_corpus, short_turn, split_corpus
from engine.textnorm import normalize

SHORT_TURNS = 20_000  # about a fifth of the turns counted


def corpus_turns() -> list[list[list[str]]]:
    """The training split of the STT corpus and sampled short turns, as stretches of words."""
    train, _ = split_corpus(build_corpus())
    rng = random.Random(SEED + 7)
    short = [short_turn(rng) for _ in range(SHORT_TURNS)]
    utterances = train + [u for u in short if u.split == "train"]
    return [[spelled(normalize(segment)).split() for segment in u.segments] for u in utterances]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", help="one turn per line, ' | ' at each mid-turn pause")
    parser.add_argument("--out", default=str(SHIPPED_TURNS))
    args = parser.parse_args()
    if args.text:
        lines = Path(args.text).read_text().splitlines()
        turns = [[spelled(stretch).split() for stretch in line.split("|")] for line in lines if line.strip()]
    else:
        turns = corpus_turns()
    contexts = write_turns(count_turns(turns), Path(args.out))
    print(json.dumps({"out": args.out, "turns": len(turns), "contexts": contexts}))


if __name__ == "__main__":
    main()
