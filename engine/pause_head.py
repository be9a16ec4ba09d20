"""Does the caller's voice sound finished? A small head on Whisper's encoder, asked at each pause.

    the last WINDOW_S of a pause reading's audio ─► Whisper encoder ─► the last POOLS of its
      positions, each averaged ─► logistic regression ─► P(end of turn)

The words of a pause reading cannot tell "My order number is 4 7 1." (and a pause before the
rest) from a finished turn, and Parley's SSM head, trained on synthetic voices, hears real
voices' ends poorly (MODEL_CARD.md). Whisper's encoder was trained on 680k hours of real
speech: its last positions before a pause carry how the voice stopped (a fall, a lengthened
last syllable, a breath). The head sees a fixed WINDOW_S (silence in front of a shorter turn):
Whisper's encodings carry their position, and on whole turns a head learned "long windows
end turns" instead of how voices end. One extra encoding of WINDOW_S per pause: ~20 ms.

Trained by engine/train/train_pause_head.py on synthetic turns whose mid-turn pauses are
breaks the voice made itself inside one utterance (engine/train/pause_data.py), never on
real-dev. The weights ship in engine/weights/pause_head.safetensors (a few KB).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

SHIPPED_WEIGHTS = Path(__file__).parent / "weights" / "pause_head.safetensors"
SAMPLE_RATE = 16000
POSITION_S = 0.02  # one encoder position: 20 ms
WINDOW_S = 2.0  # the audio the head hears, up to the pause
POOLS = ((0.0, 0.2), (0.2, 0.6), (0.6, 1.2))  # seconds before the window's end, each averaged


def head_window(audio: np.ndarray) -> np.ndarray:
    """The last WINDOW_S of `audio`, silence in front when it is shorter."""
    size = int(WINDOW_S * SAMPLE_RATE)
    tail = audio[-size:]
    return np.concatenate([np.zeros(size - len(tail), np.float32), tail.astype(np.float32, copy=False)])


def pooled_features(encoding: np.ndarray, positions: int) -> np.ndarray:
    """[len(POOLS) * width] from the first `positions` rows of an encoding [1 or none, T, width]
    (the window's own positions, not the silence tail after them)."""
    window = encoding.reshape(-1, encoding.shape[-1])[:positions]
    parts = []
    for near, far in POOLS:
        lo, hi = max(0, positions - round(far / POSITION_S)), max(1, positions - round(near / POSITION_S))
        part = window[lo:hi] if hi > lo else window[-1:]
        parts.append(part.mean(axis=0))
    return np.concatenate(parts).astype(np.float32)


def features(reader, audio: np.ndarray) -> np.ndarray:
    """What the head weighs: the pooled encoding of head_window(audio)."""
    window = head_window(audio)
    return pooled_features(reader.encode(window), reader.positions(window))


class PauseHead:
    """P(end of turn) from a pause reading's encoding; `threshold`: at or above it the head
    calls the end (chosen on the training data's validation split, stored with the weights)."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, weight: np.ndarray, bias: float, threshold: float,
                 info: Optional[dict] = None) -> None:
        self.mean, self.scale, self.weight, self.bias = mean, scale, weight, float(bias)
        self.threshold = float(threshold)
        self.info = info or {}

    def probability(self, reader, audio: np.ndarray) -> float:
        """P(end) for a pause after `audio` (16 kHz, the turn so far); `reader`: a
        engine.whisper.WhisperReader, whose encoder it uses."""
        x = (features(reader, audio) - self.mean) / self.scale
        return float(1.0 / (1.0 + np.exp(-(x @ self.weight + self.bias))))

    def calls_end(self, reader, audio: np.ndarray) -> bool:
        return self.probability(reader, audio) >= self.threshold

    def save(self, path: Path) -> None:
        from safetensors.numpy import save_file

        save_file({"mean": self.mean, "scale": self.scale, "weight": self.weight,
                   "bias": np.array([self.bias], np.float32), "threshold": np.array([self.threshold], np.float32)},
                  str(path), metadata={"info": json.dumps(self.info), "pools": json.dumps(POOLS),
                                       "window_s": json.dumps(WINDOW_S)})


def load_pause_head(path: Path = SHIPPED_WEIGHTS) -> PauseHead:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata() or {}
    if json.loads(meta.get("pools", "null")) != [list(p) for p in POOLS] or json.loads(meta.get("window_s", "0")) != WINDOW_S:
        raise ValueError(f"{path}: trained on other features than {WINDOW_S} s pooled by {POOLS}")
    return PauseHead(tensors["mean"], tensors["scale"], tensors["weight"], float(tensors["bias"][0]),
                     float(tensors["threshold"][0]), json.loads(meta.get("info", "{}")))
