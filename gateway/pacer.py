"""Outbound audio: a paced, pre-encoded Opus track.

aiortc's RTP sender sends each frame the moment `track.recv()` returns, so pacing is the
track's job. The pacer keeps its own clock: frame n leaves at `start + n * 20 ms` on the
monotonic clock (no accumulated drift), carries pts = running sample count, and is
silence when nothing is queued. It encodes with Parley's own Opus encoder (mono, ~32
kbit/s, in-band FEC) and hands aiortc finished packets, bypassing aiortc's 96 kbit/s
stereo encoder. `flush()` empties the queue: the next frame sent is silence, so a
barge-in stops the caller's audio within one frame. `hold()` does the same but keeps the
queue, and `release()` plays on from where it stopped (a caller's onset that may be a cough);
`release(rewind_samples)` first sends again the last audio sent before the hold, for a
client that cut what was still on its way to the ear when the hold began.

`until_played(sample)` is how a producer learns that its audio has gone out: a future that
the frame carrying that sample completes (no polling), or a flush that drops it.

Echo reference: each write is resampled twice from the producer's audio, to 48 kHz to send
and to REFERENCE_RATE (the recogniser's 16 kHz) for the echo suppressor, and the two travel
together through the queue, holds, rewinds and flushes. `on_sent` gets every frame with its
own 20 ms of reference at the moment it leaves, so the suppressor's reference is exactly what
the caller's loudspeaker plays, at the rate the caller's microphone is heard at, without a
second, cruder conversion of the 48 kHz frames.
"""

from __future__ import annotations

import asyncio
import fractions
import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable, Deque, Optional, Protocol

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from engine.interface import STT_SAMPLE_RATE

from .opus import OpusEncoder

SAMPLE_RATE = 48000  # Opus input rate and RTP clock
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 960
# The echo reference's rate: the recogniser's, which the caller's audio (and so Parley's echo
# in it) is heard at. It divides SAMPLE_RATE, so a reference sample stands for a whole number
# of sent samples.
REFERENCE_RATE = STT_SAMPLE_RATE
REFERENCE_STEP = SAMPLE_RATE // REFERENCE_RATE  # 3 sent samples per reference sample
REFERENCE_FRAME = FRAME_SAMPLES // REFERENCE_STEP  # 320: one frame's reference
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
MAX_QUEUED_S = 120  # refuse to hold more than two minutes of unsent audio
RESYNC_LATE_S = 0.5  # a wake-up this late means the loop stalled: restart the clock, don't burst
LATENESS_WINDOW = 3000  # frames kept for percentiles (one minute)
REWIND_KEPT_S = 0.5  # audio sent lately, kept for release(rewind_samples); more than any playout delay


@dataclass
class PacerStats:
    frames_sent: int = 0
    audio_frames: int = 0  # frames that carried queued audio (at least partly)
    silence_frames: int = 0
    audio_samples_sent: int = 0  # queued samples that went out, at 48 kHz
    underruns: int = 0  # audio ran out mid-frame (padded with silence)
    flushes: int = 0
    flushed_samples: int = 0
    holds: int = 0
    clock_resyncs: int = 0
    queued_ms: float = 0.0
    lateness_ms_p50: float = 0.0
    lateness_ms_p99: float = 0.0
    lateness_ms_max: float = 0.0

    def as_dict(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class _Resampler:
    """int16 mono at one rate -> int16 mono at another, streaming (keeps filter state).

    swresample's output sample k is the input's time k / to_rate (it holds back its filter's
    look-ahead rather than shift the signal), so two resamplers of one input stay in step."""

    def __init__(self, rate: int, to_rate: int) -> None:
        self.rate, self.to_rate = rate, to_rate
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=to_rate)
        self._pts = 0

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        if self.rate == self.to_rate:
            return pcm
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, self.rate)
        self._pts += len(pcm)
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int16)


@dataclass(frozen=True)
class _Piece:
    """A stretch of queued sound: the audio to send (48 kHz) and its echo reference
    (REFERENCE_RATE), REFERENCE_STEP audio samples to a reference sample."""

    audio: np.ndarray
    reference: np.ndarray

    def split(self, at: int) -> tuple[_Piece, _Piece]:
        """(the first `at` audio samples, the rest), each with its share of the reference
        (the nearest reference sample to the cut: exact on the 3:1 grid, within one off it)."""
        cut = round(at * len(self.reference) / len(self.audio))
        return (_Piece(self.audio[:at], self.reference[:cut]),
                _Piece(self.audio[at:], self.reference[cut:]))


class _PieceMaker:
    """A producer's audio at one rate -> pieces: the audio resampled once to 48 kHz to send,
    and once to REFERENCE_RATE for the echo reference.

    The two resamplers hold back different amounts (their filters' look-ahead), so what one
    has given beyond the other waits for the next write: every piece's reference then covers
    exactly its audio, and pieces written one after another stay on one 3:1 grid."""

    def __init__(self, rate: int) -> None:
        self._to_send = _Resampler(rate, SAMPLE_RATE)
        self._to_reference = _Resampler(rate, REFERENCE_RATE)
        self._audio = np.zeros(0, dtype=np.int16)  # resampled, waiting for its reference
        self._reference = np.zeros(0, dtype=np.int16)  # resampled, waiting for its audio

    def __call__(self, pcm: np.ndarray) -> _Piece:
        audio = np.concatenate([self._audio, self._to_send(pcm)])
        reference = np.concatenate([self._reference, self._to_reference(pcm)])
        matched = min(len(audio) // REFERENCE_STEP, len(reference))
        self._audio, self._reference = audio[matched * REFERENCE_STEP:], reference[matched:]
        return _Piece(audio[:matched * REFERENCE_STEP], reference[:matched])


@dataclass(frozen=True)
class SentFrame:
    """One 20 ms frame as it left (`on_sent`)."""

    audio: np.ndarray  # FRAME_SAMPLES at 48 kHz: what was encoded and sent (silence when nothing played)
    reference: np.ndarray  # REFERENCE_FRAME at REFERENCE_RATE: the same 20 ms, for the echo suppressor


class FrameEncoder(Protocol):
    def encode(self, pcm: np.ndarray) -> bytes:
        """One 20 ms frame of 48 kHz int16 mono -> one RTP payload."""


class PacedAudioTrack(MediaStreamTrack):
    """A MediaStreamTrack that yields Opus packets on a steady 20 ms clock."""

    kind = "audio"

    def __init__(self, bitrate: int = 32000, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 encoder: Optional[FrameEncoder] = None) -> None:
        """`encoder`: what each 48 kHz frame becomes (default Opus at `bitrate`; a SIP call's is G.711)."""
        super().__init__()
        self._clock = clock
        self._sleep = sleep
        self._encoder = encoder or OpusEncoder(SAMPLE_RATE, bitrate)
        self._queue: Deque[_Piece] = deque()
        self._queued_samples = 0
        self._played = 0  # audio samples sent, less any rewound: where playback has got to
        self._recent: Deque[_Piece] = deque()  # the last audio sent (since the last flush), oldest first
        self._recent_samples = 0
        self._piece_makers: dict[int, _PieceMaker] = {}  # by the producer's rate
        self._start: Optional[float] = None
        self._pts = 0
        self._lateness: Deque[float] = deque(maxlen=LATENESS_WINDOW)
        self._silence = SentFrame(np.zeros(FRAME_SAMPLES, dtype=np.int16), np.zeros(REFERENCE_FRAME, dtype=np.int16))
        self.held = False
        self.stats = PacerStats()
        self.on_sent: Optional[Callable[[SentFrame], None]] = None  # each 20 ms frame, as it leaves
        self._marks: list[tuple[int, int, asyncio.Future[bool]]] = []  # heap: (sample, order, its future)
        self._mark_order = itertools.count()  # (ties in the heap never compare futures)

    def stop(self) -> None:
        super().stop()
        # Each resampler holds two libav threads (its filter graph's): they go with the call,
        # not whenever the garbage collector gets round to the call's reference cycles (a
        # node with 8 calls redialling had 160 such threads and their memory after 12 minutes)
        self._piece_makers.clear()

    # -- producer side ------------------------------------------------------------------

    def write(self, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue int16 mono audio at any rate; it plays after what is already queued."""
        if pcm.dtype != np.int16:
            raise TypeError("pacer takes int16 PCM")
        if self.readyState == "ended":
            return  # the call is over: nothing would send it
        make_piece = self._piece_makers.get(sample_rate)
        if make_piece is None:
            make_piece = self._piece_makers[sample_rate] = _PieceMaker(sample_rate)
        piece = make_piece(np.ascontiguousarray(pcm.reshape(-1)))
        if len(piece.audio) == 0:
            return
        if self._queued_samples + len(piece.audio) > MAX_QUEUED_S * SAMPLE_RATE:
            raise OverflowError("pacer queue is full")
        self._queue.append(piece)
        self._queued_samples += len(piece.audio)

    def flush(self) -> int:
        """Drop everything queued; returns the dropped sample count (48 kHz). Marks waiting
        for the dropped audio complete with False: it will never play."""
        dropped = self._queued_samples
        self._queue.clear()
        self._queued_samples = 0
        self._recent.clear()
        self._recent_samples = 0
        self.stats.flushes += 1
        self.stats.flushed_samples += dropped
        self._complete_marks(played=False)
        return dropped

    def until_played(self, sample: int) -> asyncio.Future[bool]:
        """A future that completes with True once played_samples reaches `sample` (the frame
        carrying it has been sent), or with False if flush() drops that audio first. Done at
        once when playback is already there. Cancelling it only stops the waiting."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._played >= sample:
            future.set_result(True)
        else:
            heapq.heappush(self._marks, (sample, next(self._mark_order), future))
        return future

    def _complete_marks(self, played: bool) -> None:
        """Complete the marks playback has reached (played=True), or every waiting one (False)."""
        while self._marks and (not played or self._marks[0][0] <= self._played):
            future = heapq.heappop(self._marks)[2]
            if not future.done():
                future.set_result(played)

    def hold(self) -> None:
        """Send silence from the next frame on, keeping what is queued (and played_samples)."""
        if not self.held:
            self.held = True
            self.stats.holds += 1

    def release(self, rewind_samples: int = 0) -> int:
        """Play on from where hold() stopped, after sending again up to `rewind_samples` (48 kHz)
        of the audio sent before it (never more than REWIND_KEPT_S, nothing from before a
        flush). Returns the samples rewound; played_samples moves back by as many."""
        self.held = False
        rewound = 0
        while rewound < rewind_samples and self._recent:
            last = self._recent.pop()
            take = min(len(last.audio), rewind_samples - rewound)
            if take < len(last.audio):
                kept, last = last.split(len(last.audio) - take)
                self._recent.append(kept)
            self._queue.appendleft(last)
            rewound += take
        self._recent_samples -= rewound
        self._queued_samples += rewound
        self._played -= rewound
        return rewound

    @property
    def queued_ms(self) -> float:
        return self._queued_samples * 1000.0 / SAMPLE_RATE

    @property
    def write_position(self) -> int:
        """Where audio written now will start playing, on the played_samples scale (48 kHz)."""
        return self._played + self._queued_samples

    @property
    def played_samples(self) -> int:
        """Queued audio samples sent so far, less any rewound (48 kHz): where playback has got to."""
        return self._played

    # -- consumer side (aiortc's RTP sender) -----------------------------------------

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        await self._wait_for_slot()
        frame = self._next_frame()
        if self.on_sent is not None:
            self.on_sent(frame)
        self._complete_marks(played=True)
        packet = av.Packet(self._encoder.encode(frame.audio))
        packet.pts = self._pts
        packet.time_base = TIME_BASE
        self._pts += FRAME_SAMPLES
        self.stats.frames_sent += 1
        return packet

    async def _wait_for_slot(self) -> None:
        now = self._clock()
        if self._start is None:
            self._start = now
        deadline = self._start + self._pts / SAMPLE_RATE
        if deadline > now:
            await self._sleep(deadline - now)
            now = self._clock()
        else:
            # Behind schedule: still give the loop a turn. aiortc's sender calls recv() again
            # at once, so without a suspension here a backlog of frames would be encoded and
            # sent in one callback, which stalls the loop for every other call.
            await asyncio.sleep(0)
        late = now - deadline
        if late > RESYNC_LATE_S:
            # Sending the backlog in a burst would only overflow the far end's buffer.
            self.stats.clock_resyncs += 1
            self._start = now - self._pts / SAMPLE_RATE
            late = 0.0
        self._record_lateness(late * 1000.0)

    def _next_frame(self) -> SentFrame:
        if not self._queue or self.held:
            self.stats.silence_frames += 1
            self.stats.queued_ms = 0.0
            return self._silence
        parts: list[_Piece] = []
        need = FRAME_SAMPLES
        while need and self._queue:
            head = self._queue.popleft()
            if len(head.audio) > need:
                head, rest = head.split(need)
                self._queue.appendleft(rest)
            parts.append(head)
            need -= len(head.audio)
        taken = FRAME_SAMPLES - need
        self._queued_samples -= taken
        self._played += taken
        self._remember(parts)
        self.stats.audio_samples_sent += taken
        self.stats.audio_frames += 1
        if need:
            self.stats.underruns += 1
        self.stats.queued_ms = self.queued_ms
        audio = _exactly(np.concatenate([part.audio for part in parts]), FRAME_SAMPLES)
        # Exactly one frame's worth, so the suppressor's timeline advances with the frames sent
        # (a cut off the 3:1 grid, after a rewind, can leave one reference sample over or short).
        reference = _exactly(np.concatenate([part.reference for part in parts]), REFERENCE_FRAME)
        return SentFrame(audio, reference)

    def _remember(self, parts: list[_Piece]) -> None:
        self._recent.extend(parts)
        self._recent_samples += sum(len(part.audio) for part in parts)
        while self._recent_samples - len(self._recent[0].audio) >= REWIND_KEPT_S * SAMPLE_RATE:
            self._recent_samples -= len(self._recent.popleft().audio)

    def _record_lateness(self, late_ms: float) -> None:
        self._lateness.append(late_ms)
        if self.stats.frames_sent % 25 == 0:  # percentiles twice a second are plenty
            values = np.fromiter(self._lateness, dtype=np.float64)
            self.stats.lateness_ms_p50 = float(np.percentile(values, 50))
            self.stats.lateness_ms_p99 = float(np.percentile(values, 99))
        self.stats.lateness_ms_max = max(self.stats.lateness_ms_max, late_ms)

    def lateness_samples(self) -> list[float]:
        """Recent per-frame send lateness in ms (for benchmarks)."""
        return list(self._lateness)


def _exactly(pcm: np.ndarray, samples: int) -> np.ndarray:
    """`pcm` cut or padded with silence to `samples` (an underrun's frame ends in silence)."""
    if len(pcm) >= samples:
        return pcm[:samples]
    return np.concatenate([pcm, np.zeros(samples - len(pcm), dtype=np.int16)])
