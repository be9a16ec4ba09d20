"""Inbound audio: RTP packets into Parley's jitter buffer, pulled by a 20 ms playout clock.

aiortc's RTCRtpReceiver parses, authenticates and counts RTP (RTCP receiver reports keep
working), then hands each packet to its jitter buffer. We swap that buffer for a thin
adapter that feeds Parley's JitterBuffer and returns nothing, so aiortc's own buffer and
decoder thread never run. A Playout task then pulls one frame every 20 ms on the
monotonic clock and hands 16 kHz mono frames to the call's audio sink.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional

import numpy as np

from .background import BackgroundTask
from .jitter import FRAME_MS, SAMPLE_RATE, JitterBuffer
from .opus import OpusDecoder

FRAME_S = FRAME_MS / 1000
MAX_CATCH_UP_FRAMES = 10  # after a stalled loop, pull at most this many frames at once

log = logging.getLogger(__name__)

AudioSink = Callable[[np.ndarray], None]  # one 20 ms frame of 16 kHz int16 mono


class _ReceiverHook:
    """Stands in for aiortc's audio JitterBuffer inside RTCRtpReceiver (same add() shape)."""

    def __init__(self, buffer: JitterBuffer, clock: Callable[[], float]) -> None:
        self._buffer = buffer
        self._clock = clock
        self.last_arrival: Optional[float] = None

    def add(self, packet: Any) -> tuple[bool, None]:
        self.last_arrival = self._clock()
        self._buffer.put(packet.sequence_number, packet.timestamp, bytes(packet.payload), self.last_arrival)
        return False, None


def attach_to_receiver(receiver: Any, buffer: JitterBuffer,
                       clock: Callable[[], float] = time.monotonic) -> _ReceiverHook:
    """Route an aiortc audio receiver's RTP packets into `buffer` (aiortc 1.16 internals)."""
    attribute = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, attribute):
        raise RuntimeError("this aiortc version has no audio jitter buffer to replace")
    hook = _ReceiverHook(buffer, clock)
    setattr(receiver, attribute, hook)
    return hook


async def stop_idle_decoder(receiver: Any) -> None:
    """Stop an attached receiver's decoder thread from a worker thread (aiortc 1.16 internals).

    The thread never gets a frame (the hook takes every packet), but RTCRtpReceiver.stop()
    joins it on the event loop: at hang-up the loop then waited until the thread had woken
    and won the GIL back from the engine's threads, a sixth of the HTTP handlers' time in a
    soak. Once joined here, stop() finds no thread left to join.
    """
    stop = getattr(receiver, "_RTCRtpReceiver__stop_decoder", None)
    if stop is not None:
        await asyncio.to_thread(stop)


class Playout(BackgroundTask):
    """Pulls the jitter buffer every 20 ms and delivers frames to a sink, drift-free."""

    def __init__(self, sink: AudioSink, clock: Callable[[], float] = time.monotonic,
                 buffer: Optional[JitterBuffer] = None) -> None:
        """`buffer`: the jitter buffer to pull (default: one for Opus at 48 kHz, a WebRTC call's)."""
        self.buffer = buffer or JitterBuffer(OpusDecoder(SAMPLE_RATE))
        self._sink = sink
        self._clock = clock
        self.frames_delivered = 0
        self.catch_up_frames = 0
        self._hook: Optional[_ReceiverHook] = None
        self._receiver: Any = None

    def attach(self, receiver: Any) -> None:
        self._hook = attach_to_receiver(receiver, self.buffer, self._clock)
        self._receiver = receiver

    async def detach(self) -> None:
        """Stop the playout and, off the event loop, the attached receiver's decoder thread."""
        await self.stop()
        if self._receiver is not None:
            await stop_idle_decoder(self._receiver)

    def attach_source(self) -> _ReceiverHook:
        """A packet sink for RTP that does not come through aiortc (the SIP bridge's own
        sockets): `hook.add(packet)` with a packet's sequence_number, timestamp and payload."""
        self._hook = _ReceiverHook(self.buffer, self._clock)
        return self._hook

    @property
    def last_packet_at(self) -> Optional[float]:
        """When the last RTP packet arrived (this playout's clock), or None before the first."""
        return self._hook.last_arrival if self._hook else None

    async def _run(self) -> None:
        start = self._clock()
        tick = 0
        while True:
            deadline = start + tick * FRAME_S
            delay = deadline - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            due = int((self._clock() - start) / FRAME_S) + 1 - tick
            if due > MAX_CATCH_UP_FRAMES:
                # The loop stalled for a long time: skip ahead rather than flood the sink.
                tick += due - MAX_CATCH_UP_FRAMES
                due = MAX_CATCH_UP_FRAMES
            for i in range(max(1, due)):
                if i:
                    # Catching up: one frame per step of this task, so a burst after a stall
                    # does not become one long callback that stalls the loop in turn.
                    await asyncio.sleep(0)
                frame = self.buffer.pull(self._clock())
                try:
                    self._sink(frame.pcm)
                except Exception:
                    log.exception("audio sink failed")
                self.frames_delivered += 1
                tick += 1
            if due > 1:
                self.catch_up_frames += due - 1
