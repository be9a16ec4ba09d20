"""One batched inference loop for every stream (ARCHITECTURE.md, "Engine contract").

SSM states are fixed-size, so all callers share one forward pass per tick:

    push(pcm) ─► inbox ─┐   every tick (FRAME_S = 40 ms), on the runtime's own thread:
    push(pcm) ─► inbox ─┼─► log-mel of all new audio in one call ─► for each frame index: gather
    push(pcm) ─► inbox ─┘   the ready streams' state rows ─► ONE model.step ─► scatter rows back
                              ─► per-stream StreamDecoder ─► EventQueue ─► async events()

A stream is a slot: a row of a StatePool preallocated for max_streams. push() only checks and
queues audio, so it never blocks the caller's event loop; all model and pool work runs on the
runtime thread (torch releases the GIL while it computes). Runtime.tick() can also be called
directly, which is how tests drive it without depending on timing.

Each model joins the tick through a `Stepper`: STT is the only one today; a TTS stepper will
join the same tick. Admission control compares tick durations with the tick budget (the frame
period) so the gateway can refuse new calls before admitted ones fall behind.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .audio import (FRAMES_PER_STEP, HOP_LENGTH, N_FFT, N_MELS, STEP_SAMPLES, FrameStacker, StreamingWindows,
                    log_mel_windows, to_finite_float)
from .interface import SttEvent, TtsStream
from .stt import FRAME_S, StreamDecoder, SttModel, frame_outputs, load_model

log = logging.getLogger(__name__)

MAX_FRAMES_PER_TICK = 8  # per stream: a stream that fell behind catches up fast, yet a tick stays bounded
ADMIT_LOAD = 0.8  # admit while p95 tick time < 80% of the budget: the next stream must still fit
ADMISSION_WINDOW = 50  # ticks (2 s) that admission looks back over; also the Retry-After
ADMISSION_MIN_TICKS = 5  # fewer recent ticks than this say nothing yet
STATS_WINDOW = 1500  # ticks (60 s) behind the tick-time percentiles
LAG_WINDOW = 65536  # frame lags behind the lag percentiles
TICK_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)  # histogram upper bounds
KEEP_FP32 = ("decay_param",)  # in bf16 a 0.999 decay would move by ~3%: long memories change
WARM_UP_ROWS = 8


class CapacityError(RuntimeError):
    """Every slot is taken: the runtime already carries max_streams streams."""


class StreamFailed(RuntimeError):
    """This stream was closed by an error in its own audio or decoding; other streams carry on."""


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


# -- state pool and event channel --------------------------------------------------------------

class StatePool:
    """Every stream's model state, preallocated: each state tensor as one [capacity, ...] tensor.

    `template` is a model's state for a batch of one, a list of dataclasses of tensors (e.g.
    list[BlockState]); a stream's state is row `slot` of every tensor. Float states are fp32.
    """

    def __init__(self, template: Sequence[Any], capacity: int) -> None:
        self.capacity = capacity
        self._kinds = [type(layer) for layer in template]
        self.layers = [{f.name: _rows_like(getattr(layer, f.name), capacity) for f in dataclasses.fields(layer)}
                       for layer in template]

    def gather(self, slots: Tensor) -> list[Any]:
        return [kind(**{name: pool.index_select(0, slots) for name, pool in layer.items()})
                for kind, layer in zip(self._kinds, self.layers)]

    def scatter(self, slots: Tensor, state: Sequence[Any]) -> None:
        for layer, new in zip(self.layers, state):
            for name, pool in layer.items():
                pool.index_copy_(0, slots, getattr(new, name).to(pool.dtype))

    def zero(self, slots: Tensor) -> None:
        for layer in self.layers:
            for pool in layer.values():
                pool.index_fill_(0, slots, 0)

    def bytes_per_slot(self) -> int:
        return sum(pool[0].numel() * pool.element_size() for layer in self.layers for pool in layer.values())


def _rows_like(tensor: Tensor, capacity: int) -> Tensor:
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return torch.zeros(capacity, *tensor.shape[1:], dtype=dtype, device=tensor.device)


class EventQueue:
    """Items from the runtime thread to one consumer, asyncio or not; put() never blocks."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._waiter: Optional[asyncio.Future] = None

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    async def get(self) -> Any:
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter

    def get_nowait(self) -> list[Any]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


_END = object()  # end of a stream's events
_FLUSH = object()  # inbox marker: finalise the turn once the audio before it is decoded


# -- speech-to-text ---------------------------------------------------------------------------

class RuntimeSttStream:
    """One caller's speech-to-text on the shared runtime (implements interface.SttStream)."""

    def __init__(self, stepper: "SttStepper", session_id: str, slot: int) -> None:
        self.session_id, self.slot = session_id, slot
        self.error: Optional[StreamFailed] = None
        self.closed = False
        self._stepper = stepper
        self._inbox: collections.deque = collections.deque()  # float32 audio pieces and _FLUSH
        self._arrivals: collections.deque = collections.deque()  # (samples pushed so far, when)
        self.pushed_samples = 0
        # Runtime-thread side:
        self.fresh = True  # slot not zeroed yet
        self.flush_pending = False
        self.windows, self.stacker, self.decoder = StreamingWindows(), FrameStacker(), StreamDecoder()
        self.frames = torch.zeros(0, FRAMES_PER_STEP * N_MELS)  # model frames waiting for a tick
        self.channel = EventQueue()

    def push(self, pcm16k: np.ndarray) -> None:
        """Queue int16 (or float in [-1, 1]) 16 kHz mono; never blocks. NaN/inf audio fails this
        stream (ValueError here, StreamFailed from events()); pushes after close are ignored."""
        if self.closed:
            return
        try:
            audio = to_finite_float(pcm16k).reshape(-1)
        except ValueError as exc:
            self._stepper.release(self, exc)
            raise
        self.pushed_samples += len(audio)
        self._arrivals.append((self.pushed_samples, time.perf_counter()))  # before the audio: see frame_lag
        self._inbox.append(audio)

    def flush(self) -> None:
        """The audio ended for now: a Final for what was heard, after the audio queued so far."""
        self._inbox.append(_FLUSH)

    async def events(self) -> AsyncIterator[SttEvent]:
        """Events in stream order until close(); raises StreamFailed if this stream failed."""
        while True:
            item = await self.channel.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def poll(self) -> list[SttEvent]:
        """The events so far, without waiting (for synchronous callers; see .error)."""
        items = self.channel.get_nowait()
        return [item for item in items if item is not _END and not isinstance(item, BaseException)]

    def close(self) -> None:
        self._stepper.release(self)

    # -- runtime-thread side --

    def take_audio(self) -> Optional[np.ndarray]:
        """Queued audio up to a flush marker (None if none); nothing more until that flush is done."""
        pieces = []
        while self._inbox and not self.flush_pending:
            item = self._inbox.popleft()
            if item is _FLUSH:
                self.flush_pending = True
            else:
                pieces.append(item)
        return np.concatenate(pieces) if pieces else None

    def frame_lag(self, frame: int, now: float) -> Optional[float]:
        """Seconds from the push that completed model frame `frame` until `now`."""
        needed = frame * STEP_SAMPLES + (FRAMES_PER_STEP - 1) * HOP_LENGTH + N_FFT  # its last sample
        while self._arrivals and self._arrivals[0][0] < needed:
            self._arrivals.popleft()
        return now - self._arrivals[0][1] if self._arrivals else None


@dataclass
class StepReport:
    """What one model did in one tick."""

    batches: list[int] = field(default_factory=list)  # rows of each batched step, in order
    lags: list[float] = field(default_factory=list)  # per stepped frame, seconds since its audio arrived
    backlog: int = 0  # most model frames any stream still has waiting after the tick


class Stepper(Protocol):
    """One model's part of every tick (STT now, TTS later). Called only from the tick."""

    def step(self) -> StepReport: ...

    def busy(self) -> bool:
        """Has open streams: the runtime thread sleeps while no stepper is busy."""

    def free_slots(self) -> int: ...

    def warm_up(self) -> None: ...

    def close_all(self) -> None: ...


class SttStepper:
    """STT's part of a tick: features for all new audio, then per frame index one batched step."""

    def __init__(self, model: SttModel, max_streams: int, device: torch.device, dtype: torch.dtype,
                 max_frames_per_tick: int = MAX_FRAMES_PER_TICK) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.max_streams, self.max_frames_per_tick = max_streams, max_frames_per_tick
        self.pool = StatePool(model.initial_state(1, device), max_streams)
        self.failed = 0
        self._streams: dict[int, RuntimeSttStream] = {}
        # A freed slot is reusable at once, even mid-tick: its new stream is zeroed at the start
        # of its first tick, after whatever the tick in flight writes to the old row.
        self._free = list(range(max_streams - 1, -1, -1))  # pop() hands out slot 0 first
        self._lock = threading.Lock()

    def open(self, session_id: str) -> RuntimeSttStream:
        with self._lock:
            if not self._free:
                raise CapacityError(f"all {self.max_streams} STT slots are in use")
            stream = RuntimeSttStream(self, session_id, self._free.pop())
            self._streams[stream.slot] = stream
        return stream

    def release(self, stream: RuntimeSttStream, error: Optional[BaseException] = None) -> None:
        """Close a stream (with `error`: failed) and free its slot; idempotent, from any thread."""
        with self._lock:
            if stream.closed:
                return
            stream.closed = True
            del self._streams[stream.slot]
            self._free.append(stream.slot)
            if error is not None:
                self.failed += 1
                stream.error = StreamFailed(f"STT stream {stream.session_id!r} failed: {error!r}")
                stream.error.__cause__ = error
        if error is not None:
            log.warning("STT stream %s failed: %r", stream.session_id, error)
        stream.channel.put(stream.error or _END)

    def busy(self) -> bool:
        return bool(self._streams)

    def open_streams(self) -> int:
        return len(self._streams)

    def free_slots(self) -> int:
        return len(self._free)

    def close_all(self) -> None:
        for stream in list(self._streams.values()):
            self.release(stream)

    @torch.no_grad()
    def warm_up(self) -> None:
        """One throwaway batched step (kernels, allocator) that touches no slot."""
        rows = min(WARM_UP_ROWS, self.max_streams)
        x = torch.zeros(rows, FRAMES_PER_STEP * N_MELS, device=self.device, dtype=self.dtype)
        self.model.step(x, self.model.initial_state(rows, self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def step(self) -> StepReport:
        with self._lock:
            streams = list(self._streams.values())
        report = StepReport()
        if streams:
            self._zero_fresh(streams)
            self._featurize(streams)
            for _ in range(self.max_frames_per_tick):
                batch = [s for s in streams if not s.closed and len(s.frames)]
                if not batch:
                    break
                self._step_batch(batch, report)
            self._finish_flushes(streams)
            report.backlog = max((len(s.frames) for s in streams if not s.closed), default=0)
        return report

    def forward(self, slots: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """One batched model step for the streams in `slots`: gather, step, scatter -> logits."""
        state = self.pool.gather(slots)
        ctc_logits, eot_logits, state = self.model.step(x, state)
        self.pool.scatter(slots, state)
        return ctc_logits, eot_logits

    def _zero_fresh(self, streams: list[RuntimeSttStream]) -> None:
        fresh = [s for s in streams if s.fresh]
        if fresh:
            self.pool.zero(torch.tensor([s.slot for s in fresh], device=self.device))
            for s in fresh:
                s.fresh = False

    def _featurize(self, streams: list[RuntimeSttStream]) -> None:
        """New audio of every stream -> model frames, with one log-mel call for all of them.

        Batched because it is cheaper: 8.5 ms vs 31 ms per tick for 256 streams on one CPU core
        (per-stream StreamingLogMel calls); and push() stays a queue append on the caller's loop.
        """
        fed, windows = [], []
        for stream in streams:
            try:
                audio = None if stream.closed else stream.take_audio()
                if audio is not None:
                    windows.append(stream.windows.push(audio))
                    fed.append(stream)
            except Exception as exc:  # noqa: BLE001 - this stream's input only
                self.release(stream, exc)
        if not fed:
            return
        mels = log_mel_windows(torch.from_numpy(np.concatenate(windows)))
        for stream, stream_mels in zip(fed, mels.split([len(w) for w in windows])):
            frames = stream.stacker.push(stream_mels)
            if len(frames):
                stream.frames = torch.cat([stream.frames, frames])

    def _step_batch(self, batch: list[RuntimeSttStream], report: StepReport) -> None:
        slots = torch.tensor([s.slot for s in batch], device=self.device)
        x = torch.stack([s.frames[0] for s in batch]).to(self.device, self.dtype)
        for stream in batch:
            stream.frames = stream.frames[1:]
        try:
            ctc_logits, eot_logits = self.forward(slots, x)
        except Exception as exc:  # noqa: BLE001 - the shared step failed: every stream in it did
            log.exception("batched STT step failed for %d streams", len(batch))
            for stream in batch:
                self.release(stream, exc)
            return
        # The step's only copies to the host (and, on CUDA, its only syncs):
        finite = (torch.isfinite(ctc_logits).all(-1) & torch.isfinite(eot_logits).all(-1)).tolist()
        outputs = frame_outputs(ctc_logits, eot_logits)
        now = time.perf_counter()
        for stream, (token, eot), ok in zip(batch, outputs, finite):
            if stream.closed:
                continue
            if not ok:  # rows are independent, so only this stream's state is poisoned
                self.release(stream, FloatingPointError("model output is not finite"))
                continue
            try:
                frame = stream.decoder.frame
                self._emit(stream, stream.decoder.on_frame(token, eot))
            except Exception as exc:  # noqa: BLE001 - this stream's decoding only
                self.release(stream, exc)
                continue
            lag = stream.frame_lag(frame, now)
            if lag is not None:
                report.lags.append(lag)
        report.batches.append(len(batch))

    def _finish_flushes(self, streams: list[RuntimeSttStream]) -> None:
        for stream in streams:
            if stream.flush_pending and not stream.closed and not len(stream.frames):
                stream.flush_pending = False
                self._emit(stream, stream.decoder.flush())

    @staticmethod
    def _emit(stream: RuntimeSttStream, events: list[SttEvent]) -> None:
        for event in events:
            stream.channel.put(event)


# -- the tick loop, metrics and admission --------------------------------------------------------

@dataclass(frozen=True)
class RuntimeStats:
    """Counters and recent percentiles for /metrics (tick figures over the last STATS_WINDOW ticks)."""

    ticks: int
    late_ticks: int  # ticks that took longer than the budget
    tick_budget_ms: float
    tick_ms_p50: Optional[float]
    tick_ms_p99: Optional[float]
    tick_seconds_sum: float
    tick_histogram: tuple[tuple[float, int], ...]  # (upper bound s, cumulative count), last bound inf
    last_batch: int  # rows of the largest batched step in the last tick
    mean_batch: Optional[float]  # rows per batched step since start
    frames: int  # model frames stepped since start, all streams
    lag_ms_p50: Optional[float]  # audio pushed -> its frame stepped, last LAG_WINDOW frames
    lag_ms_p95: Optional[float]
    behind_ms: float  # how far the tick loop is behind its schedule
    backlog_frames: int  # most frames any stream had waiting after the last tick
    streams_open: int
    max_streams: int
    streams_failed: int
    state_bytes_per_stream: int


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
            self.durations: collections.deque = collections.deque(maxlen=STATS_WINDOW)
            self.lags: collections.deque = collections.deque(maxlen=LAG_WINDOW)

    def record(self, duration: float, budget: float, reports: list[StepReport]) -> None:
        batches = [rows for report in reports for rows in report.batches]
        with self._lock:
            self.ticks += 1
            self.late_ticks += duration > budget
            self.seconds_sum += duration
            self.buckets[int(np.searchsorted(TICK_BUCKETS_S, duration))] += 1
            self.durations.append(duration)
            self.frames += sum(batches)
            self.steps += len(batches)
            self.last_batch = max(batches, default=0)
            self.backlog = max((report.backlog for report in reports), default=0)
            for report in reports:
                self.lags.extend(report.lags)

    def recent(self, count: int) -> list[float]:
        with self._lock:
            return list(self.durations)[-count:]

    def snapshot(self) -> tuple[list[float], list[float], dict[str, Any]]:
        with self._lock:
            counters = dict(ticks=self.ticks, late_ticks=self.late_ticks, seconds_sum=self.seconds_sum,
                            buckets=list(self.buckets), frames=self.frames, steps=self.steps,
                            last_batch=self.last_batch, backlog=self.backlog)
            return list(self.durations), list(self.lags), counters


def _percentile_ms(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 3) if values else None


class Runtime:
    """The batched inference loop: a state pool per model, one tick per frame period, on its thread."""

    def __init__(self, stt_model: SttModel, *, max_streams: int = 64, device: str = "auto",
                 dtype: Optional[torch.dtype] = None, tick_s: float = FRAME_S, num_threads: Optional[int] = None,
                 max_frames_per_tick: int = MAX_FRAMES_PER_TICK, admit_load: float = ADMIT_LOAD) -> None:
        """Takes the model over (moves and casts it in place). num_threads sets torch's CPU threads
        for the whole process; tick_s is both the tick period and the budget a tick must fit in."""
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.tick_s, self.admit_load = tick_s, admit_load
        model = prepare_model(stt_model, self.device, self.dtype)
        self.stt = SttStepper(model, max_streams, self.device, self.dtype, max_frames_per_tick)
        self.steppers: list[Stepper] = [self.stt]
        self.metrics = TickMetrics()
        self.behind_s = 0.0
        self._tick_lock = threading.Lock()
        self._stop, self._wake = threading.Event(), threading.Event()
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

    def tick(self) -> list[StepReport]:
        """Step every model's ready streams once (frames up to max_frames_per_tick each); thread-safe."""
        with self._tick_lock:
            started = time.perf_counter()
            reports = [stepper.step() for stepper in self.steppers]
            self.metrics.record(time.perf_counter() - started, self.tick_s, reports)
        return reports

    def warm_up(self) -> None:
        for stepper in self.steppers:
            stepper.warm_up()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
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
        for stepper in self.steppers:
            stepper.close_all()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        deadline = time.perf_counter()
        while not self._stop.is_set():
            if not any(stepper.busy() for stepper in self.steppers):
                self.behind_s = 0.0
                self._wake.wait(0.5)
                self._wake.clear()
                deadline = time.perf_counter()
                continue
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a bug here must not stop every call's audio
                log.exception("runtime tick failed")
            deadline += self.tick_s
            now = time.perf_counter()
            self.behind_s = max(0.0, now - deadline)
            if self.behind_s > self.tick_s:
                deadline = now  # no burst of back-to-back ticks: each tick already catches up per stream
            else:
                self._stop.wait(max(0.0, deadline - now))

    def admission(self) -> tuple[bool, float]:
        """(admit a new stream now?, seconds before asking again).

        No when a model has no free slot (a call needs one in each), when the p95 of the last
        ADMISSION_WINDOW tick times is over admit_load x the budget, or when the loop has fallen
        more than a tick behind its schedule.
        """
        retry_after_s = ADMISSION_WINDOW * self.tick_s  # the window has turned over by then
        if any(stepper.free_slots() == 0 for stepper in self.steppers):
            return False, retry_after_s
        recent = self.metrics.recent(ADMISSION_WINDOW)
        if len(recent) >= ADMISSION_MIN_TICKS and np.percentile(recent, 95) > self.admit_load * self.tick_s:
            return False, retry_after_s
        if self.behind_s > self.tick_s:
            return False, retry_after_s
        return True, 0.0

    def stats(self) -> RuntimeStats:
        durations, lags, c = self.metrics.snapshot()
        cumulative = np.cumsum(c["buckets"]).tolist()
        return RuntimeStats(
            ticks=c["ticks"], late_ticks=c["late_ticks"], tick_budget_ms=self.tick_s * 1000,
            tick_ms_p50=_percentile_ms(durations, 50), tick_ms_p99=_percentile_ms(durations, 99),
            tick_seconds_sum=c["seconds_sum"],
            tick_histogram=tuple(zip(TICK_BUCKETS_S + (float("inf"),), cumulative)),
            last_batch=c["last_batch"], mean_batch=c["frames"] / c["steps"] if c["steps"] else None,
            frames=c["frames"], lag_ms_p50=_percentile_ms(lags, 50), lag_ms_p95=_percentile_ms(lags, 95),
            behind_ms=self.behind_s * 1000, backlog_frames=c["backlog"],
            streams_open=self.stt.open_streams(), max_streams=self.stt.max_streams,
            streams_failed=self.stt.failed, state_bytes_per_stream=self.stt.pool.bytes_per_slot())


# -- the engine ---------------------------------------------------------------------------------

class SpeechEngine:
    """interface.Engine over one Runtime: what the gateway opens streams on.

        engine = SpeechEngine()            # shipped weights; FileNotFoundError if not trained yet
        await asyncio.to_thread(engine.start)   # warm-up + loop thread; then engine.ready
        ok, retry_after_s = engine.admission()  # before accepting a call: 503 + Retry-After if not ok
        stream = engine.open_stt(session_id)
    """

    def __init__(self, stt_model: Optional[SttModel] = None, *, weights_path: Optional[Path] = None,
                 tts_model: Optional[nn.Module] = None, tts_weights_path: Optional[Path] = None,
                 with_tts: bool = False, **runtime_options: Any) -> None:
        """with_tts (or a tts_model) adds speech synthesis: the shipped TTS weights unless a
        path or model is given (FileNotFoundError when there are none)."""
        model = stt_model if stt_model is not None else load_model(weights_path)
        self.runtime = Runtime(model, **runtime_options)
        if tts_model is None and (with_tts or tts_weights_path is not None):
            from .tts import load_model as load_tts

            tts_model = load_tts(tts_weights_path)
        self.tts_model = tts_model
        self._ready = False

    def start(self) -> None:
        """Warm up on the device and start the tick loop (blocks for the warm-up)."""
        self.runtime.warm_up()
        if self.tts_model is not None:
            from .tts import synthesize_offline

            audio, _ = synthesize_offline(self.tts_model, "Hello, how can I help?")
            if len(audio) == 0 or not np.all(np.isfinite(audio.astype(np.float32))):
                raise RuntimeError("TTS warm-up produced no usable audio")
        self.runtime.start()
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready and self.runtime.running

    def open_stt(self, session_id: str) -> RuntimeSttStream:
        return self.runtime.open_stt(session_id)

    def open_tts(self, session_id: str, voice: str = "") -> TtsStream:
        """A streaming synthesizer for one reply (per stream for now: TTS is not yet batched
        into the tick; its work runs on the default executor, off the event loop)."""
        if self.tts_model is None:
            raise RuntimeError("this engine was built without text-to-speech")
        from .tts import TtsStream as SynthesisStream

        return SynthesisStream(self.tts_model)

    def admission(self) -> tuple[bool, float]:
        return self.runtime.admission()

    def stats(self) -> RuntimeStats:
        return self.runtime.stats()

    def close(self) -> None:
        self._ready = False
        self.runtime.close()
