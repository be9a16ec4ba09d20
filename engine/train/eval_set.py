"""Held-out STT evaluation folders: voices and sentences never used for training.

    python -m engine.train.eval_set --out data/stt-eval --n 40
    python -m engine.bench stt --data data/stt-eval/kokoro_jf_nezumi --json

One folder per held-out voice group (voices.heldout_groups): NAME.wav (16 kHz mono
int16), NAME.txt (normalized reference) and NAME.json (speaker, speech spans in samples,
mid-turn pauses) so a benchmark can also score end-of-turn timing and false end-of-turn
on the 400-800 ms mid-turn pauses. Texts come only from the corpus' test split. The
`seen_voices` folder puts training speakers on the same test texts, to separate
"new voice" from "new sentence" in the error rates.
"""

import argparse
import json
import os
import wave

import numpy as np

from engine.train import voices
from engine.train.corpus import SEED, build_corpus, split_corpus
from engine.train.synth import ENGINES, render

SAMPLE_RATE = voices.SAMPLE_RATE   # Hz
N_PER_GROUP = 40
EVAL_PAUSE_RANGE = (0.4, 0.8)      # s, the mid-turn pauses the false end-of-turn target names
EVAL_TAIL_RANGE = (1.5, 1.5)       # s after the last word: room for a late end-of-turn
EVAL_P_PAUSE = 0.7


def write_wav(path: str, x: np.ndarray, sr: int = SAMPLE_RATE) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(np.clip(x * 32767, -32768, 32767).astype(np.int16).tobytes())


def seen_speakers(n: int, seed: int) -> list[voices.Speaker]:
    """n training-pool speakers, spread over the engines."""
    rng = np.random.default_rng([seed, 3])
    out = []
    for i in range(n):
        pool = voices.training_speakers(ENGINES[i % len(ENGINES)])
        out.append(pool[int(rng.integers(len(pool)))])
    return out


def build(out: str, n: int = N_PER_GROUP, seed: int = SEED, groups=None) -> dict:
    """Write every group folder (skipping finished ones); return {group: count}."""
    _, test = split_corpus(build_corpus(seed))
    rng = np.random.default_rng([seed, 4])
    order = rng.permutation(len(test))
    texts = [test[i] for i in order]
    all_groups = voices.heldout_groups() | {"seen_voices": seen_speakers(8, seed)}
    synth = voices.Engines()
    counts = {}
    for g, speakers in all_groups.items():
        if groups and g not in groups:
            continue
        folder = os.path.join(out, g)
        os.makedirs(folder, exist_ok=True)
        for i in range(n):
            name = f"{g}-{i:03d}"
            if os.path.exists(os.path.join(folder, name + ".json")):
                continue
            # Every group reads the same texts: differences between groups are the voices'.
            utt, sp = texts[i % len(texts)], speakers[i % len(speakers)]
            assert voices.is_heldout(sp) == (g != "seen_voices"), sp
            x, spans, groups_ = render(synth, sp, utt.segments, np.random.default_rng([seed, 5, i]),
                                       EVAL_P_PAUSE, EVAL_PAUSE_RANGE, EVAL_TAIL_RANGE)
            write_wav(os.path.join(folder, name + ".wav"), x)
            with open(os.path.join(folder, name + ".txt"), "w") as f:
                f.write(utt.text + "\n")
            pauses = [[a[1], b[0]] for a, b in zip(spans, spans[1:])]
            with open(os.path.join(folder, name + ".json"), "w") as f:
                json.dump({"speaker": sp.id, "engine": sp.engine, "spans": spans, "pauses": pauses,
                           "groups": groups_, "sample_rate": SAMPLE_RATE}, f)
        counts[g] = n
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/stt-eval")
    p.add_argument("--n", type=int, default=N_PER_GROUP, help="utterances per group")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--groups", nargs="*", help="only these groups")
    a = p.parse_args()
    print(json.dumps(build(a.out, a.n, a.seed, a.groups)))


if __name__ == "__main__":
    main()
