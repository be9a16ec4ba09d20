"""Streaming recognition on Whisper: re-read the turn so far, commit what two readings agree on.

    caller audio ─┬─► Parley's SSM stream (engine/stt.py): SpeechLikely, SpeechStart, EndOfTurn
                  │        │  (its heads decide when speech starts and when a turn ends)
                  └────────┴─► TurnReader ─► readings of the turn's audio (engine/whisper.py, on a
                                   │          worker thread) ─► Partial (stable words), Final
                                   └─► the engine's events, in stream order

The SSM still listens frame by frame, batched with every other stream in the runtime's tick:
it hears a caller start within 40-80 ms (barge-in pauses on that) and its end-of-turn head
judges pauses. Its own words are not used: learned from synthetic voices, they read real
callers at 0.96 WER. Whisper tiny.en reads them at 0.07, but only whole windows, so:

- partials: every HOP_S of new turn audio (from MIN_PARTIAL_S on: Whisper hallucinates "Thank
  you" on near-silence), the turn so far is re-read; the words on which the last two readings
  agree (LocalAgreement-2) are committed and never taken back; a Partial carries them;
- the Final is one reading of the whole turn, made when the SSM ends the turn (or the audio
  is flushed); the EndOfTurn follows it, and any event of the next turn waits behind both.

TurnReader is the logic alone (no threads, no clock), shared by the runtime (a worker thread
reads) and the benchmark (reads inline and books the compute time on a virtual clock).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

from .interface import EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, SttEvent
from .vad import WINDOW as VAD_WINDOW, VadStream
from .whisper import MAX_SECONDS, SAMPLE_RATE, WhisperReader, _key

log = logging.getLogger(__name__)

HOP_S = 0.32  # new turn audio between partial re-reads (0.5 s halves the CPU, doubles the lag)
MIN_PARTIAL_S = 1.0  # turn audio before the first partial re-read
PRE_ROLL_S = 0.5  # read from this long before a detected start (never before the last turn's end):
# the SSM flags speech 20-80 ms into a word on the voices it knows, later on some real ones
KEEP_S = MAX_SECONDS - 1.0  # a turn longer than Whisper's window is read by its last KEEP_S
VAD_ON, VAD_OFF = 0.5, 0.35  # Silero P(speech) that starts a sound, and below which it has stopped
# End of turn: quiet (by the VAD) for at least this long after a pause reading whose last word
COMPLETE_QUIET_S = 0.5  # ... ends a sentence (Whisper wrote . ? or !), or
INCOMPLETE_QUIET_S = 0.9  # ... does not ("my number is", "and then,"): longer than a breath or a thought
# A caller who pauses between two whole sentences cannot be told from one who has finished by
# the words: on real-dev speakers' clips joined with 0.4-0.8 s pauses (bench/real_turns.py),
# 0.2 s answers 222 ms after the last word but ends 93 % of those pauses, 0.5 s 522 ms / 71 %,
# 0.8 s 820 ms / 7 %. 0.5 s is the usual endpointing delay of voice agents (LiveKit's minimum);
# a barge-in takes the turn back when the caller goes on (MODEL_CARD.md).
WORDLESS_QUIET_S = 0.3  # a sound in which Whisper read no word (a cough, a click) is over after this
FINAL, PAUSE, PARTIAL = 0, 1, 2  # reading kinds, in the order a busy reader takes them
SENTENCE_END = (".", "?", "!")


@dataclass
class Job:
    """One reading: the turn `turn` of a stream, audio [start, end) in stream samples."""

    turn: int
    kind: int  # FINAL, PAUSE or PARTIAL
    audio: np.ndarray
    start: int
    end: int
    requested_at: float  # seconds of stream audio when asked (the benchmark's clock)


@dataclass
class Pause:
    """The caller went quiet at `since` (a stream sample); `text` is the reading of the turn up
    to then, once it is in."""

    since: int
    job: Job
    text: Optional[str] = None

    def quiet_needed(self) -> float:
        if not self.text:
            return WORDLESS_QUIET_S
        return COMPLETE_QUIET_S if self.text.rstrip().endswith(SENTENCE_END) else INCOMPLETE_QUIET_S


class TurnReader:
    """One stream's recognition on Whisper, driven by its audio (VAD) and its SSM's events.

    A turn starts when the VAD or the SSM hears speech. When the VAD hears it stop, the turn
    so far is read at once (a pause reading); if the caller stays quiet long enough for what
    that reading says (COMPLETE_QUIET_S after a finished sentence, INCOMPLETE_QUIET_S
    otherwise), the reading becomes the turn's Final, followed by EndOfTurn. Speech that
    resumes first cancels it. The SSM's own end-of-turn head ends only turns the VAD never
    heard: on real voices it took 57 % of mid-turn pauses for turn ends (MODEL_CARD.md).

    push(audio) and on_events(ssm events) return the events to send now and queue readings
    through `submit(job)`; on_reading(job, text) returns what a finished reading releases.
    Not thread-safe on its own: the runtime calls it under the stream's lock.
    """

    def __init__(self, submit: Callable[[Job], None], can_read_partial: Callable[[], bool] = lambda: True,
                 vad: Optional[VadStream] = None) -> None:
        self.submit = submit
        self.can_read_partial = can_read_partial
        self.vad = vad
        self.vad_speaking = False
        self.vad_in_turn = False  # the VAD has heard speech in this turn: it decides the turn's end
        self.pause: Optional[Pause] = None
        self.last_turn_end = 0  # stream sample: a turn's pre-roll never reaches into the one before
        self.base = 0  # stream sample of self.audio[0]
        self.audio = np.zeros(0, np.float32)
        self.turn = 0
        self.turn_start: Optional[int] = None  # stream sample where the current turn's audio starts
        self.committed: list[str] = []  # words no partial of this turn takes back
        self.previous: list[str] = []  # the last partial reading's words
        self.partial_in_flight = False
        self.last_partial_end = 0
        # Events in stream order; a turn's final reading holds back everything after it:
        self.outbox: list[Union[SttEvent, _FinalSlot]] = []

    @property
    def samples(self) -> int:
        return self.base + len(self.audio)

    def push(self, audio: np.ndarray) -> list[SttEvent]:
        self.audio = np.concatenate([self.audio, audio.astype(np.float32, copy=False)])
        out = self._listen(audio) if self.vad is not None else []
        out += self._maybe_end_turn()
        self._maybe_read_partial()
        self._trim()  # last: a start the VAD just heard in this audio keeps its pre-roll
        return out

    def _listen(self, audio: np.ndarray) -> list[SttEvent]:
        """The VAD's view of the new audio: a sound's start opens a turn if none is under way
        (or cancels a pause); its end starts a pause reading."""
        out: list[SttEvent] = []
        done = self.vad.windows
        for k, p in enumerate(self.vad.push(audio), start=done):
            at = k * VAD_WINDOW
            if not self.vad_speaking and p >= VAD_ON:
                self.vad_speaking = True
                self.pause = None
                if self.turn_start is None:
                    self._start_turn(at / SAMPLE_RATE)
                    out += self._send([SpeechStart(t=at / SAMPLE_RATE)])
                self.vad_in_turn = True
            elif self.vad_speaking and p < VAD_OFF:
                self.vad_speaking = False
                if self.turn_start is not None and self.vad_in_turn:
                    self.pause = Pause(at + VAD_WINDOW, self._job(PAUSE, self.turn_start))
                    self.submit(self.pause.job)
        return out

    def _maybe_end_turn(self) -> list[SttEvent]:
        pause = self.pause
        if pause is None or pause.text is None or self.vad_speaking:
            return []
        if self.samples - pause.since < pause.quiet_needed() * SAMPLE_RATE:
            return []
        self.pause = None
        text = pause.text
        confidence = 0.0 if not text else 0.9 if pause.quiet_needed() == COMPLETE_QUIET_S else 0.5
        self._close_turn()
        final = [Final(text, spread_words(text.split(), pause.job.start / SAMPLE_RATE, pause.since / SAMPLE_RATE))]
        return self._send((final if text else []) + [EndOfTurn(confidence=confidence)])

    def on_events(self, events: list[SttEvent]) -> list[SttEvent]:
        """The SSM's events for the audio pushed so far, in order."""
        out: list[SttEvent] = []
        for event in events:
            if isinstance(event, SpeechStart):
                # (a start the SSM hears late, in speech already read as a turn, opens none)
                if self.turn_start is None and event.t * SAMPLE_RATE >= self.last_turn_end:
                    self._start_turn(event.t)
                    out += self._send([event])
            elif isinstance(event, SpeechLikely):
                out += self._send([event])
            elif isinstance(event, EndOfTurn) and not self.vad_in_turn:
                out += self._end_turn(event)
            # Partial and Final: the SSM's words give way to Whisper's readings
        return out

    def flush(self) -> list[SttEvent]:
        """The audio ended for now: a Final for the turn under way (no end-of-turn claim)."""
        return self._end_turn(None)

    def on_reading(self, job: Job, text: str) -> list[SttEvent]:
        if job.kind == PARTIAL:
            self.partial_in_flight = False
            return self._on_partial_reading(text) if job.turn == self.turn else []
        if job.kind == PAUSE:
            if self.pause is not None and self.pause.job is job:
                self.pause.text = text
                return self._maybe_end_turn()
            return []
        slot = next(item for item in self.outbox if isinstance(item, _FinalSlot) and item.turn == job.turn)
        slot.events = [Final(text, spread_words(text.split(), job.start / SAMPLE_RATE, job.end / SAMPLE_RATE))] \
            if text else []
        if slot.end_of_turn is not None:
            slot.events.append(slot.end_of_turn)
        return self._release()

    # -- turns --

    def _start_turn(self, t: float) -> None:
        self.turn += 1
        self.turn_start = max(self.base, self.last_turn_end, int((t - PRE_ROLL_S) * SAMPLE_RATE))
        self.vad_in_turn = False
        self.pause = None
        self.committed, self.previous = [], []
        self.last_partial_end = self.turn_start

    def _close_turn(self) -> int:
        start, self.turn_start = self.turn_start, None
        self.last_turn_end = self.samples
        self.vad_in_turn = False
        self.pause = None
        return start

    def _end_turn(self, end_of_turn: Optional[EndOfTurn]) -> list[SttEvent]:
        """A turn ends without a pause reading (the SSM's call, or a flush): read it whole."""
        if self.turn_start is None:  # nothing under way (a flush in silence, an end without a start)
            return self._send([end_of_turn]) if end_of_turn is not None else []
        start = self._close_turn()
        self.outbox.append(_FinalSlot(self.turn, end_of_turn))
        self.submit(self._job(FINAL, start))
        return []

    def _send(self, events: list[SttEvent]) -> list[SttEvent]:
        self.outbox += events
        return self._release()

    def _release(self) -> list[SttEvent]:
        """The events at the front of the outbox that wait for no reading."""
        out: list[SttEvent] = []
        while self.outbox:
            item = self.outbox[0]
            if isinstance(item, _FinalSlot):
                if item.events is None:
                    break
                out += item.events
            else:
                out.append(item)
            self.outbox.pop(0)
        return out

    # -- partials --

    def _maybe_read_partial(self) -> None:
        if self.turn_start is None or self.partial_in_flight or self.pause is not None:
            return
        if (self.samples - self.turn_start < MIN_PARTIAL_S * SAMPLE_RATE
                or self.samples - self.last_partial_end < HOP_S * SAMPLE_RATE or not self.can_read_partial()):
            return
        self.partial_in_flight = True
        self.last_partial_end = self.samples
        self.submit(self._job(PARTIAL, self.turn_start))

    def _on_partial_reading(self, text: str) -> list[SttEvent]:
        words = text.split()
        agreed = common_prefix(self.previous, words)
        self.previous = words
        if len(agreed) > len(self.committed) and common_prefix(agreed, self.committed) == self.committed:
            self.committed = agreed
            return self._send([Partial(" ".join(agreed))])
        return []

    # -- audio --

    def _job(self, kind: int, start: int) -> Job:
        start = max(start, self.samples - int(KEEP_S * SAMPLE_RATE), self.base)
        audio = self.audio[start - self.base:].copy()
        return Job(self.turn, kind, audio, start, self.samples, self.samples / SAMPLE_RATE)

    def _trim(self) -> None:
        """Keep the turn under way (at most KEEP_S) or, between turns, the pre-roll."""
        keep_from = self.samples - int((KEEP_S if self.turn_start is not None else PRE_ROLL_S + 0.2) * SAMPLE_RATE)
        if self.turn_start is not None:
            keep_from = max(keep_from, min(self.turn_start, self.samples))
        drop = keep_from - self.base
        if drop > SAMPLE_RATE:  # trim in whole seconds, not on every push
            self.audio = self.audio[drop:]
            self.base += drop


@dataclass
class _FinalSlot:
    """A turn's place in the outbox until its final reading is in."""

    turn: int
    end_of_turn: Optional[EndOfTurn]
    events: Optional[list[SttEvent]] = None


def common_prefix(a: list[str], b: list[str]) -> list[str]:
    """The words both start with (compared without case and punctuation), as `b` writes them."""
    n = 0
    while n < len(a) and n < len(b) and _key(a[n]) == _key(b[n]):
        n += 1
    return b[:n]


def spread_words(words: list[str], start: float, end: float) -> list[tuple[str, float, float]]:
    """Word times for a reading without timestamps: the span shared by characters. An estimate:
    the gateway uses only the last word's end (when the caller stopped)."""
    if not words:
        return []
    total = sum(len(w) + 1 for w in words)
    out, t = [], start
    for word in words:
        t1 = t + (end - start) * (len(word) + 1) / total
        out.append((word, round(t, 3), round(t1, 3)))
        t = t1
    return out


# -- who reads: a worker thread for the runtime, inline for the benchmark ---------------------------

ReadingDone = Callable[[Job, "str | BaseException"], None]


class ReadingWorker:
    """Every stream's readings on `threads` threads (CTranslate2 computes without the GIL),
    final readings before partial ones, oldest first."""

    def __init__(self, reader: WhisperReader, threads: int = 1) -> None:
        self.reader = reader
        self._queue: list[tuple[int, int, Job, ReadingDone]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self.busy = 0
        self.readings = 0
        self.read_seconds = 0.0
        self._threads = [threading.Thread(target=self._run, name=f"whisper-reader-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job, done: ReadingDone) -> None:
        with self._ready:
            heapq.heappush(self._queue, (job.kind, next(self._order), job, done))
            self._ready.notify()

    def has_room(self) -> bool:
        """A partial reading would start at once: partials thin out by themselves under load."""
        return not self._queue and self.busy < len(self._threads)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                _, _, job, done = heapq.heappop(self._queue)
                self.busy += 1
            started = time.perf_counter()
            try:
                result: "str | BaseException" = self.reader.read(job.audio)
            except Exception as exc:  # noqa: BLE001 - this reading's stream fails, the worker goes on
                result = exc
            with self._ready:
                self.busy -= 1
                self.readings += 1
                self.read_seconds += time.perf_counter() - started
            try:
                done(job, result)
            except Exception:  # noqa: BLE001 - a consumer's bug must not stop every stream's readings
                log.exception("delivering a reading failed")


class InlineRecognizer:
    """One stream, read inline: the SSM Recognizer's events through a TurnReader, for the
    benchmark. Readings run at once, but are booked on a virtual clock in seconds of stream
    audio: a reading asked at t starts when the (single) reader is free and its events carry
    its end time (event_times), so lags include the compute a real stream would wait for."""

    def __init__(self, ssm, reader: WhisperReader, vad: Optional[VadStream] = None) -> None:
        self.ssm, self.reader = ssm, reader
        self.jobs: list[Job] = []
        self.turns = TurnReader(self.jobs.append, lambda: self.busy_until <= self.now, vad)
        self.now = self.busy_until = self.compute_s = 0.0
        self.event_times: list[float] = []

    def push(self, audio: np.ndarray) -> list[SttEvent]:
        audio = np.asarray(audio, np.float32)
        self.now += len(audio) / SAMPLE_RATE
        timed = [(self.now, e) for e in self.turns.push(audio) + self.turns.on_events(self.ssm.push(audio))]
        return self._out(timed + self._read())

    def flush(self) -> list[SttEvent]:
        self.ssm.flush()  # (its Final gives way to the reading of the turn)
        timed = [(self.now, e) for e in self.turns.flush()]
        return self._out(timed + self._read())

    def _read(self) -> list[tuple[float, SttEvent]]:
        timed = []
        while self.jobs:
            job = self.jobs.pop(0)
            started = time.perf_counter()
            text = self.reader.read(job.audio)
            seconds = time.perf_counter() - started
            self.compute_s += seconds
            self.busy_until = max(self.busy_until, job.requested_at) + seconds
            timed += [(self.busy_until, e) for e in self.turns.on_reading(job, text)]
        return timed

    def _out(self, timed: list[tuple[float, SttEvent]]) -> list[SttEvent]:
        # Words and turn ends cannot come before the reading they rest on is done:
        self.event_times = [max(t, self.busy_until) if isinstance(e, (Partial, Final, EndOfTurn)) else t
                            for t, e in timed]
        return [e for _, e in timed]
