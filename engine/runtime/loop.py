"""The batched inference loop: one tick per frame period, on its own thread, for every stream
(docs/architecture.md, "The engine contract").

SSM states are fixed-size, so all callers share one forward pass per tick. Each model joins
the tick through a Stepper: STT (stt_stream.py) and TTS (tts_stream.py), whose renders run
on their own thread. Runtime.tick() can also be called directly, which is how tests drive it
without depending on timing.

A reply's first text wakes the loop for an early tick, so time to first audio does not wait
for the next period; so does a completed STT frame while the loop is lightly loaded (under
EARLY_TICK_BUSY of its time spent ticking), so the caller's onset reaches barge-in without
waiting either. Under load, frames wait for the period and batch. Admission control compares
tick durations with the tick budget (the frame period) so the gateway can refuse new calls
before admitted ones fall behind.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..blas import single_threaded_blas
from ..interface import EngineStats
from ..models import DEFAULT_TURN_CUES
from ..stt import FRAME_S, SHIPPED, LmChoice, SttModel, TurnsChoice, load_model
from ..tts import TtsModel
from ..vad import SileroVad
from ..whisper_readers import ReadingWorker
from .slots import Stepper, StepReport
from .stt_stream import MAX_FRAMES_PER_TICK, RuntimeSttStream, SttStepper
from .tts_stream import TTS_MAX_LEAD_S, RuntimeTtsStream, TtsStepper

log = logging.getLogger("engine.runtime")

ADMIT_LOAD = 0.8  # admit while p95 tick time < 80% of the budget: the next stream must still fit
ADMISSION_WINDOW = 50  # ticks (2 s) that admission looks back over; also the Retry-After
ADMISSION_MIN_TICKS = 5  # fewer recent ticks than this say nothing yet
STATS_WINDOW = 1500  # ticks (60 s) behind the tick-time percentiles
LAG_WINDOW = 65536  # frame lags behind the lag percentiles
TICK_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)  # histogram upper bounds
KEEP_FP32 = ("decay_param",)  # in bf16 a 0.999 decay would move by ~3%: long memories change
EARLY_TICK_BUSY = 0.5  # below this share of the last second spent ticking, a frame is stepped as soon
# as its audio is in (STT lag p50 7 ms instead of 25-40 for 1-4 full-duplex calls here); above it
# frames wait for the period, so that streams batch together and capacity is what it was
BUSY_WINDOW_S = 1.0

RuntimeStats = EngineStats  # what Runtime.stats() gives: the contract's figures (engine/interface.py)


# -- device and precision --------------------------------------------------------------------

def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    """Half-precision weights on CUDA (bf16 where supported), fp32 on CPU; states are fp32 anyway."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def prepare_model(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move and cast the model in place for inference; decay parameters stay fp32."""
    model.eval().to(device)
    for name, parameter in model.named_parameters():
        if not name.endswith(KEEP_FP32):
            parameter.data = parameter.data.to(dtype)
    return model


# -- metrics ----------------------------------------------------------------------------------

class RecentValues:
    """The last `size` values of a measure, in a numpy ring (for percentiles, order is moot).

    A deque of 65536 lags made into a list, then an array, for each percentile cost a /metrics
    scrape 17 ms of the event loop's CPU with the window full; a copy of this ring takes
    a fraction of a millisecond.
    """

    def __init__(self, size: int) -> None:
        self._ring = np.empty(size)
        self._written = 0  # values ever added; the newest is at (_written - 1) % size

    def extend(self, values: Sequence[float]) -> None:
        size = len(self._ring)
        values = np.asarray(values, dtype=float)[-size:]
        start = self._written % size
        head = min(len(values), size - start)
        self._ring[start:start + head] = values[:head]
        self._ring[:len(values) - head] = values[head:]
        self._written += len(values)

    def append(self, value: float) -> None:
        self._ring[self._written % len(self._ring)] = value
        self._written += 1

    def values(self) -> np.ndarray:
        """A copy of the values held, oldest first."""
        size = len(self._ring)
        if self._written <= size:
            return self._ring[:self._written].copy()
        start = self._written % size
        return np.concatenate((self._ring[start:], self._ring[:start]))

    def __len__(self) -> int:
        return min(self._written, len(self._ring))


class TickMetrics:
    """Tick durations, batch sizes and frame lags; written by the tick, read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.ticks = self.late_ticks = self.frames = self.steps = self.last_batch = self.backlog = 0
            self.seconds_sum = 0.0
            self.buckets = [0] * (len(TICK_BUCKETS_S) + 1)
            self.durations = RecentValues(STATS_WINDOW)
            self.admission_window: collections.deque = collections.deque(maxlen=ADMISSION_WINDOW)
            self.lags = RecentValues(LAG_WINDOW)
            self.ttfas = RecentValues(LAG_WINDOW)
            self.late_audio_chunks = 0

    def record(self, duration: float, budget: float, reports: list[StepReport]) -> None:
        batches = [rows for report in reports for rows in report.batches]
        with self._lock:
            self.ticks += 1
            self.late_ticks += duration > budget
            self.seconds_sum += duration
            self.buckets[int(np.searchsorted(TICK_BUCKETS_S, duration))] += 1
            self.durations.append(duration)
            self.admission_window.append(duration)
            self.frames += sum(batches)
            self.steps += len(batches)
            self.last_batch = max(batches, default=0)
            self.backlog = max((report.backlog for report in reports), default=0)
            for report in reports:
                self.lags.extend(report.lags)
                self.ttfas.extend(report.ttfas)
                self.late_audio_chunks += report.late_audio_chunks

    def recent(self) -> list[float]:
        """The last ADMISSION_WINDOW tick times since the loop last went idle."""
        with self._lock:
            return list(self.admission_window)

    def went_idle(self) -> None:
        """Nothing to step: the ticks before say nothing about the next stream's. (Kept, the
        slow ticks of a busy spell that ended with its last call would refuse every call after
        it, for no tick comes to replace them while no stream is open.)"""
        with self._lock:
            self.admission_window.clear()

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        with self._lock:
            counters = dict(ticks=self.ticks, late_ticks=self.late_ticks, seconds_sum=self.seconds_sum,
                            buckets=list(self.buckets), frames=self.frames, steps=self.steps,
                            last_batch=self.last_batch, backlog=self.backlog, ttfas=self.ttfas.values(),
                            late_audio_chunks=self.late_audio_chunks)
            return self.durations.values(), self.lags.values(), counters


def _percentile_ms(values: np.ndarray, q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 3) if len(values) else None


# -- the loop and admission -------------------------------------------------------------------

class Runtime:
    """The batched inference loop: a state pool per model, one tick per frame period, on its thread."""

    def __init__(self, stt_model: SttModel, *, tts_model: Optional[TtsModel] = None, max_streams: int = 64,
                 device: str = "auto", dtype: Optional[torch.dtype] = None, tick_s: float = FRAME_S,
                 num_threads: Optional[int] = None, max_frames_per_tick: int = MAX_FRAMES_PER_TICK,
                 admit_load: float = ADMIT_LOAD, tts_max_lead_s: float = TTS_MAX_LEAD_S, lm: LmChoice = SHIPPED,
                 turns: TurnsChoice = SHIPPED, precision: str = "auto",
                 turn_end_probability: Optional[float] = None,
                 words: Optional[tuple[ReadingWorker, SileroVad]] = None,
                 turn_cues: str = DEFAULT_TURN_CUES) -> None:
        """Takes the models over (moves and casts the STT model in place; TTS stays fp32).
        num_threads sets torch's CPU threads for the whole process; tick_s is both the tick
        period and the budget a tick must fit in; tts_max_lead_s is how far a reply's audio may
        run ahead of real time (tests that drive tick() by hand lift it); lm is the language model
        of the final transcripts (the shipped one; None decodes greedily), turns the
        turn-completion table that weighs on turn ends (the shipped one; None: the acoustic head alone),
        precision how the STT model steps (engine.stt.streaming_model: int8 matrices on CPU by default),
        turn_end_probability the P(end) that closes a caller's turn (engine.stt.StreamDecoder),
        words a Whisper reading worker and VAD that read the callers' words (closed with the runtime),
        turn_cues which heads confirm turn ends at pauses (engine.turn_cues.TURN_CUES; the pause head
        itself is the reading worker's)."""
        if num_threads:
            torch.set_num_threads(num_threads)
        single_threaded_blas()  # numpy's products here are small; its spare threads would only spin
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.tick_s, self.admit_load = tick_s, admit_load
        model = prepare_model(stt_model, self.device, self.dtype)
        self.stt = SttStepper(model, max_streams, self.device, self.dtype, max_frames_per_tick, self._frame_ready,
                               lm, turns, precision, turn_end_probability, words, turn_cues)
        self.tts = (TtsStepper(tts_model, max_streams, self.device, self._wake_now, tts_max_lead_s)
                    if tts_model is not None else None)
        self.steppers: list[Stepper] = [self.stt] + ([self.tts] if self.tts else [])
        self.metrics = TickMetrics()
        self.behind_s = 0.0
        self._tick_lock = threading.Lock()
        self._stop, self._wake = threading.Event(), threading.Event()  # _wake: tick now (idle, or a reply's first text)
        self._recent_ticks: collections.deque = collections.deque()  # (ended, seconds) within BUSY_WINDOW_S
        self._lightly_loaded = True
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    @classmethod
    def from_shipped(cls, path: Optional[Path] = None, **options: Any) -> "Runtime":
        """A runtime over the shipped STT weights; FileNotFoundError when they are not there."""
        return cls(load_model(path), **options)

    def open_stt(self, session_id: str) -> RuntimeSttStream:
        """A new stream on a zeroed slot; CapacityError when all max_streams slots are taken."""
        if self._closed:
            raise RuntimeError("the runtime is closed")
        stream = self.stt.open(session_id)
        self._wake.set()
        return stream

    def open_tts(self, session_id: str) -> RuntimeTtsStream:
        """A reply's synthesis on a zeroed slot; CapacityError when all slots are taken."""
        if self.tts is None:
            raise RuntimeError("this runtime was built without text-to-speech")
        if self._closed:
            raise RuntimeError("the runtime is closed")
        stream = self.tts.open(session_id)
        self._wake.set()
        return stream

    def _wake_now(self) -> None:
        self._wake.set()

    def _frame_ready(self) -> None:
        if self._lightly_loaded:
            self._wake.set()

    def tick(self) -> list[StepReport]:
        """Step every model's ready streams once (frames up to max_frames_per_tick each); thread-safe."""
        with self._tick_lock:
            started = time.perf_counter()
            reports = [stepper.step() for stepper in self.steppers]
            ended = time.perf_counter()
            self.metrics.record(ended - started, self.tick_s, reports)
            self._update_load(ended, ended - started)
        return reports

    def _update_load(self, ended: float, seconds: float) -> None:
        ticks = self._recent_ticks
        ticks.append((ended, seconds))
        while ticks[0][0] < ended - BUSY_WINDOW_S:
            ticks.popleft()
        self._lightly_loaded = sum(s for _, s in ticks) < EARLY_TICK_BUSY * BUSY_WINDOW_S

    def warm_up(self) -> None:
        for stepper in self.steppers:
            stepper.warm_up()

    def start(self) -> None:
        if self._thread is None:
            # Everything loaded so far (torch, models, the LM's n-gram table) lives as long as the
            # process: keep it out of the cyclic GC, whose full passes over it took 70-80 ms and
            # came often once the beam search allocated per frame (ticks ran late).
            gc.collect()
            gc.freeze()
            self._stop.clear()
            if self.tts is not None:
                self.tts.start_worker()
            self._thread = threading.Thread(target=self._run, name="engine-runtime", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop and end every open stream (their events() finish)."""
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("runtime thread did not stop within %.1f s", timeout)
            self._thread = None
        if self.tts is not None:
            self.tts.stop_worker()
        for stepper in self.steppers:
            stepper.close_all()
        if self.stt.words is not None:
            self.stt.words[0].close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        deadline = time.perf_counter()
        while not self._stop.is_set():
            if not any(stepper.busy() for stepper in self.steppers):
                self.behind_s = 0.0
                self.metrics.went_idle()
                self._wake.wait(0.5)
                self._wake.clear()
                deadline = time.perf_counter()
                continue
            scheduled = time.perf_counter() >= deadline  # else an early tick, for a reply's first audio
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a bug here must not stop every call's audio
                log.exception("runtime tick failed")
            now = time.perf_counter()
            if scheduled:
                deadline += self.tick_s
                self.behind_s = max(0.0, now - deadline)
                if self.behind_s > self.tick_s:
                    deadline = now  # no burst of back-to-back ticks: each tick already catches up per stream
            self._wake.wait(max(0.0, deadline - now))
            self._wake.clear()

    def admission(self) -> tuple[bool, float]:
        """(admit a new stream now?, seconds before asking again).

        No when a model has no free slot (a call needs one in each), when the p95 of the last
        ADMISSION_WINDOW tick times (since the loop last had nothing to step) is over
        admit_load x the budget, when the TTS renderer was
        busy more than admit_load of its recent time, or when the loop has fallen more than a
        tick behind its schedule.
        """
        retry_after_s = ADMISSION_WINDOW * self.tick_s  # the window has turned over by then
        if any(stepper.free_slots() == 0 for stepper in self.steppers):
            return False, retry_after_s
        recent = self.metrics.recent()
        if len(recent) >= ADMISSION_MIN_TICKS and np.percentile(recent, 95) > self.admit_load * self.tick_s:
            return False, retry_after_s
        if self.tts is not None and self.tts.overloaded(time.perf_counter(), self.admit_load):
            return False, retry_after_s
        if self.behind_s > self.tick_s:
            return False, retry_after_s
        return True, 0.0

    def stats(self) -> EngineStats:
        durations, lags, c = self.metrics.snapshot()
        cumulative = np.cumsum(c["buckets"]).tolist()
        return EngineStats(
            ticks=c["ticks"], late_ticks=c["late_ticks"], tick_budget_ms=self.tick_s * 1000,
            tick_ms_p50=_percentile_ms(durations, 50), tick_ms_p99=_percentile_ms(durations, 99),
            tick_seconds_sum=c["seconds_sum"],
            tick_histogram=tuple(zip(TICK_BUCKETS_S + (float("inf"),), cumulative)),
            last_batch=c["last_batch"], mean_batch=c["frames"] / c["steps"] if c["steps"] else None,
            frames=c["frames"], lag_ms_p50=_percentile_ms(lags, 50), lag_ms_p95=_percentile_ms(lags, 95),
            behind_ms=self.behind_s * 1000, backlog_frames=c["backlog"],
            streams_open=self.stt.open_streams(), max_streams=self.stt.max_streams,
            streams_failed=self.stt.failed + (self.tts.failed if self.tts else 0),
            state_bytes_per_stream=self.stt.pool.bytes_per_slot() + (self.tts.bytes_per_slot() if self.tts else 0),
            tts_streams_open=self.tts.open_streams() if self.tts else 0,
            ttfa_ms_p50=_percentile_ms(c["ttfas"], 50), ttfa_ms_p95=_percentile_ms(c["ttfas"], 95),
            late_audio_chunks=c["late_audio_chunks"],
            gpu_memory_bytes=int(torch.cuda.memory_allocated(self.device)) if self.device.type == "cuda" else None)

