"""Call recordings: what the recognizer's side of a call was given, for replay offline.

With `record_dir` set, each conversation writes one 16 kHz stereo WAV: the left channel is
the caller's audio as the jitter buffer delivered it (before echo suppression), the right
channel is Parley's own output as the echo suppressor lined it up against that frame. The
pair is exactly what `EchoSuppressor.process` consumed, so `parley replay` (gateway/replay.py)
can run the suppressor and the recognizer over a live call again, frame for frame, and try other
settings or weights on it. Recordings hold the caller's voice: opt-in, and the operator's
to protect.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Optional

import numpy as np

from .echo_suppressor import SAMPLE_RATE


class CallRecording:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._wav: Optional[wave.Wave_write] = wave.open(str(path), "wb")
        self._wav.setnchannels(2)
        self._wav.setsampwidth(2)
        self._wav.setframerate(SAMPLE_RATE)

    def write(self, inbound: np.ndarray, reference: np.ndarray) -> None:
        """One inbound frame and the reference frame the suppressor aligned with it (int16)."""
        if self._wav is None:
            return
        frames = np.stack([inbound.astype(np.int16), reference.astype(np.int16)], axis=1)
        self._wav.writeframes(frames.astype("<i2").tobytes())

    @property
    def closed(self) -> bool:
        return self._wav is None

    def close(self) -> None:
        if self._wav is not None:
            self._wav.close()
            self._wav = None


def read_recording(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """A call recording -> (inbound, reference), int16 at 16 kHz, equal lengths."""
    with wave.open(str(path), "rb") as wav:
        if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (2, 2, SAMPLE_RATE):
            raise ValueError(f"{path}: not a Parley call recording (16 kHz, 16-bit, 2 channels)")
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    return samples[:, 0].copy(), samples[:, 1].copy()
