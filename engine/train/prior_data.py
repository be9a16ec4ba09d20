"""Distillation targets for the streaming voice: Piper joe's prior mean and durations per id.

    nohup nice -n 5 .venv/bin/python -m engine.train.prior_data --utterances 40000 > runs/prior-data.out 2>&1 &

The streaming TTS (engine/tts.py) predicts, for each phoneme id, what Piper's text encoder
would: its prior mean m_p (192 values) and its duration in frames, both without sampling
noise (engine/piper.py, TeacherPrior). Piper's own flow and decoder turn those into audio at
run time, so no audio is synthesized here: an utterance costs a few milliseconds, not a
second. Texts and the held-out rule are engine/train/tts_texts.py's: a text whose
hash falls in the test split is never written. Piper encodes a sentence at a time, so the
targets are made sentence by sentence over the same ids the student sees for the whole text.

Shards of SHARD_SIZE utterances go to data/tts-prior/shard_NNNNN.npz; a finished shard is never
rewritten, so a restart resumes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from engine import text as frontend
from engine.piper import TeacherPrior
from engine.train.tts_texts import SEED, _sentences, texts

OUT = "data/tts-prior"
SHARD_SIZE = 500


def utterance(teacher: TeacherPrior, spoken: str) -> dict:
    """Normalized text -> {"ids", "prior" [L, 192] float16, "durations" [L]}."""
    phrase, _ = frontend.phonemize(spoken)
    ids = np.array(phrase.ids, dtype=np.int64)
    means, durations = [], []
    for sentence in _sentences(ids):
        mean, frames = teacher(sentence.tolist())
        means.append(mean.T)
        durations.append(frames)
    return {"ids": ids, "prior": np.concatenate(means).astype(np.float16), "durations": np.concatenate(durations)}


def write_shard(path: Path, items: list[dict]) -> None:
    lengths = np.array([len(item["ids"]) for item in items])
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, lengths=lengths, ids=np.concatenate([i["ids"] for i in items]),
             prior=np.concatenate([i["prior"] for i in items]),
             durations=np.concatenate([i["durations"] for i in items]))
    tmp.rename(path)


def read_shard(path: Path) -> list[dict]:
    data = np.load(path)
    cuts = np.cumsum(data["lengths"])[:-1]
    return [{"ids": ids, "prior": prior, "durations": durations}
            for ids, prior, durations in zip(np.split(data["ids"], cuts), np.split(data["prior"], cuts),
                                             np.split(data["durations"], cuts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--utterances", type=int, default=40000)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    teacher = TeacherPrior()
    for shard in range((args.utterances + SHARD_SIZE - 1) // SHARD_SIZE):
        path = out / f"shard_{shard:05d}.npz"
        if path.exists():
            continue
        started, items = time.time(), []
        # each shard draws its own texts, so a resumed run writes what a whole run would
        for spoken, split in texts(SEED + 1000 * shard):
            if split == "train" and len(frontend.spoken_words(spoken)) > 0:
                items.append(utterance(teacher, spoken))
            if len(items) == SHARD_SIZE:
                break
        write_shard(path, items)
        print(f"{path.name}: {len(items)} utterances, {sum(len(i['ids']) for i in items)} ids, "
              f"{time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
