"""Test signals and how to find them again in recorded audio."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def chirp_sequence(rate: int, chirps: int = 6, chirp_s: float = 0.25, gap_s: float = 0.25,
                   lead_s: float = 0.3, tail_s: float = 0.5, amplitude: float = 0.5) -> np.ndarray:
    """float32 mono: `chirps` rising sweeps (300 Hz -> 3 kHz, each a little different), with gaps."""
    parts = [np.zeros(int(lead_s * rate), dtype=np.float32)]
    t = np.arange(int(chirp_s * rate)) / rate
    for k in range(chirps):
        f0, f1 = 300.0 + 60 * k, 3000.0 - 150 * k
        phase = 2 * np.pi * (f0 * t + (f1 - f0) * t ** 2 / (2 * chirp_s))
        envelope = np.minimum(1.0, np.minimum(t, chirp_s - t) / 0.01)  # 10 ms fades
        parts.append((amplitude * envelope * np.sin(phase)).astype(np.float32))
        parts.append(np.zeros(int(gap_s * rate), dtype=np.float32))
    parts.append(np.zeros(int(tail_s * rate), dtype=np.float32))
    return np.concatenate(parts)


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    pcm = np.clip(samples * 32767, -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


def resample(samples: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Linear-interpolation resampling; plenty for finding a 300 Hz-3 kHz signal."""
    if src == dst:
        return samples.astype(np.float32)
    n = int(len(samples) * dst / src)
    return np.interp(np.arange(n) * src / dst, np.arange(len(samples)), samples).astype(np.float32)


def find_signal(reference: np.ndarray, recorded: np.ndarray) -> tuple[int, float]:
    """(offset in samples of `reference` inside `recorded`, normalized correlation there)."""
    if len(recorded) < len(reference):
        recorded = np.concatenate([recorded, np.zeros(len(reference) - len(recorded), dtype=np.float32)])
    n = 1 << int(np.ceil(np.log2(len(recorded) + len(reference))))
    spectrum = np.fft.rfft(recorded, n) * np.conj(np.fft.rfft(reference, n))
    correlation = np.fft.irfft(spectrum, n)[: len(recorded) - len(reference) + 1]
    offset = int(np.argmax(correlation))
    segment = recorded[offset: offset + len(reference)]
    denominator = float(np.linalg.norm(reference) * np.linalg.norm(segment)) or 1.0
    return offset, float(correlation[offset] / denominator)
