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


def chirp_starts(rate: int, chirps: int = 6, chirp_s: float = 0.25, gap_s: float = 0.25,
                 lead_s: float = 0.3) -> list[tuple[int, int]]:
    """(start, length) in samples of each chirp inside chirp_sequence() with the same settings."""
    lead, chirp, gap = int(lead_s * rate), int(chirp_s * rate), int(gap_s * rate)
    return [(lead + k * (chirp + gap), chirp) for k in range(chirps)]


def match_chirps(reference: np.ndarray, recorded: np.ndarray, rate: int,
                 search_s: float = 0.15) -> list[tuple[float, float]]:
    """(delay in s, normalized correlation) of each chirp of `reference` found in `recorded`.

    Whole-signal correlation is fragile: a jitter buffer may drop or insert 20 ms of
    silence between chirps. So align coarsely once, then find every chirp on its own
    within +-search_s of where the coarse alignment puts it.
    """
    coarse, _ = find_signal(reference, recorded)
    window = int(search_s * rate)
    found = []
    for start, length in chirp_starts(rate):
        chirp = reference[start:start + length]
        lo = max(0, coarse + start - window)
        offset, ncc = find_signal(chirp, recorded[lo:lo + length + 2 * window])
        found.append(((lo + offset - start) / rate, ncc))
    return found


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


def _resonator(x: np.ndarray, freq: float, bandwidth: float, rate: int) -> np.ndarray:
    r = np.exp(-np.pi * bandwidth / rate)
    a1, a2 = 2 * r * np.cos(2 * np.pi * freq / rate), -r * r
    y = np.zeros_like(x)
    for i in range(2, len(x)):
        y[i] = x[i] + a1 * y[i - 1] + a2 * y[i - 2]
    return y


def voiced_speech(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """float32 vowel-like audio: a gliding 90-150 Hz glottal pulse train through three formants.

    Codecs treat it as speech (Opus's voice detector switches in-band FEC on for it),
    which a pure tone does not.
    """
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    pitch = 120 + 30 * np.sin(2 * np.pi * 2 * t)
    pulses = (np.diff(np.floor(np.cumsum(pitch / rate)), prepend=0) > 0).astype(np.float64)
    voice = (_resonator(pulses, 700, 100, rate) + 0.5 * _resonator(pulses, 1200, 120, rate)
             + 0.2 * _resonator(pulses, 2500, 200, rate))
    voice = voice / np.abs(voice).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return (0.35 * voice + rng.normal(0, 0.006, n)).astype(np.float32)
