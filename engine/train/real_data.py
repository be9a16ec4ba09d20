"""Real recordings for STT training, in the same example format as the synthetic shards.

Two layouts are recognised under any root folder (searched recursively):
  - pairs: NAME.wav (or .flac/.mp3/.ogg/.opus/.m4a) next to NAME.txt holding its transcript;
  - LibriSpeech: SPK/CHAPTER/SPK-CHAPTER.trans.txt with lines "SPK-CHAPTER-UTT TEXT" and
    the audio in SPK-CHAPTER-UTT.flac beside it.

Recordings carry no word timings, so speech spans come from an energy detector, and a
stretch of the recording's own background noise is appended after the last word so the
end-of-turn label (2) has frames to live on. Train a production model on them with:

    python -m engine.train.train_stt --real_dirs=/data/LibriSpeech/train-clean-100,/data/calls --device=cuda
"""

import glob
import os
from dataclasses import dataclass

import numpy as np

from engine.textnorm import normalize

SAMPLE_RATE = 16000            # Hz
AUDIO_EXTS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")
VAD_FRAME = 160                # samples, 10 ms energy frames
VAD_DB = 35.0                  # dB below the loudest frame counts as silence
MIN_PAUSE = 0.3                # s; shorter silences inside speech stay speech
TAIL_RANGE = (0.4, 1.2)        # s of background noise appended after the last word


@dataclass(frozen=True)
class Item:
    audio: str
    text: str
    speaker: str


def find_items(root: str) -> list[Item]:
    """All (audio, transcript, speaker) items under root, in a stable order."""
    items = []
    for tp in sorted(glob.glob(os.path.join(root, "**", "*.trans.txt"), recursive=True)):
        folder = os.path.dirname(tp)
        with open(tp, encoding="utf-8") as f:
            for line in f:
                uid, _, text = line.strip().partition(" ")
                audio = _audio_for(os.path.join(folder, uid))
                if audio and text:
                    items.append(Item(audio, text, "real-" + uid.split("-")[0]))
    for tp in sorted(glob.glob(os.path.join(root, "**", "*.txt"), recursive=True)):
        if tp.endswith(".trans.txt"):
            continue
        audio = _audio_for(tp[:-4])
        if audio:
            with open(tp, encoding="utf-8") as f:
                text = f.read().strip()
            rel = os.path.relpath(os.path.dirname(tp), root)
            items.append(Item(audio, text, "real-" + (rel if rel != "." else os.path.basename(os.path.abspath(root)))))
    return items


def _audio_for(stem: str) -> str | None:
    for ext in AUDIO_EXTS:
        if os.path.isfile(stem + ext):
            return stem + ext
    return None


def load_audio(path: str, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Decode any audio file to float32 mono at sr (PyAV / ffmpeg)."""
    import av
    with av.open(path) as f:
        rs = av.AudioResampler(format="flt", layout="mono", rate=sr)
        out = [r.to_ndarray().reshape(-1) for fr in f.decode(audio=0) for r in rs.resample(fr)]
        out += [r.to_ndarray().reshape(-1) for r in rs.resample(None)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def speech_spans(x: np.ndarray) -> list[list[int]]:
    """[start, end) sample ranges of speech by frame energy; gaps < MIN_PAUSE are bridged."""
    n = len(x) // VAD_FRAME
    if n == 0:
        return []
    db = 10 * np.log10(np.mean(x[: n * VAD_FRAME].reshape(n, VAD_FRAME) ** 2, axis=1) + 1e-10)
    loud = db > db.max() - VAD_DB
    spans, start, gap = [], None, 0
    max_gap = int(MIN_PAUSE * SAMPLE_RATE / VAD_FRAME)
    for i, v in enumerate(loud):
        if v:
            if start is None:
                start = i
            gap = 0
        elif start is not None:
            gap += 1
            if gap >= max_gap:
                spans.append([start * VAD_FRAME, (i - gap + 1) * VAD_FRAME])
                start, gap = None, 0
    if start is not None:
        spans.append([start * VAD_FRAME, (n - gap) * VAD_FRAME])
    return spans


def background(x: np.ndarray, n: int) -> np.ndarray:
    """n samples of the recording's own quietest frames (its room tone)."""
    k = len(x) // VAD_FRAME
    if k == 0 or n <= 0:
        return np.zeros(max(n, 0), np.float32)
    frames = x[: k * VAD_FRAME].reshape(k, VAD_FRAME)
    quiet = frames[np.argsort(np.mean(frames ** 2, axis=1))[: max(1, k // 5)]].reshape(-1)
    return np.tile(quiet, n // len(quiet) + 1)[:n].astype(np.float32)


class RealRecordings:
    """Items found under several roots; `load` turns one into an example dict."""

    def __init__(self, roots):
        self.items = [it for r in roots for it in find_items(r)]

    def load(self, item: Item, rng: np.random.Generator | None = None) -> dict | None:
        rng = rng or np.random.default_rng(0)
        x = load_audio(item.audio)
        text = normalize(item.text)
        spans = speech_spans(x)
        if not spans or not text:
            return None
        x = np.concatenate([x, background(x, int(rng.uniform(*TAIL_RANGE) * SAMPLE_RATE))])
        return {"pcm": x, "spans": spans, "text": text, "speaker": item.speaker}

    def __iter__(self):
        for it in self.items:
            ex = self.load(it)
            if ex is not None:
                yield ex
