"""Adaptive jitter buffer for inbound Opus audio.

aiortc's audio jitter buffer is arrival-driven: it has no playout clock, stalls after one
lost packet and keeps the extra delay for good. This one is pulled by a clock instead:
every 20 ms `pull(now)` returns exactly one 20 ms frame of 16 kHz mono PCM, whatever the
network did. Its policy follows WebRTC NetEq, simplified for a speech recogniser:

- target delay = p95 of the packets' arrival delay (relative to the fastest recent one),
  raised to cover recently reordered packets so a swapped pair plays in order, clamped to [MIN_TARGET_MS, MAX_TARGET_MS];
- a missing packet is recovered from the next packet's in-band FEC when that packet is
  already here, else concealed by the decoder (PLC), then by comfort silence;
- a buffer that runs dry expands (conceals without advancing), so a late packet is still
  played and the delay grows to what the network needs;
- a delay above target is cut by dropping whole frames, only in silence unless it is far
  above target, so delay never grows without bound (no time-stretching: the engine side
  is a recogniser, not an ear);
- NetEq-style counters that are exact: every packet received is played, dropped, late,
  a duplicate, or still buffered; every frame pulled is played, concealed or silence.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Protocol

import numpy as np

SAMPLE_RATE = 16000  # output rate, what the engine listens at
FRAME_MS = 20  # playout tick and output frame
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 320 samples per output frame
RTP_CLOCK_RATE = 48000  # Opus RTP timestamp clock
RTP_TICKS_PER_FRAME = RTP_CLOCK_RATE * FRAME_MS // 1000

MIN_TARGET_MS = 20.0  # never buffer less than one frame
MAX_TARGET_MS = 120.0  # beyond this, lateness is cheaper than delay for a conversation
START_TARGET_MS = 60.0  # before enough arrivals are seen to estimate jitter
TARGET_HEADROOM_MS = 10.0  # added to the p95 so the usual packet is comfortably on time
JITTER_PERCENTILE = 95.0
JITTER_HISTORY = 500  # arrival-delay samples kept for the percentile (10 s of packets)
REORDER_MEMORY_S = 10.0  # how long a reordered arrival keeps the target up (cf. NetEq's reorder optimizer)
MIN_TRANSIT_WINDOW_S = 2.0  # window of the fastest-transit reference; short so drift can't pose as jitter
CATCH_UP_MARGIN_MS = FRAME_MS  # drop in silence once delay exceeds target by a frame
INSERT_MARGIN_MS = FRAME_MS / 2  # insert silence once delay is this far below target
FORCED_CATCH_UP_MS = 100.0  # drop even speech once delay exceeds target by this much
RESYNC_MS = 1000.0  # a delay this far above target means the stream jumped: start over
SILENCE_RMS = 10 ** (-40 / 20) * 32768  # -40 dBFS: below this a frame can be dropped unheard
PLC_FRAMES = 5  # conceal with the codec for 100 ms, then comfort silence
MAX_BUFFERED_PACKETS = 250  # 5 s; anything further ahead is a stream jump
RECENT_LOST_MEMORY = 256  # how far back a late arrival can still be told from a duplicate


class FrameDecoder(Protocol):
    """What the buffer needs from a codec (gateway.opus.OpusDecoder fits)."""

    def decode(self, packet: bytes) -> np.ndarray: ...

    def decode_fec(self, next_packet: bytes) -> np.ndarray: ...

    def conceal(self) -> np.ndarray: ...


@dataclass
class PlayoutFrame:
    """One 20 ms frame of 16 kHz int16 mono PCM and how it was produced."""

    pcm: np.ndarray
    kind: str  # "normal" | "fec" | "plc" | "silence" (comfort or pre-roll)


@dataclass
class JitterStats:
    """NetEq-style counters; times in milliseconds, sizes in packets or samples."""

    packets_received: int = 0
    packets_played: int = 0
    packets_lost: int = 0  # due for playout but missing at their turn
    packets_late: int = 0  # arrived after their turn had passed
    packets_reordered: int = 0  # arrived after a packet with a higher sequence number
    packets_duplicate: int = 0
    packets_dropped: int = 0  # discarded to cut delay (catch-up, resync)
    packets_invalid: int = 0  # empty payloads and packets the decoder rejected
    frames_pulled: int = 0
    fec_decodes: int = 0  # losses concealed from the next packet's in-band FEC (libopus falls back to PLC if it has none)
    concealed_samples: int = 0  # samples produced by FEC, PLC or comfort silence after start
    concealment_events: int = 0  # runs of consecutive concealed frames
    silence_inserted: int = 0  # frames inserted in silence to raise delay to target
    resyncs: int = 0
    current_delay_ms: float = 0.0  # playout point behind the fastest path
    target_delay_ms: float = START_TARGET_MS
    jitter_p95_ms: float = 0.0
    total_wait_ms: float = 0.0  # summed arrival-to-playout time of played packets
    buffered_packets: int = 0

    @property
    def mean_wait_ms(self) -> float:
        """Average time a played packet sat in the buffer (getStats' jitterBufferDelay / emitted)."""
        return self.total_wait_ms / self.packets_played if self.packets_played else 0.0

    def as_dict(self) -> dict:
        d = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        d["mean_wait_ms"] = round(self.mean_wait_ms, 2)
        return d


@dataclass
class _Packet:
    seq: int  # extended (unwrapped) sequence number
    timestamp: int  # extended RTP timestamp
    payload: bytes
    arrival: float  # seconds, same clock as pull()


def _unwrap(value: int, reference: Optional[int], bits: int) -> int:
    """Extend a wrapping counter to the value closest to reference."""
    if reference is None:
        return value
    modulus = 1 << bits
    candidate = (reference & ~(modulus - 1)) | value
    if candidate - reference > modulus // 2:
        candidate -= modulus
    elif reference - candidate > modulus // 2:
        candidate += modulus
    return candidate


class _SlidingMinimum:
    """Minimum of (time, value) samples over the last `window` seconds (monotonic deque)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: Deque[tuple[float, float]] = deque()

    def add(self, t: float, value: float) -> None:
        while self._samples and self._samples[-1][1] >= value:
            self._samples.pop()
        self._samples.append((t, value))
        while len(self._samples) > 1 and self._samples[0][0] < t - self.window:
            self._samples.popleft()

    def get(self) -> Optional[float]:
        return self._samples[0][1] if self._samples else None


class JitterBuffer:
    """Reorders, times and conceals one inbound Opus stream; see the module docstring."""

    def __init__(self, decoder: FrameDecoder, rtp_clock_rate: int = RTP_CLOCK_RATE) -> None:
        """`rtp_clock_rate`: the RTP timestamp clock (48 kHz for Opus, 8 kHz for G.711)."""
        self.decoder = decoder
        self.rtp_clock_rate = rtp_clock_rate
        self.rtp_ticks_per_frame = rtp_clock_rate * FRAME_MS // 1000
        self.stats = JitterStats()
        self._packets: Dict[int, _Packet] = {}
        self._next_seq: Optional[int] = None  # the next packet due for playout
        self._highest_seq: Optional[int] = None
        self._last_timestamp: Optional[int] = None
        self._playout_timestamp: Optional[int] = None  # RTP time of the next frame due
        self._min_transit = _SlidingMinimum(MIN_TRANSIT_WINDOW_S)
        self._arrival_delays: Deque[float] = deque(maxlen=JITTER_HISTORY)
        self._sorted_delays: list[float] = []
        self._reordered_delays: Deque[tuple[float, float]] = deque()  # (arrival, delay ms)
        self._recent_lost: Deque[int] = deque(maxlen=RECENT_LOST_MEMORY)
        self._pcm_fifo = np.zeros(0, dtype=np.int16)  # carries packets longer than 20 ms
        self._concealed_run = 0
        self._expanded_frames = 0  # frames concealed in an underrun since a packet last left the buffer
        self._last_frame_silent = True
        self._dropped_this_pull = False

    # -- arrivals -------------------------------------------------------------------

    def put(self, seq: int, timestamp: int, payload: bytes, arrival: float) -> None:
        """Add one RTP packet (16-bit seq, 32-bit timestamp) that arrived at `arrival` s."""
        self.stats.packets_received += 1
        if not payload:
            self.stats.packets_invalid += 1
            return
        seq = _unwrap(seq, self._highest_seq, 16)
        timestamp = _unwrap(timestamp, self._last_timestamp, 32)
        if self._next_seq is not None and abs(seq - self._next_seq) > MAX_BUFFERED_PACKETS:
            self._resync()
            seq, timestamp = seq & 0xFFFF, timestamp & 0xFFFFFFFF
        delay_ms = self._note_arrival_delay(timestamp, arrival)
        if self._highest_seq is not None and seq < self._highest_seq:
            self.stats.packets_reordered += 1
            self._reordered_delays.append((arrival, delay_ms))
        while self._reordered_delays and self._reordered_delays[0][0] < arrival - REORDER_MEMORY_S:
            self._reordered_delays.popleft()
        if self._next_seq is not None and seq < self._next_seq and not self._started():
            self._next_seq, self._playout_timestamp = seq, timestamp  # reordered before playout began
        if self._next_seq is not None and seq < self._next_seq:
            if seq in self._recent_lost:
                self.stats.packets_late += 1
            else:
                self.stats.packets_duplicate += 1
            return
        if seq in self._packets:
            self.stats.packets_duplicate += 1
            return
        self._packets[seq] = _Packet(seq, timestamp, payload, arrival)
        self.stats.buffered_packets = len(self._packets)
        if self._highest_seq is None or seq > self._highest_seq:
            self._highest_seq = seq
            self._last_timestamp = timestamp
        if self._next_seq is None:
            self._next_seq = seq
            self._playout_timestamp = timestamp

    def _started(self) -> bool:
        return bool(self.stats.packets_played or self.stats.packets_lost or self.stats.packets_dropped)

    def _note_arrival_delay(self, timestamp: int, arrival: float) -> float:
        transit = arrival - timestamp / self.rtp_clock_rate
        self._min_transit.add(arrival, transit)
        delay_ms = (transit - self._min_transit.get()) * 1000.0
        if len(self._arrival_delays) == self._arrival_delays.maxlen:
            old = self._arrival_delays[0]
            del self._sorted_delays[bisect.bisect_left(self._sorted_delays, old)]
        self._arrival_delays.append(delay_ms)
        bisect.insort(self._sorted_delays, delay_ms)
        return delay_ms

    # -- playout ----------------------------------------------------------------------

    def pull(self, now: float) -> PlayoutFrame:
        """The 20 ms frame to play at `now` (seconds, the arrivals' clock)."""
        frame = self._pull(now)
        self.stats.buffered_packets = len(self._packets)
        return frame

    def _pull(self, now: float) -> PlayoutFrame:
        self.stats.frames_pulled += 1
        self._update_target()
        if self._next_seq is None:
            return self._silence(concealed=False)
        self._dropped_this_pull = False
        while len(self._pcm_fifo) < FRAME_SAMPLES:
            frame = self._next_frame(now)
            if frame is not None:
                return frame
        return self._emit_fifo("normal")

    def _next_frame(self, now: float) -> Optional[PlayoutFrame]:
        """Decode the next due packet into the FIFO, or return a concealment/silence frame."""
        assert self._next_seq is not None
        delay = self._current_delay_ms(now)
        self.stats.current_delay_ms = delay
        target = self.stats.target_delay_ms
        if delay > target + RESYNC_MS:
            self._resync()
            return self._silence(concealed=True)
        packet = self._packets.get(self._next_seq)
        if packet is None:
            return self._missing_frame(now)
        if delay < target - INSERT_MARGIN_MS and self._last_frame_silent and self._can_wait():
            # Below target in silence (start of stream, or jitter rose): wait a frame.
            self.stats.silence_inserted += 1
            return self._silence(concealed=self.stats.packets_played > 0)
        pcm = self._decode(packet)
        self._advance(packet)
        if pcm is None:
            return None
        if self._should_drop(delay - target, pcm):
            self.stats.packets_dropped += 1
            self._dropped_this_pull = True
            return None
        self.stats.packets_played += 1
        self.stats.total_wait_ms += max(0.0, now - packet.arrival) * 1000.0
        self._pcm_fifo = np.concatenate([self._pcm_fifo, pcm])
        self._concealed_run = 0
        return None

    def _should_drop(self, over_target_ms: float, pcm: np.ndarray) -> bool:
        """Catch up by one frame per pull, only when the next packet is here to play instead."""
        if self._dropped_this_pull or over_target_ms <= CATCH_UP_MARGIN_MS:
            return False
        if self._next_seq not in self._packets:
            return False
        return over_target_ms > FORCED_CATCH_UP_MS or _is_silent(pcm)

    def _missing_frame(self, now: float) -> Optional[PlayoutFrame]:
        """The due packet is not here: lost (later ones are) or the buffer ran dry. None: the
        lost packets an underrun already played concealment for were skipped (decode on)."""
        assert self._next_seq is not None
        later_present = self._highest_seq is not None and self._highest_seq > self._next_seq
        if not later_present:
            # Underrun: expand without advancing, so the packet plays if it is only late.
            self._expanded_frames += 1
            return self._conceal()
        if self._expanded_frames:
            # Lost, not late: the frames concealed while waiting stood in for these packets.
            # Skip them instead of concealing their time again, which would leave the playout
            # point behind by the whole gap (a 200 ms burst: 200 ms more delay, caught up
            # only by dropping speech).
            while self._expanded_frames and self._next_seq not in self._packets:
                self._expanded_frames -= 1
                self._lose_next()
            if self._next_seq in self._packets:
                return None
        self._lose_next()
        following = self._packets.get(self._next_seq)
        if following is not None and self._concealed_run < PLC_FRAMES:
            try:
                pcm = _fit(self.decoder.decode_fec(following.payload))
            except Exception:
                return self._conceal()
            self.stats.fec_decodes += 1
            return self._concealed_frame(pcm, "fec")
        return self._conceal()

    def _lose_next(self) -> None:
        """Count the due packet lost and move the playout point past it."""
        assert self._next_seq is not None
        self.stats.packets_lost += 1
        self._recent_lost.append(self._next_seq)
        self._next_seq += 1
        self._playout_timestamp = (self._playout_timestamp or 0) + self.rtp_ticks_per_frame

    def _conceal(self) -> PlayoutFrame:
        if self._concealed_run < PLC_FRAMES:
            try:
                return self._concealed_frame(_fit(self.decoder.conceal()), "plc")
            except Exception:
                pass
        return self._silence(concealed=True)

    def _concealed_frame(self, pcm: np.ndarray, kind: str) -> PlayoutFrame:
        if self._concealed_run == 0:
            self.stats.concealment_events += 1
        self._concealed_run += 1
        self.stats.concealed_samples += FRAME_SAMPLES
        self._last_frame_silent = _is_silent(pcm)
        return PlayoutFrame(pcm, kind)

    def _silence(self, concealed: bool) -> PlayoutFrame:
        pcm = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        if concealed:
            return self._concealed_frame(pcm, "silence")
        self._last_frame_silent = True
        return PlayoutFrame(pcm, "silence")

    def _emit_fifo(self, kind: str) -> PlayoutFrame:
        pcm, self._pcm_fifo = self._pcm_fifo[:FRAME_SAMPLES], self._pcm_fifo[FRAME_SAMPLES:]
        self._last_frame_silent = _is_silent(pcm)
        return PlayoutFrame(pcm, kind)

    def _decode(self, packet: _Packet) -> Optional[np.ndarray]:
        try:
            return self.decoder.decode(packet.payload)
        except Exception:
            self.stats.packets_invalid += 1
            return None

    def _advance(self, packet: _Packet) -> None:
        self._expanded_frames = 0  # the underrun, if any, is over
        del self._packets[packet.seq]
        self._next_seq = packet.seq + 1
        self._playout_timestamp = packet.timestamp + self.rtp_ticks_per_frame

    def _can_wait(self) -> bool:
        """Waiting is only worth it while the buffer is not already holding a lot."""
        return len(self._packets) * FRAME_MS < MAX_TARGET_MS + FORCED_CATCH_UP_MS

    def _resync(self) -> None:
        """The stream jumped (restart, long stall, new clock): forget it and start over."""
        self.stats.resyncs += 1
        self.stats.packets_dropped += len(self._packets)
        self._packets.clear()
        self._next_seq = self._highest_seq = self._last_timestamp = self._playout_timestamp = None
        self._min_transit = _SlidingMinimum(MIN_TRANSIT_WINDOW_S)
        self._pcm_fifo = np.zeros(0, dtype=np.int16)
        self._expanded_frames = 0

    # -- delay estimation -----------------------------------------------------------

    def _current_delay_ms(self, now: float) -> float:
        """How far the playout point is behind the fastest path from the sender."""
        fastest = self._min_transit.get()
        if fastest is None or self._playout_timestamp is None:
            return 0.0
        earliest_arrival = self._playout_timestamp / self.rtp_clock_rate + fastest
        return (now - earliest_arrival) * 1000.0

    def _update_target(self) -> None:
        stats = self.stats
        if len(self._sorted_delays) < 20:
            return
        index = min(len(self._sorted_delays) - 1, math.ceil(JITTER_PERCENTILE / 100 * len(self._sorted_delays)) - 1)
        stats.jitter_p95_ms = self._sorted_delays[index]
        reordered = max((d for _, d in self._reordered_delays), default=0.0)
        target = max(stats.jitter_p95_ms, reordered) + TARGET_HEADROOM_MS
        stats.target_delay_ms = min(MAX_TARGET_MS, max(MIN_TARGET_MS, target))


def _fit(pcm: np.ndarray) -> np.ndarray:
    """Exactly one output frame (concealment may return another length)."""
    if len(pcm) >= FRAME_SAMPLES:
        return pcm[:FRAME_SAMPLES]
    return np.concatenate([pcm, np.zeros(FRAME_SAMPLES - len(pcm), dtype=np.int16)])


def _is_silent(pcm: np.ndarray) -> bool:
    if len(pcm) == 0:
        return True
    rms = float(np.sqrt(np.mean(pcm.astype(np.float32) ** 2)))
    return rms < SILENCE_RMS
