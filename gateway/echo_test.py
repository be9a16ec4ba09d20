"""Echo-test mode: the caller hears their own audio after a fixed delay.

The standard telephony diagnostic: it exercises the whole media path (browser capture,
Opus, RTP, Parley's jitter buffer, the 16 kHz engine-side frames, the pacer, Opus back)
without any speech recognition or synthesis.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Deque

import numpy as np

from .jitter import FRAME_MS, SAMPLE_RATE
from .opus import OpusDecoder, OpusEncoder, OpusError
from .pacer import SAMPLE_RATE as PACER_RATE
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

    async def run(self) -> None:
        """Nothing to do besides on_audio: the delay line runs on the playout clock."""

    def close(self) -> None:
        self._frames.clear()


WARM_UP_FRAMES = 10  # 200 ms of tone through the encoder and back: proves libopus loads and runs
WARM_UP_TONE_HZ = 440.0


def _opus_round_trip() -> None:
    """Encode and decode WARM_UP_FRAMES frames at 48 kHz; raise if anything comes back wrong."""
    encoder, decoder = OpusEncoder(PACER_RATE), OpusDecoder(PACER_RATE)
    frame = PACER_RATE * FRAME_MS // 1000
    t = np.arange(frame * WARM_UP_FRAMES) / PACER_RATE
    pcm = (np.sin(2 * np.pi * WARM_UP_TONE_HZ * t) * 8000).astype(np.int16)
    for chunk in pcm.reshape(WARM_UP_FRAMES, frame):
        decoded = decoder.decode(encoder.encode(chunk))
        if len(decoded) != frame:
            raise OpusError(f"warm-up decoded {len(decoded)} samples, expected {frame}")


async def warm_up() -> None:
    """Echo-test's warm-up: an Opus round trip, off the event loop."""
    await asyncio.get_running_loop().run_in_executor(None, _opus_round_trip)
