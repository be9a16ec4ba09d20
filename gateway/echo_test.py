"""Echo-test mode: the caller hears their own audio after a fixed delay.

The standard telephony diagnostic: it exercises the whole media path (browser capture,
Opus, RTP, Parley's jitter buffer, the 16 kHz engine-side frames, the pacer, Opus back)
without any speech recognition or synthesis.
"""

from __future__ import annotations

from collections import deque
from typing import Deque

import numpy as np

from .jitter import FRAME_MS, SAMPLE_RATE
from .pacer import PacedAudioTrack


class EchoTest:
    """Delay line from the playout clock's 16 kHz frames to the pacer."""

    def __init__(self, pacer: PacedAudioTrack, delay_ms: int) -> None:
        self.pacer = pacer
        self.delay_ms = delay_ms
        self._frames: Deque[np.ndarray] = deque()
        self._depth = max(0, round(delay_ms / FRAME_MS))

    def on_audio(self, pcm: np.ndarray) -> None:
        self._frames.append(pcm)
        while len(self._frames) > self._depth:
            self.pacer.write(self._frames.popleft(), SAMPLE_RATE)

    def describe(self) -> dict:
        return {"mode": "echo-test", "echo_delay_ms": self.delay_ms,
                "note": "diagnostic: you hear your own audio; no speech recognition or synthesis"}
