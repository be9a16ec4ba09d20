"""Train the pause head (engine/pause_head.py): P(end of turn) from Whisper's encoding at a pause.

    python -m engine.train.pause_data --out data/pause-turns --n 1200
    python -m engine.train.train_pause_head --data data/pause-turns [--out engine/weights/pause_head.safetensors]

Examples are made as the recognizer meets them (engine/whisper_stream.py): the VAD runs over
each turn, and every time it hears the speech stop, the turn so far (from PRE_ROLL_S before
its first speech) is what the pause reading reads and the head hears. A stop at the turn's
last speech is an end (1), any other a mid-turn pause (0). Features are pooled from the
encoding of its last pause_head.WINDOW_S (pause_head.features), standardized; the head is an
L2-regularised logistic regression (L-BFGS: a few thousand examples, 1152 features),
its regularisation the one of L2_GRID with the best held-out AUC. Each file's features are
cached beside it (CACHE_SUFFIX), so more data costs only its own encodings.

Every VALIDATION_EVERY-th file is held out; the threshold is the lowest P at which at most
MAX_PAUSE_CALLS of the held-out mid-turn pauses would be called ends. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine.pause_head import SHIPPED_WEIGHTS, PauseHead, features
from engine.vad import SPEECH_OFF, SPEECH_ON, WINDOW, SileroVad
from engine.wavfile import read_wav
from engine.whisper import SAMPLE_RATE, WhisperReader
from engine.whisper_stream import PRE_ROLL_S

VALIDATION_EVERY = 7
MAX_PAUSE_CALLS = 0.04  # of mid-turn pauses the head alone may call ends (the target allows 5 %)
END_TOLERANCE_S = 0.15  # the VAD flags a stop up to this long before the last span's end sample
L2_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)  # regularisation tried; the best held-out AUC is kept
MAX_ITERATIONS = 500
NOISE_DBFS = (-75.0, -45.0)  # a line's noise floor, drawn per file: a quiet line to a noisy one
CACHE_SUFFIX = ".pause.npz"  # each file's features beside it: the slow part (one encoding per pause)


def pause_windows(audio: np.ndarray, spans: list, vad: SileroVad) -> list[tuple[np.ndarray, int]]:
    """(the turn's audio up to each stop the VAD hears, label) for one file."""
    probs = vad.stream().push(audio)
    last_end = spans[-1][1]
    out, speaking, start = [], False, None
    for k, p in enumerate(probs):
        at = k * WINDOW
        if not speaking and p >= SPEECH_ON:
            speaking = True
            start = max(0, at - int(PRE_ROLL_S * SAMPLE_RATE)) if start is None else start
        elif speaking and p < SPEECH_OFF:
            speaking = False
            stop = min(len(audio), at + WINDOW)
            out.append((audio[start:stop], int(at >= last_end - END_TOLERANCE_S * SAMPLE_RATE)))
            if at >= last_end - END_TOLERANCE_S * SAMPLE_RATE:
                break
    return out


def with_line_noise(audio: np.ndarray, seed: int) -> np.ndarray:
    """The synthetic turn under a noise floor of NOISE_DBFS: its pauses and tail are digital
    zeros, its ends trimmed by the synthesizer, and a head would learn those instead of voices."""
    rng = np.random.default_rng([seed, 11])
    level = 10 ** (rng.uniform(*NOISE_DBFS) / 20)
    return (audio + rng.standard_normal(len(audio)) * level).astype(np.float32)


def examples(folder: Path, reader: WhisperReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features [N, F], labels [N], validation mask [N]) over every file of the folder."""
    vad = SileroVad()
    rows, labels, held = [], [], []
    for k, meta in enumerate(sorted(folder.glob("*.json"))):  # (written last: the file is whole)
        wav, cache = meta.with_suffix(".wav"), meta.with_suffix(CACHE_SUFFIX)
        if not cache.exists():
            spans = json.loads(meta.read_text())["spans"]
            pairs = pause_windows(with_line_noise(read_wav(wav, SAMPLE_RATE), k), spans, vad)
            np.savez(cache, x=np.stack([features(reader, window) for window, _ in pairs]),
                     y=np.array([label for _, label in pairs], np.float32))
        saved = np.load(cache)
        rows.append(saved["x"])
        labels.append(saved["y"])
        held += [k % VALIDATION_EVERY == 0] * len(saved["y"])
    return np.concatenate(rows), np.concatenate(labels), np.array(held)


def fit(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """Logistic regression weights and bias (L-BFGS), classes weighted equally."""
    inputs, targets = torch.from_numpy(x).double(), torch.from_numpy(y).double()
    weights = torch.where(targets > 0.5, 0.5 / max(1.0, float(y.sum())), 0.5 / max(1.0, float((1 - y).sum())))
    w, b = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True), torch.zeros(1, dtype=torch.float64,
                                                                                          requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=MAX_ITERATIONS, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        logits = inputs @ w + b
        value = (weights * F.binary_cross_entropy_with_logits(logits, targets, reduction="none")).sum()
        value = value + l2 / (2 * len(y)) * w.dot(w)
        value.backward()
        return value

    optimizer.step(loss)
    return w.detach().numpy().astype(np.float32), float(b.detach())


def auc(p: np.ndarray, y: np.ndarray) -> float:
    pos, neg = p[y > 0.5], p[y < 0.5]
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/pause-turns")
    p.add_argument("--out", default=str(SHIPPED_WEIGHTS))
    a = p.parse_args()
    started = time.time()
    torch.set_num_threads(1)
    x, y, held = examples(Path(a.data), WhisperReader(threads=1))
    mean, scale = x[~held].mean(axis=0), x[~held].std(axis=0) + 1e-6
    z = ((x - mean) / scale).astype(np.float64)  # one dtype: a float32 @ float64 product skips BLAS
    fits = {l2: fit(z[~held], y[~held], l2) for l2 in L2_GRID}
    aucs = {l2: auc(1 / (1 + np.exp(-(z[held] @ w + b))), y[held]) for l2, (w, b) in fits.items()}
    l2 = max(aucs, key=aucs.get)
    w, b = fits[l2]
    prob = 1 / (1 + np.exp(-(z @ w + b)))
    pauses = np.sort(prob[held & (y < 0.5)])
    threshold = float(pauses[int(np.ceil((1 - MAX_PAUSE_CALLS) * len(pauses))) - 1]) + 1e-6 if len(pauses) else 0.5
    ends = prob[held & (y > 0.5)]
    info = {"data": a.data, "examples": int(len(y)), "train": int((~held).sum()), "validation": int(held.sum()),
            "ends": int(y.sum()), "pauses": int((y < 0.5).sum()),
            "l2": l2, "validation_auc_by_l2": {str(k): round(v, 4) for k, v in aucs.items()},
            "validation_auc": round(auc(prob[held], y[held]), 4), "train_auc": round(auc(prob[~held], y[~held]), 4),
            "threshold": round(threshold, 4),
            "validation_pauses_called": round(float((pauses >= threshold).mean()), 4) if len(pauses) else None,
            "validation_ends_called": round(float((ends >= threshold).mean()), 4) if len(ends) else None,
            "seconds": round(time.time() - started, 1)}
    PauseHead(mean.astype(np.float32), scale.astype(np.float32), w, b, threshold, info).save(Path(a.out))
    print(json.dumps({**info, "out": a.out}))


if __name__ == "__main__":
    main()
