"""Caller turns with real mid-turn pauses, made by joining clips of one real speaker.

    python -m bench.real_turns --data ../shared/speech/real-dev --out data/real-turns [--seed 1]
    python -m engine.bench stt --data data/real-turns --json

The real-dev clips are single sentences: no turn in them pauses, so they cannot show whether
a recognizer takes a breath for the end of a turn. Here the clips of each speaker (the
`speaker` column of SOURCES.tsv) are cut to their speech (Silero VAD, 50 ms margin) and
joined, two or three to a turn, with pauses of PAUSE_S between them, as a caller who stops
to think. Each turn is written as the STT benchmark reads it: NAME.wav, NAME.txt (the
references joined) and NAME.json with the speech spans and the pauses (sample_rate 16000),
so `engine.bench stt` times the end of turn from where the speech really ends and counts
turn ends taken at the pauses (false_eot_pause_rate). Generated data: not for git, and,
like real-dev, for measuring only.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from engine.vad import SileroVad, WINDOW
from engine.wavfile import read_wav, write_wav

SAMPLE_RATE = 16000
PAUSE_S = (0.4, 0.8)  # a mid-turn pause: a breath, a thought (the range engine.train.eval_set writes)
MARGIN_S = 0.05  # kept either side of the detected speech
SPEECH = 0.5  # Silero P(speech) of a speech window
NOISE_FLOOR = 3e-4  # the pauses are not digital silence: a quiet line's hiss


def speech_span(audio: np.ndarray, vad: SileroVad) -> tuple[int, int]:
    """[first, last) sample of speech in a clip, with MARGIN_S either side."""
    probs = vad.stream().push(audio)
    speech = [k for k, p in enumerate(probs) if p >= SPEECH]
    if not speech:
        return 0, len(audio)
    margin = int(MARGIN_S * SAMPLE_RATE)
    return max(0, speech[0] * WINDOW - margin), min(len(audio), (speech[-1] + 1) * WINDOW + margin)


def speakers(folder: Path) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = defaultdict(list)
    with open(folder / "SOURCES.tsv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            wav = folder / row["file"]
            if wav.exists() and wav.with_suffix(".txt").exists():
                groups[row["speaker"]].append(wav)
    return groups


def build(folder: Path, out: Path, seed: int) -> int:
    rng = random.Random(seed)
    vad = SileroVad()
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for speaker, clips in sorted(speakers(folder).items()):
        clips = sorted(clips)
        while len(clips) >= 2:
            take = 3 if len(clips) in (3, 5) or len(clips) >= 6 else 2
            turn, clips = clips[:take], clips[take:]
            write_turn(turn, out / f"turn{written:02d}", vad, rng)
            written += 1
    return written


def write_turn(clips: list[Path], name: Path, vad: SileroVad, rng: random.Random) -> None:
    pieces, spans, pauses, texts, at = [], [], [], [], 0
    noise = np.random.default_rng(rng.randrange(1 << 30))
    for i, wav in enumerate(clips):
        audio = read_wav(wav, SAMPLE_RATE)
        first, last = speech_span(audio, vad)
        if i:
            gap = int(rng.uniform(*PAUSE_S) * SAMPLE_RATE)
            pieces.append((noise.standard_normal(gap) * NOISE_FLOOR).astype(np.float32))
            pauses.append([at, at + gap])
            at += gap
        pieces.append(audio[first:last])
        spans.append([at, at + last - first])
        at += last - first
        texts.append(wav.with_suffix(".txt").read_text(encoding="utf-8").strip())
    write_wav(name.with_suffix(".wav"), np.concatenate(pieces), SAMPLE_RATE)
    name.with_suffix(".txt").write_text(" ".join(texts) + "\n", encoding="utf-8")
    name.with_suffix(".json").write_text(json.dumps({"spans": spans, "pauses": pauses, "sample_rate": SAMPLE_RATE,
                                                     "clips": [c.name for c in clips]}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_turns", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/speech/real-dev")
    parser.add_argument("--out", default="data/real-turns")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    n = build(Path(args.data), Path(args.out), args.seed)
    print(json.dumps({"turns": n, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
