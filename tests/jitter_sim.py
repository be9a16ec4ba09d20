"""Simulated networks for the jitter buffer: a sender, a lossy/jittery path, a playout clock."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np

from gateway.jitter import FRAME_MS, JitterBuffer, RTP_TICKS_PER_FRAME
from gateway.opus import OpusDecoder, OpusEncoder
from tests.kit.signals import voiced_speech

FRAME_S = FRAME_MS / 1000


def talk_spurts(n_frames: int, seed: int = 1) -> list[bytes]:
    """Opus packets of talk spurts: 1-3 s of voiced speech separated by 0.4-1.2 s of silence."""
    rng = random.Random(seed)
    encoder = OpusEncoder(48000)
    packets: list[bytes] = []
    voice = (voiced_speech(3.0, 48000, seed) * 32767).astype(np.int16)
    while len(packets) < n_frames:
        for k in range(rng.randint(50, 150)):
            packets.append(encoder.encode(voice[k * 960:(k + 1) * 960]))
        for _ in range(rng.randint(20, 60)):
            packets.append(encoder.encode(np.zeros(960, dtype=np.int16)))
    return packets[:n_frames]


_PACKET_CACHE: dict[int, list[bytes]] = {}


def cached_packets(n: int = 3000) -> list[bytes]:
    if n not in _PACKET_CACHE:
        _PACKET_CACHE[n] = talk_spurts(n)
    return _PACKET_CACHE[n]


@dataclass
class Schedule:
    """Which packets the network delivers and when (seconds after the sender's t=0)."""

    arrivals: list[tuple[float, int]]  # (arrival time, frame index)
    n_frames: int


def make_schedule(
    n_frames: int,
    *,
    loss: float = 0.0,
    burst: int = 1,
    jitter_ms: float = 0.0,
    drift: float = 0.0,
    base_delay_ms: float = 30.0,
    swaps: Iterable[int] = (),
    late: dict[int, float] | None = None,
    duplicates: Iterable[int] = (),
    seed: int = 7,
) -> tuple[Schedule, set[int]]:
    """A delivery schedule and the set of frames the network lost.

    loss: probability that a loss event starts at a frame; each event loses `burst` frames.
    drift: sender clock error (+0.001 = sender 0.1 % fast). swaps: frames delivered after
    their successor. late: frame -> extra delay in ms. duplicates: frames delivered twice.
    """
    rng = random.Random(seed)
    lost: set[int] = set()
    k = 0
    while k < n_frames:
        if k > 10 and rng.random() < loss:
            lost.update(range(k, min(n_frames, k + burst)))
            k += burst
        else:
            k += 1
    late = late or {}
    swaps = set(swaps)
    arrivals = []
    for k in range(n_frames):
        if k in lost:
            continue
        sent = k * FRAME_S / (1.0 + drift)
        delay = base_delay_ms + rng.uniform(0, jitter_ms) + late.get(k, 0.0)
        if k in swaps:
            delay += FRAME_MS * 1.5  # lands after frame k+1
        arrivals.append((sent + delay / 1000, k))
    for k in duplicates:
        arrivals.append((k * FRAME_S + (base_delay_ms + 5) / 1000, k))
    arrivals.sort()
    return Schedule(arrivals, n_frames), lost


@dataclass
class PlayoutTrace:
    kinds: list[str] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)  # while packets were still arriving
    buffer: Optional[JitterBuffer] = None


def play(schedule: Schedule, packets: list[bytes], *, seq_offset: int = 0, ts_offset: int = 0,
         extra_pull_s: float = 1.0) -> PlayoutTrace:
    """Feed the schedule into a JitterBuffer pulled every 20 ms on the receiver's clock."""
    buffer = JitterBuffer(OpusDecoder(16000))
    trace = PlayoutTrace(buffer=buffer)
    arrivals = list(schedule.arrivals)
    end = arrivals[-1][0] + extra_pull_s
    pull_time = arrivals[0][0] + 0.0073  # the playout clock has its own phase
    i = 0
    while pull_time < end:
        while i < len(arrivals) and arrivals[i][0] <= pull_time:
            t, k = arrivals[i]
            seq = (k + seq_offset) & 0xFFFF
            ts = (k * RTP_TICKS_PER_FRAME + ts_offset) & 0xFFFFFFFF
            buffer.put(seq, ts, packets[k % len(packets)], t)
            i += 1
        frame = buffer.pull(pull_time)
        assert frame.pcm.shape == (320,) and frame.pcm.dtype == np.int16
        trace.kinds.append(frame.kind)
        if i < len(arrivals):
            trace.delays_ms.append(buffer.stats.current_delay_ms)
        pull_time += FRAME_S
    return trace
