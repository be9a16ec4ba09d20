"""Caller turns whose mid-turn pauses sound like pauses, for the pause head (engine/pause_head.py).

    python -m engine.train.pause_data --out data/pause-turns --n 1200 [--workers 1]

The STT corpus speaks each stretch between pauses as its own utterance (engine/train/synth.py),
so every pause there follows a sentence-final fall: a head trained on it cannot learn how a
voice that goes on sounds. Here a turn's whole text is spoken in one call, and the short
breaks the voice makes itself (at commas, between sentences, in digit groups) are stretched
to PAUSE_RANGE: the speech before each pause keeps the voice's own continuation (or, between
sentences, its fall). Breaks are found with Silero VAD, as the recognizer finds them.

Texts: the corpus's training split only; voices: the training speakers of every engine.
Written as engine.train.eval_set writes (NAME.wav 16 kHz, NAME.txt, NAME.json with the speech
spans and pauses), so `engine.bench stt` reads a folder of it too. Resumable: finished files
are skipped. Generated data: not for git.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from engine.train import voices
from engine.train.corpus import SEED, build_corpus, split_corpus
from engine.train.eval_set import write_wav
from engine.train.synth import ENGINES
from engine.vad import SileroVad, speech_breaks

SAMPLE_RATE = voices.SAMPLE_RATE
PAUSE_RANGE = (0.4, 0.8)  # s: the mid-turn pauses the end-of-turn target names
P_STRETCH = 0.8  # chance a break the voice made becomes a pause
MIN_BREAK_S = 0.09  # a break at least this long (3 VAD windows) is one the voice made on purpose
LEAD_S, TAIL_S = 0.3, 1.5


def stretch(audio: np.ndarray, gaps: list[tuple[int, int]], rng: np.random.Generator) -> tuple[np.ndarray, list, list]:
    """Audio with some breaks widened to PAUSE_RANGE -> (audio, speech spans, pauses), samples."""
    pieces = [np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)]
    at = span_start = len(pieces[0])
    spans, pauses, start = [], [], 0
    for a, b in gaps:
        if rng.random() >= P_STRETCH:
            continue
        middle = (a + b) // 2  # widened in its middle: the voice's own fade out and in stay
        pieces.append(audio[start:middle])
        at += middle - start
        extra = max(0, int(rng.uniform(*PAUSE_RANGE) * SAMPLE_RATE) - (b - a))
        pieces.append(np.zeros(extra, np.float32))
        quiet_from, at = at - (middle - a), at + extra
        spans.append([span_start, quiet_from])
        pauses.append([quiet_from, at + b - middle])
        span_start, start = at + b - middle, middle
    pieces.append(audio[start:])
    at += len(audio) - start
    spans.append([span_start, at])
    pieces.append(np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32))
    return np.concatenate(pieces), spans, pauses


def speaker(i: int, seed: int) -> voices.Speaker:
    """Turn i's voice: the engines take turns (Kokoro, the slowest, would otherwise speak most:
    its training pool is the largest), a speaker of the engine's training pool at random."""
    pool = voices.training_speakers(ENGINES[i % len(ENGINES)])
    return pool[int(np.random.default_rng([seed, 7, i]).integers(len(pool)))]


def build(out: str, n: int, seed: int = SEED, worker: int = 0, workers: int = 1) -> int:
    train, _ = split_corpus(build_corpus(seed))
    rng = np.random.default_rng([seed, 8])
    texts = [train[i] for i in rng.permutation(len(train))[:n]]
    synth, vad = voices.Engines(), SileroVad()
    os.makedirs(out, exist_ok=True)
    written = 0
    for i in range(worker, n, workers):
        name = os.path.join(out, f"turn-{i:05d}")
        if os.path.exists(name + ".json"):
            continue
        utterance, voice = texts[i], speaker(i, seed)
        audio = synth(voice, " ".join(utterance.segments))
        gaps = speech_breaks(audio, vad, MIN_BREAK_S)
        audio, spans, pauses = stretch(audio, gaps, np.random.default_rng([seed, 9, i]))
        write_wav(name + ".wav", audio)
        with open(name + ".txt", "w") as f:
            f.write(utterance.text + "\n")
        with open(name + ".json", "w") as f:
            json.dump({"speaker": voice.id, "engine": voice.engine, "spans": spans, "pauses": pauses,
                       "sample_rate": SAMPLE_RATE}, f)
        written += 1
        if written % 50 == 0:
            print(f"{written} turns written", flush=True)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/pause-turns")
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--worker", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    print(json.dumps({"written": build(a.out, a.n, a.seed, a.worker, a.workers), "out": a.out}))


if __name__ == "__main__":
    main()
