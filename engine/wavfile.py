"""Reading WAV files of any sample rate into the engine's 16 kHz mono float32."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


class AudioFormatError(ValueError):
    """The file is not a PCM WAV the engine can read; the message says why."""


def read_wav(path: Path | str, rate: int = 16000) -> np.ndarray:
    """Mono float32 in [-1, 1] at `rate` (channels averaged, linear-phase resampling)."""
    try:
        with wave.open(str(path), "rb") as f:
            channels, width, source_rate = f.getnchannels(), f.getsampwidth(), f.getframerate()
            raw = f.readframes(f.getnframes())
    except (wave.Error, EOFError) as exc:
        raise AudioFormatError(f"{path}: not a PCM WAV file ({exc})") from None
    if width == 2:
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 4:
        samples = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    elif width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    else:
        raise AudioFormatError(f"{path}: unsupported sample width {width} bytes")
    if channels > 1:
        samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(axis=1)
    return resample(samples, source_rate, rate)


def resample(samples: np.ndarray, source_rate: int, rate: int) -> np.ndarray:
    """Band-limited resampling through PyAV's swresample (already a dependency)."""
    if source_rate == rate or len(samples) == 0:
        return samples.astype(np.float32)
    import av

    frame = av.AudioFrame.from_ndarray(samples.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def write_wav(path: Path | str, samples: np.ndarray, rate: int) -> None:
    """Write mono 16-bit PCM; float input is taken as [-1, 1] and clipped."""
    if samples.dtype != np.int16:
        samples = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.tobytes())
