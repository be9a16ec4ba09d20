"""Who reads a stream's turns with Whisper: a worker thread for the runtime, inline for the benchmark.

TurnReader (engine/whisper_stream.py) decides what to read and when; these run the readings
(engine/whisper.py) and hand the text back to it. A pause reading also asks the pause head
(engine/pause_head.py) whether the voice sounded finished, from the same encoding.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from typing import Callable, Optional, Union

import numpy as np

from .interface import EndOfTurn, Final, Partial, SttEvent
from .pause_head import PauseHead, load_pause_head
from .vad import VadStream
from .whisper import SAMPLE_RATE, WhisperReader
from .whisper_stream import PAUSE, Job, TurnReader
from .worker_pool import WorkerPool, hand_over

ReadingDone = Callable[[Job, "str | BaseException"], None]
PauseHeadChoice = Union[PauseHead, None, str]  # a head, None (none), or "shipped"


def resolve_pause_head(choice: PauseHeadChoice) -> Optional[PauseHead]:
    return load_pause_head() if choice == "shipped" else choice  # type: ignore[return-value]


def read_job(reader: WhisperReader, head: Optional[PauseHead], job: Job) -> str:
    """The job's words; a pause reading also asks the head whether the voice ended (job.voice_ended)."""
    if job.kind == PAUSE and head is not None:
        job.voice_ended = head.calls_end(reader, job.audio)
    return reader.read(job.audio)


class ReadingWorker(WorkerPool):
    """Every stream's readings on `threads` threads (CTranslate2 computes without the GIL),
    final readings before partial ones, oldest first."""

    def __init__(self, reader: WhisperReader, threads: int = 1, pause_head: PauseHeadChoice = "shipped") -> None:
        super().__init__(threads, "whisper-reader")
        self.reader = reader
        self.pause_head = resolve_pause_head(pause_head)
        self._queue: list[tuple[int, int, Job, ReadingDone]] = []
        self._order = itertools.count()
        self.busy = 0
        self.readings = 0
        self.read_seconds = 0.0
        self.waits: collections.deque = collections.deque(maxlen=4096)  # seconds recent readings queued
        self.start()

    def submit(self, job: Job, done: ReadingDone) -> None:
        job.queued_at = time.perf_counter()
        self._queue_up(lambda: heapq.heappush(self._queue, (job.kind, next(self._order), job, done)))

    def has_room(self) -> bool:
        """A partial reading would start at once: partials thin out by themselves under load."""
        return not self._queue and self.busy < self.threads

    def _queued(self) -> bool:
        return bool(self._queue)

    def _take(self) -> tuple[Job, ReadingDone]:
        _, _, job, done = heapq.heappop(self._queue)
        self.busy += 1
        return job, done

    def _work(self, item: tuple[Job, ReadingDone]) -> None:
        job, done = item
        started = time.perf_counter()
        self.waits.append(started - job.queued_at)
        try:
            result: "str | BaseException" = read_job(self.reader, self.pause_head, job)
        except Exception as exc:  # noqa: BLE001 - this reading's stream fails, the worker goes on
            result = exc
        job.seconds = time.perf_counter() - started
        with self._ready:
            self.busy -= 1
            self.readings += 1
            self.read_seconds += job.seconds
        hand_over(done, job, result, what="a reading")


class InlineRecognizer:
    """One stream, read inline: the SSM Recognizer's events through a TurnReader, for the
    benchmark. Readings run at once, but are booked on a virtual clock in seconds of stream
    audio: a reading asked at t starts when the (single) reader is free and its events carry
    its end time (event_times), so lags include the compute a real stream would wait for. A
    reading costs its CPU time (one thread), not its wall time: another process on the machine
    does not make it look slower."""

    def __init__(self, ssm, reader: WhisperReader, vad: Optional[VadStream] = None,
                 pause_head: PauseHeadChoice = "shipped", ssm_ends: bool = True) -> None:
        """pause_head: the head that hears ends at pauses (None: none); ssm_ends: the SSM's
        end-of-turn head is a cue too (engine.bench stt --turn-cues compares them)."""
        self.ssm, self.reader = ssm, reader
        self.pause_head = resolve_pause_head(pause_head)
        self.jobs: list[Job] = []
        self.turns = TurnReader(self.jobs.append, lambda: self.busy_until <= self.now, vad)
        if ssm_ends and getattr(ssm, "decoder", None) is not None:  # its end-of-turn head weighs Whisper's words
            self.turns.advise(ssm.decoder)
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
            started = time.process_time()  # CPU time: what one free core would take, on a shared machine too
            text = read_job(self.reader, self.pause_head, job)
            seconds = job.seconds = time.process_time() - started
            self.compute_s += seconds
            self.busy_until = max(self.busy_until, job.requested_at) + seconds
            timed += [(self.busy_until, e) for e in self.turns.on_reading(job, text)]
        return timed

    def _out(self, timed: list[tuple[float, SttEvent]]) -> list[SttEvent]:
        # Words and turn ends cannot come before the reading they rest on is done:
        self.event_times = [max(t, self.busy_until) if isinstance(e, (Partial, Final, EndOfTurn)) else t
                            for t, e in timed]
        return [e for _, e in timed]
