"""Caller turns with real mid-turn pauses, made by joining clips of one real speaker, or by
widening the breaks real speakers make inside a clip.

    python -m bench.real_turns --data ../shared/speech/real-dev --out data/real-turns [--seed 1]
    python -m bench.real_turns --inner --out data/real-inner
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

Joined clips pause between whole sentences, each ending as a finished turn would, so there
neither the words nor the voice can tell a pause from an end. `--inner` measures the other
kind, a caller who stops mid-sentence: every break of at least MIN_BREAK_S the VAD finds
inside a clip's speech is re-timed to PAUSE_S (its middle widened with noise at the break's
own level, or narrowed), so the voice before it keeps its real continuation.
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

from engine.vad import SPEECH_ON, SileroVad, WINDOW, speech_breaks
from engine.wavfile import read_wav, write_wav

SAMPLE_RATE = 16000
PAUSE_S = (0.4, 0.8)  # a mid-turn pause: a breath, a thought (the range engine.train.eval_set writes)
MARGIN_S = 0.05  # kept either side of the detected speech
NOISE_FLOOR = 3e-4  # the pauses are not digital silence: a quiet line's hiss


def speech_span(audio: np.ndarray, vad: SileroVad) -> tuple[int, int]:
    """[first, last) sample of speech in a clip, with MARGIN_S either side."""
    probs = vad.stream().push(audio)
    speech = [k for k, p in enumerate(probs) if p >= SPEECH_ON]
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


MIN_BREAK_S = 0.15  # a break inside a clip this long is one the speaker made (not a stop consonant)




def retime(quiet: np.ndarray, width: int, rng: random.Random) -> np.ndarray:
    """A break re-timed to `width` samples: its middle widened with noise at its own level, or
    cut out; its edges (the voice fading out and in) stay."""
    if width <= len(quiet):
        return np.concatenate([quiet[:width // 2], quiet[len(quiet) - (width - width // 2):]])
    level = float(np.sqrt(np.mean(quiet ** 2))) or NOISE_FLOOR
    filler = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(width - len(quiet)) * level
    middle = len(quiet) // 2
    return np.concatenate([quiet[:middle], filler.astype(np.float32), quiet[middle:]])


def build_inner(folder: Path, out: Path, seed: int) -> int:
    """One turn per real-dev clip that breaks inside its speech, its breaks re-timed to PAUSE_S."""
    rng, vad = random.Random(seed), SileroVad()
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for wav in sorted(folder.glob("*.wav")):
        audio = read_wav(wav, SAMPLE_RATE)
        first, last = speech_span(audio, vad)
        audio = audio[first:last]
        gaps = speech_breaks(audio, vad, MIN_BREAK_S)
        if not gaps:
            continue
        pieces, spans, pauses, at, start = [], [], [], 0, 0
        for a, b in gaps:
            quiet = retime(audio[a:b], int(rng.uniform(*PAUSE_S) * SAMPLE_RATE), rng)
            pieces += [audio[start:a], quiet]
            spans.append([at, at + a - start])
            pauses.append([at + a - start, at + a - start + len(quiet)])
            at += a - start + len(quiet)
            start = b
        pieces.append(audio[start:])
        spans.append([at, at + len(audio) - start])
        name = out / f"inner-{wav.stem}"
        write_wav(name.with_suffix(".wav"), np.concatenate(pieces), SAMPLE_RATE)
        name.with_suffix(".txt").write_text(wav.with_suffix(".txt").read_text(encoding="utf-8").strip() + "\n",
                                            encoding="utf-8")
        name.with_suffix(".json").write_text(json.dumps({"spans": spans, "pauses": pauses, "sample_rate": SAMPLE_RATE,
                                                         "clips": [wav.name]}) + "\n")
        written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_turns", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/speech/real-dev")
    parser.add_argument("--out", default="data/real-turns")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--inner", action="store_true", help="widen the breaks inside each clip instead of joining clips")
    args = parser.parse_args(argv)
    n = (build_inner if args.inner else build)(Path(args.data), Path(args.out), args.seed)
    print(json.dumps({"turns": n, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
