"""One batched inference loop for every stream (docs/architecture.md, "The engine contract").

SSM states are fixed-size, so all callers share one forward pass per tick:

    push(pcm) ─► inbox ─┐   every tick (FRAME_S = 40 ms), on the runtime's own thread:
    push(pcm) ─► inbox ─┼─► log-mel of all new audio in one call ─► for each frame index: gather
    push(pcm) ─► inbox ─┘   the ready streams' state rows ─► ONE model.step ─► scatter rows back
                              ─► per-stream StreamDecoder ─► EventQueue ─► async events()

A stream is a slot: a row of a StatePool preallocated for max_streams. push() only checks and
queues audio, so it never blocks the caller's event loop; all model and pool work runs on the
runtime thread (torch releases the GIL while it computes). Runtime.tick() can also be called
directly, which is how tests drive it without depending on timing.

Each model joins the tick through a `Stepper`. TTS is the second one:

    push_text ─► inbox ─► phonemes ─► encoder (per stream, a phrase at a time) ─► prior frames
      ─► every stream that needs audio: its next chunk (8, 16, then 32 frames, with context) ─► ONE
         call of Piper's flow + decoder per chunk shape, on the render thread ─► WordMark, Audio

A reply's first text wakes the loop for an early tick, so time to first audio does not wait
for the next period; so does a completed STT frame while the loop is lightly loaded (under
EARLY_TICK_BUSY of its time spent ticking), so the caller's onset reaches barge-in without
waiting either. Under load, frames wait for the period and batch. Admission control compares
tick durations with the tick budget (the frame period) so the gateway can refuse new calls
before admitted ones fall behind.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Protocol, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from .audio import (FRAMES_PER_STEP, HOP_LENGTH, N_FFT, N_MELS, STEP_SAMPLES, FrameStacker, StreamingWindows,
                    log_mel_rows, to_finite_float)
from .interface import Audio, SttEvent, TtsEvent, WordMark
from .stt import (FRAME_S, SHIPPED, LmChoice, StreamDecoder, SttModel, TurnsChoice, check_turn_end_probability,
                  frame_outputs, load_model, resolve_lm, resolve_turns, streaming_model)
from .text import MAX_PENDING_CHARS
from .models import DEFAULT_STT_MODEL, SSM, WHISPER, check_stt_model
from .vad import SileroVad
from .whisper import WhisperReader
from .whisper_stream import ReadingWorker, TurnReader
from .tts import SAMPLE_RATE as TTS_SAMPLE_RATE, Chunk, Schedule, TtsModel, encode_ids, render, synthesize_offline, to_int16

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
EARLY_TICK_BUSY = 0.5  # below this share of the last second spent ticking, a frame is stepped as soon
# as its audio is in (STT lag p50 7 ms instead of 25-40 for 1-4 full-duplex calls here); above it
# frames wait for the period, so that streams batch together and capacity is what it was
BUSY_WINDOW_S = 1.0


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
    """Half-precision states are kept in fp32; fp64 ones and integers as they are."""
    dtype = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype
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
        self._complete_frames = 0  # model frames whose audio has all been pushed
        # Runtime-thread side:
        self.fresh = True  # slot not zeroed yet
        self.flush_pending = False
        self.windows, self.stacker, self.decoder = StreamingWindows(), FrameStacker(), StreamDecoder(
            stepper.lm, stepper.turns, stepper.turn_end_probability)
        self.frames = torch.zeros(0, FRAMES_PER_STEP * N_MELS)  # model frames waiting for a tick
        self.channel = EventQueue()
        # With a Whisper reader (stt_model "whisper-tiny.en"): the SSM's events and this stream's
        # audio go through a TurnReader, whose readings come back on the reader's thread.
        self.turns: Optional[TurnReader] = None
        self._turns_lock = threading.Lock()

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
        complete = max(0, (self.pushed_samples - frame_end_sample(0)) // STEP_SAMPLES + 1)
        if complete > self._complete_frames:
            self._complete_frames = complete
            self._stepper.frame_ready()

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

    def on_audio(self, audio: np.ndarray) -> None:
        """This stream's new audio, as the tick takes it (before its frames are stepped)."""
        if self.turns is not None:
            with self._turns_lock:
                self._put(self.turns.push(audio))

    def emit(self, events: list[SttEvent], flushed: bool = False) -> None:
        """The SSM decoder's events (of a frame, or of a flush) to the consumer."""
        if self.turns is not None:
            with self._turns_lock:
                # A flush's Final gives way to the reading of the turn
                events = self.turns.flush() if flushed else self.turns.on_events(events)
        self._put(events)

    def on_reading(self, job: Any, result: Any) -> None:
        """A Whisper reading of this stream's audio is done (on the reader's thread)."""
        if self.closed:
            return
        if isinstance(result, BaseException):
            self._stepper.release(self, result)
            return
        with self._turns_lock:
            events = self.turns.on_reading(job, result)
        self._put(events)

    def _put(self, events: list[SttEvent]) -> None:
        for event in events:
            self.channel.put(event)

    def frame_lag(self, frame: int, now: float) -> Optional[float]:
        """Seconds from the push that completed model frame `frame` until `now`."""
        needed = frame_end_sample(frame)
        while self._arrivals and self._arrivals[0][0] < needed:
            self._arrivals.popleft()
        return now - self._arrivals[0][1] if self._arrivals else None


def frame_end_sample(frame: int) -> int:
    """Samples a stream needs for model frame `frame`: its last log-mel window's end."""
    return frame * STEP_SAMPLES + (FRAMES_PER_STEP - 1) * HOP_LENGTH + N_FFT


@dataclass
class StepReport:
    """What one model did in one tick."""

    batches: list[int] = field(default_factory=list)  # rows of each batched step, in order
    lags: list[float] = field(default_factory=list)  # per stepped frame, seconds since its audio arrived
    backlog: int = 0  # most model frames any stream still has waiting after the tick
    ttfas: list[float] = field(default_factory=list)  # TTS: seconds from a reply's first text to its first audio
    late_audio_chunks: int = 0  # TTS: chunks that came after their playout time


class Stepper(Protocol):
    """One model's part of every tick (STT, TTS). Called only from the tick."""

    def step(self) -> StepReport: ...

    def busy(self) -> bool:
        """Has open streams: the runtime thread sleeps while no stepper is busy."""

    def free_slots(self) -> int: ...

    def warm_up(self) -> None: ...

    def close_all(self) -> None: ...


class SlotTable:
    """The slots of one model's state pool: handed out to streams, taken back on close or on a
    stream's failure. Shared by both steppers; streams carry slot, session_id, closed, error
    and channel."""

    kind = ""  # "STT", "TTS": for messages

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self.failed = 0
        self._streams: dict[int, Any] = {}
        # A freed slot is reusable at once, even mid-tick: its new stream is zeroed at the start
        # of its first tick, after whatever the tick in flight writes to the old row.
        self._free = list(range(max_streams - 1, -1, -1))  # pop() hands out slot 0 first
        self._lock = threading.Lock()

    def _open(self, make: Callable[[int], Any]) -> Any:
        with self._lock:
            if not self._free:
                raise CapacityError(f"all {self.max_streams} {self.kind} slots are in use")
            stream = make(self._free.pop())
            self._streams[stream.slot] = stream
        return stream

    def release(self, stream: Any, error: Optional[BaseException] = None) -> None:
        """Close a stream (with `error`: failed) and free its slot; idempotent, from any thread."""
        with self._lock:
            if stream.closed:
                return
            stream.closed = True
            del self._streams[stream.slot]
            self._free.append(stream.slot)
            if error is not None:
                self.failed += 1
                stream.error = StreamFailed(f"{self.kind} stream {stream.session_id!r} failed: {error!r}")
                stream.error.__cause__ = error
        if error is not None:
            log.warning("%s stream %s failed: %r", self.kind, stream.session_id, error)
        stream.channel.put(stream.error or _END)

    def streams(self) -> list:
        with self._lock:
            return list(self._streams.values())

    def busy(self) -> bool:
        return bool(self._streams)

    def open_streams(self) -> int:
        return len(self._streams)

    def free_slots(self) -> int:
        return len(self._free)

    def close_all(self) -> None:
        for stream in self.streams():
            self.release(stream)


# Batched steps of this many streams or more run the fp32 model, by the int8 kernel in use
# (bench/stt_step.py, one thread): torch's is 1.3x the fp32 model at 16 rows
# and slower from 64; Parley's is 2.4x at 16, 1.3x at 64, 1.05x at 256 and 0.93x at 512.
INT8_MAX_ROWS = {"torch": 64, "parley": 256}


class SttStepper(SlotTable):
    """STT's part of a tick: features for all new audio, then per frame index one batched step."""

    kind = "STT"

    def __init__(self, model: SttModel, max_streams: int, device: torch.device, dtype: torch.dtype,
                 max_frames_per_tick: int = MAX_FRAMES_PER_TICK, frame_ready: Callable[[], None] = lambda: None,
                 lm: LmChoice = SHIPPED, turns: TurnsChoice = SHIPPED, precision: str = "auto",
                 turn_end_probability: Optional[float] = None,
                 words: Optional[tuple[ReadingWorker, SileroVad]] = None) -> None:
        super().__init__(max_streams)
        self.model, self.device, self.dtype = model, device, dtype
        self.words = words  # Whisper reads the words (engine.whisper_stream); None: the SSM's own
        self.stepper = streaming_model(model, precision)  # the model, or its int8 form on CPU
        self.lm = resolve_lm(lm)  # every stream's final transcripts: beam search with this LM (None: greedy)
        self.turns = resolve_turns(turns)  # what was said weighs on turn ends (None: the acoustic head alone)
        self.turn_end_probability = turn_end_probability  # None: engine.stt's default for the choice of turns
        if turn_end_probability is not None:
            check_turn_end_probability(turn_end_probability)  # refuse it here, not at the first call
        self.frame_ready = frame_ready  # a stream's audio completed a model frame (any thread)
        self.max_frames_per_tick = max_frames_per_tick
        self.pool = StatePool(model.initial_state(1, device), max_streams)

    def open(self, session_id: str) -> RuntimeSttStream:
        return self._open(self._new_stream(session_id))

    def _new_stream(self, session_id: str) -> Callable[[int], RuntimeSttStream]:
        def make(slot: int) -> RuntimeSttStream:
            stream = RuntimeSttStream(self, session_id, slot)
            if self.words is not None:
                worker, vad = self.words
                stream.turns = TurnReader(lambda job: worker.submit(job, stream.on_reading), worker.has_room,
                                          vad.stream())
            return stream
        return make

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One throwaway batched step (kernels, allocator) that touches no slot."""
        rows = min(WARM_UP_ROWS, self.max_streams)
        x = torch.zeros(rows, FRAMES_PER_STEP * N_MELS, device=self.device, dtype=self.dtype)
        self.stepper.step(x, self.stepper.initial_state(rows, self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def step(self) -> StepReport:
        streams = self.streams()
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
        # int8 wins while the weights' bytes dominate (INT8_MAX_ROWS); both forms share one state layout.
        kernel = getattr(self.stepper, "kernel", None)
        stepper = self.stepper if kernel is None or len(x) < INT8_MAX_ROWS[kernel] else self.model
        ctc_logits, eot_logits, state = stepper.step(x, state)
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
                    stream.on_audio(audio)
                    windows.append(stream.windows.push(audio))
                    fed.append(stream)
            except Exception as exc:  # noqa: BLE001 - this stream's input only
                self.release(stream, exc)
        if not fed:
            return
        mels = torch.from_numpy(log_mel_rows(np.concatenate(windows)))
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
        for stream, (token, eot, candidates), ok in zip(batch, outputs, finite):
            if stream.closed:
                continue
            if not ok:  # rows are independent, so only this stream's state is poisoned
                self.release(stream, FloatingPointError("model output is not finite"))
                continue
            try:
                frame = stream.decoder.frame
                self._emit(stream, stream.decoder.on_frame(token, eot, candidates))
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
                stream.emit(stream.decoder.flush(), flushed=True)

    @staticmethod
    def _emit(stream: RuntimeSttStream, events: list[SttEvent]) -> None:
        stream.emit(events)


# -- text-to-speech ---------------------------------------------------------------------------

TTS_FIRST_FRAMES = 8  # a reply's first render: 93 ms of audio, for time to first audio; each next
TTS_CHUNK_FRAMES = 32  # render doubles (16, 32) up to 372 ms, so the lead grows faster than playout.
# Each render also decodes up to 2 x CONTEXT_FRAMES of context it does not keep, so short chunks
# would waste most of the decoder's time.
TTS_MAX_LEAD_S = 0.8  # a stream this far ahead of its playout clock sits a tick out: others go first
TTS_TEXT_PIECE_CHARS = 64  # text is queued in pieces this long ...
TTS_READY_FRAMES = 2 * TTS_CHUNK_FRAMES  # ... and phonemized and encoded only while a stream has fewer
# frames ready: a long reply's text is spread over many ticks instead of stalling one tick for all.
TTS_ENCODE_MIN_IDS = 32  # ids gathered before one encoder call (each call has a fixed cost)
RENDER_BUSY_WINDOW_S = 2.0  # admission looks at the renderer's busy share over this long
_END_TEXT = object()  # inbox marker: the reply's text is complete


@dataclass
class LookaheadHistory:
    """The TTS encoder's last LOOKAHEAD embeddings, as a pool row (TtsModel.encode's `history`)."""

    embeddings: Tensor  # [B, lookahead, width]


class RuntimeTtsStream:
    """One reply's speech on the shared runtime (implements interface.TtsStream).

    push_text/end/cancel only queue and never block; phonemization and every model call run
    on the runtime thread. The stream ends (events() returns) once its audio is all out; its
    slot is then free for the next reply.
    """

    def __init__(self, stepper: "TtsStepper", session_id: str, slot: int, lookahead: int) -> None:
        self.session_id, self.slot = session_id, slot
        self.error: Optional[StreamFailed] = None
        self.closed = self.cancelled = False
        self._stepper = stepper
        self._inbox: collections.deque = collections.deque()  # text pieces and _END_TEXT
        self._queued_chars = 0
        self._queue_lock = threading.Lock()
        self.channel = EventQueue()
        self.text_at: Optional[float] = None  # first text pushed: time to first audio counts from here
        # Runtime-thread side:
        self.fresh = True
        self.schedule = Schedule(lookahead)
        self.playout_origin: Optional[float] = None  # when sample 0 would play if played as it came
        self.samples_out = 0
        self.chunks_out = 0
        self.rendering = False  # a chunk of this stream is with the RenderWorker (written by both threads)

    def push_text(self, delta: str) -> None:
        """Append reply text; a phrase is synthesized as soon as it is stable. Ignored after cancel."""
        if not isinstance(delta, str):
            raise TypeError(f"text delta must be str, not {type(delta).__name__}")
        if self.closed:
            return
        if self.text_at is None:
            self.text_at = time.perf_counter()
        with self._queue_lock:
            self._queued_chars += len(delta)
            flooded = self._queued_chars > MAX_PENDING_CHARS
        if flooded:  # this stream fails (StreamFailed from events()); the caller's loop carries on
            self._stepper.release(self, ValueError(f"more than {MAX_PENDING_CHARS} characters of text waiting"))
            return
        # The front end releases the same phrases however the text is split (engine/text.py).
        self._inbox.extend(delta[i:i + TTS_TEXT_PIECE_CHARS] for i in range(0, len(delta), TTS_TEXT_PIECE_CHARS))
        self._stepper.text_arrived(self)

    def end(self) -> None:
        """No more text: the last phrase is synthesized and then events() ends."""
        if not self.closed:
            self._inbox.append(_END_TEXT)
            self._stepper.text_arrived(self)

    def cancel(self) -> None:
        """Stop now: no further events, the slot is freed at once."""
        self.cancelled = True
        self._stepper.release(self)

    close = cancel

    async def events(self) -> AsyncIterator[TtsEvent]:
        """WordMark and Audio events in order until the reply is out; raises StreamFailed."""
        while True:
            item = await self.channel.get()
            if item is _END or self.cancelled:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def poll(self) -> list[TtsEvent]:
        """The events so far, without waiting (for synchronous callers; see .error)."""
        items = self.channel.get_nowait()
        return [item for item in items if item is not _END and not isinstance(item, BaseException)]

    # -- runtime-thread side --

    def has_text(self) -> bool:
        return bool(self._inbox)

    def take_ids(self) -> tuple[list[int], list[Optional[str]]]:
        """Queued text through the front end until TTS_ENCODE_MIN_IDS ids (or the inbox) are out."""
        ids: list[int] = []
        labels: list[Optional[str]] = []
        while self._inbox and len(ids) < TTS_ENCODE_MIN_IDS:
            item = self._inbox.popleft()
            if item is not _END_TEXT:
                with self._queue_lock:
                    self._queued_chars -= len(item)
            new_ids, new_labels = self.schedule.end() if item is _END_TEXT else self.schedule.push_text(item)
            ids += new_ids
            labels += new_labels
        return ids, labels

    def lead(self, now: float) -> float:
        """Seconds of audio out beyond what a listener would have heard by `now`."""
        return self.samples_out / TTS_SAMPLE_RATE - (now - self.playout_origin)


RenderBatch = list[tuple["RuntimeTtsStream", Chunk, list[WordMark]]]


class RenderWorker:
    """Piper's flow and decoder on their own thread: a render takes 40-100 ms of a core, longer
    than a tick, so the tick (STT frames, text encoding) hands batches over instead of waiting.
    onnxruntime computes without the GIL, so the two run side by side on two cores.

    Batches run oldest first; `done(batch, pcm or exception)` is called on this thread."""

    def __init__(self, done: Callable[[RenderBatch, "list[np.ndarray] | BaseException"], None]) -> None:
        self._done = done
        self._queue: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._spans: collections.deque = collections.deque()  # (ended, seconds) of recent renders
        self._thread = threading.Thread(target=self._run, name="tts-render", daemon=True)
        self._thread.start()

    def submit(self, batch: RenderBatch) -> None:
        with self._ready:
            self._queue.append(batch)
            self._ready.notify()

    def busy_share(self, now: float) -> float:
        """Share of the last RENDER_BUSY_WINDOW_S spent rendering, with the queue counted as busy."""
        with self._ready:
            while self._spans and self._spans[0][0] < now - RENDER_BUSY_WINDOW_S:
                self._spans.popleft()
            return sum(seconds for _, seconds in self._spans) / RENDER_BUSY_WINDOW_S + (1.0 if self._queue else 0.0)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                batch = self._queue.popleft()
            started = time.perf_counter()
            try:
                result: "list[np.ndarray] | BaseException" = [
                    to_int16(audio) for audio in render([chunk for _, chunk, _ in batch])]
            except Exception as exc:  # noqa: BLE001 - the streams of this batch fail, the worker goes on
                result = exc
            ended = time.perf_counter()
            with self._ready:
                self._spans.append((ended, ended - started))
            try:
                self._done(batch, result)
            except Exception:  # noqa: BLE001 - a delivery bug must not stop every stream's audio
                log.exception("delivering rendered TTS audio failed")


class TtsStepper(SlotTable):
    """TTS's part of a tick: new text of each stream through its encoder, then the next chunk
    of every stream that needs audio to Piper's flow and decoder, ONE call per chunk shape.

    A stream renders TTS_FIRST_FRAMES first (time to first audio), then chunks doubling up to
    TTS_CHUNK_FRAMES while its lead over real time is under max_lead_s. Chunk sizes are powers
    of two and every chunk carries the same context, so streams mid-reply share a shape and a
    call. The renderer keeps no state between chunks (the context is recomputed): a stream's
    state is its encoder's, a few KiB. With a RenderWorker (the running runtime) renders run
    on its thread, one chunk per stream in flight; without one (Runtime.tick() called by hand)
    they run inline, in the tick.
    """

    kind = "TTS"

    def __init__(self, model: TtsModel, max_streams: int, device: torch.device,
                 wake: Callable[[], None] = lambda: None, max_lead_s: float = TTS_MAX_LEAD_S) -> None:
        super().__init__(max_streams)
        self.model = model.eval().to(device)
        self.device, self._wake, self.max_lead_s = device, wake, max_lead_s
        self.encoder_pool = StatePool(model.encoder.initial_state(1, device)
                                      + [LookaheadHistory(model.initial_history(1, device))], max_streams)
        self.worker: Optional[RenderWorker] = None
        self._delivered: collections.deque = collections.deque()  # StepReports of the worker's renders

    def open(self, session_id: str) -> RuntimeTtsStream:
        return self._open(lambda slot: RuntimeTtsStream(self, session_id, slot, self.model.config.lookahead))

    def start_worker(self) -> None:
        if self.worker is None:
            self.worker = RenderWorker(self._deliver)

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def overloaded(self, now: float, limit: float) -> bool:
        """The renderer spent more than `limit` of its recent time rendering (or has a queue)."""
        return self.worker is not None and self.worker.busy_share(now) > limit

    def text_arrived(self, stream: RuntimeTtsStream) -> None:
        """A reply that has not sounded yet gets a tick now rather than at the next period."""
        if stream.playout_origin is None:
            self._wake()

    def bytes_per_slot(self) -> int:
        return self.encoder_pool.bytes_per_slot()

    def warm_up(self) -> None:
        """Phonemizer start-up and the decoder's first call, then a whole sentence offline: the
        audio must be finite."""
        audio, _ = synthesize_offline(self.model, "Hello, how can I help?")
        if len(audio) == 0:
            raise RuntimeError("TTS warm-up produced no audio")

    @torch.inference_mode()
    def step(self) -> StepReport:
        report = StepReport()
        while self._delivered:
            delivered = self._delivered.popleft()
            report.batches += delivered.batches
            report.ttfas += delivered.ttfas
            report.late_audio_chunks += delivered.late_audio_chunks
        streams = self.streams()
        if not streams:
            return report
        self._zero_fresh(streams)
        for stream in streams:
            self._encode_text(stream)
        shapes: dict[tuple[int, int], RenderBatch] = {}
        now = time.perf_counter()
        for stream in streams:
            if stream.closed or stream.rendering:
                continue
            self._pause_clock_while_waiting_for_text(stream, now)
            size = self._chunk_size(stream, now)
            chunk, marks = stream.schedule.take(size) if size else (None, [])
            if chunk is None:
                for mark in marks:  # words on ids of zero frames, before any audio of theirs
                    stream.channel.put(mark)
            else:
                shapes.setdefault(chunk.shape, []).append((stream, chunk, marks))
        for batch in shapes.values():
            if self.worker is None:
                self._render_inline(batch, report)
            else:
                for stream, _, _ in batch:
                    stream.rendering = True
                self.worker.submit(batch)
        for stream in streams:
            if not stream.closed and not stream.rendering and stream.schedule.done and not stream.has_text():
                self.release(stream)
        return report

    def _zero_fresh(self, streams: list[RuntimeTtsStream]) -> None:
        fresh = [s for s in streams if s.fresh]
        if fresh:
            self.encoder_pool.zero(torch.tensor([s.slot for s in fresh], device=self.device))
            for s in fresh:
                s.fresh = False

    def _encode_text(self, stream: RuntimeTtsStream) -> None:
        """Phonemize the stream's queued text and run its ids through the encoder, until it has
        TTS_READY_FRAMES ready (batch of one: a phrase at a time, a few times per reply)."""
        try:
            while stream.has_text() and stream.schedule.frames_ready() < TTS_READY_FRAMES and not stream.closed:
                ids, labels = stream.take_ids()
                if ids:
                    slots = torch.tensor([stream.slot], device=self.device)
                    *encoder_state, history = self.encoder_pool.gather(slots)
                    encoder_state, embeddings = encode_ids(self.model, stream.schedule, ids, labels, encoder_state,
                                                           history.embeddings)
                    self.encoder_pool.scatter(slots, encoder_state + [LookaheadHistory(embeddings)])
        except Exception as exc:  # noqa: BLE001 - this stream's text only
            self.release(stream, exc)

    @staticmethod
    def _pause_clock_while_waiting_for_text(stream: RuntimeTtsStream, now: float) -> None:
        """A reply that ran out of audio because its text has not come yet pauses; its next
        chunk is not late."""
        if (stream.playout_origin is not None and stream.lead(now) < 0 and not stream.schedule.frames_ready()
                and not stream.schedule.ended):
            stream.playout_origin = now - stream.samples_out / TTS_SAMPLE_RATE

    def _chunk_size(self, stream: RuntimeTtsStream, now: float) -> int:
        """Frames to render for this stream this tick: 0, or a power of two."""
        if stream.playout_origin is not None and stream.lead(now) > self.max_lead_s:
            return 0
        limit = min(TTS_FIRST_FRAMES << stream.chunks_out, TTS_CHUNK_FRAMES)
        size = min(limit, stream.schedule.frames_ready())
        if size == 0:
            return 1 if stream.schedule.marks else 0  # flush word marks of zero-frame ids
        return 1 << (size.bit_length() - 1)

    def _render_inline(self, batch: RenderBatch, report: StepReport) -> None:
        try:
            result: "list[np.ndarray] | BaseException" = [
                to_int16(audio) for audio in render([chunk for _, chunk, _ in batch])]
        except Exception as exc:  # noqa: BLE001 - the shared call failed: every stream in it did
            result = exc
        self._put_audio(batch, result, report)

    def _deliver(self, batch: RenderBatch, result: "list[np.ndarray] | BaseException") -> None:
        """On the render worker's thread: the batch's audio out, its figures to the next tick."""
        report = StepReport()
        self._put_audio(batch, result, report)
        for stream, _, _ in batch:
            stream.rendering = False
        self._delivered.append(report)
        self._wake()  # the next chunks (or the slots' release) come at once, not a period later

    def _put_audio(self, batch: RenderBatch, result: "list[np.ndarray] | BaseException", report: StepReport) -> None:
        streams = [stream for stream, _, _ in batch]
        if isinstance(result, BaseException):
            log.error("batched TTS render failed for %d streams", len(streams), exc_info=result)
            for stream in streams:
                self.release(stream, result)
            return
        now = time.perf_counter()
        for (stream, _, marks), samples in zip(batch, result):
            if stream.closed:
                continue
            if stream.playout_origin is None:
                stream.playout_origin = now
                report.ttfas.append(now - (stream.text_at or now))
                self._wake()  # the next chunk follows at once, not a period later: the lead builds fast
            elif stream.lead(now) < 0:
                report.late_audio_chunks += 1
            for mark in marks:
                stream.channel.put(mark)
            stream.channel.put(Audio(samples, TTS_SAMPLE_RATE))
            stream.samples_out += len(samples)
            stream.chunks_out += 1
        report.batches.append(len(streams))


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
    state_bytes_per_stream: int  # one call's slots: STT, plus TTS when the runtime speaks
    tts_streams_open: int = 0
    ttfa_ms_p50: Optional[float] = None  # TTS: a reply's first text -> its first audio, last LAG_WINDOW replies
    ttfa_ms_p95: Optional[float] = None
    late_audio_chunks: int = 0  # TTS chunks that came after their playout time since start


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
            self.ttfas: collections.deque = collections.deque(maxlen=LAG_WINDOW)
            self.late_audio_chunks = 0

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
                self.ttfas.extend(report.ttfas)
                self.late_audio_chunks += report.late_audio_chunks

    def recent(self, count: int) -> list[float]:
        with self._lock:
            return list(self.durations)[-count:]

    def snapshot(self) -> tuple[list[float], list[float], dict[str, Any]]:
        with self._lock:
            counters = dict(ticks=self.ticks, late_ticks=self.late_ticks, seconds_sum=self.seconds_sum,
                            buckets=list(self.buckets), frames=self.frames, steps=self.steps,
                            last_batch=self.last_batch, backlog=self.backlog, ttfas=list(self.ttfas),
                            late_audio_chunks=self.late_audio_chunks)
            return list(self.durations), list(self.lags), counters


def _percentile_ms(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 3) if values else None


class Runtime:
    """The batched inference loop: a state pool per model, one tick per frame period, on its thread."""

    def __init__(self, stt_model: SttModel, *, tts_model: Optional[TtsModel] = None, max_streams: int = 64,
                 device: str = "auto", dtype: Optional[torch.dtype] = None, tick_s: float = FRAME_S,
                 num_threads: Optional[int] = None, max_frames_per_tick: int = MAX_FRAMES_PER_TICK,
                 admit_load: float = ADMIT_LOAD, tts_max_lead_s: float = TTS_MAX_LEAD_S, lm: LmChoice = SHIPPED,
                 turns: TurnsChoice = SHIPPED, precision: str = "auto",
                 turn_end_probability: Optional[float] = None,
                 words: Optional[tuple[ReadingWorker, SileroVad]] = None) -> None:
        """Takes the models over (moves and casts the STT model in place; TTS stays fp32).
        num_threads sets torch's CPU threads for the whole process; tick_s is both the tick
        period and the budget a tick must fit in; tts_max_lead_s is how far a reply's audio may
        run ahead of real time (tests that drive tick() by hand lift it); lm is the language model
        of the final transcripts (the shipped one; None decodes greedily), turns the
        turn-completion table that weighs on turn ends (the shipped one; None: the acoustic head alone),
        precision how the STT model steps (engine.stt.streaming_model: int8 matrices on CPU by default),
        turn_end_probability the P(end) that closes a caller's turn (engine.stt.StreamDecoder),
        words a Whisper reading worker and VAD that read the callers' words (closed with the runtime)."""
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.tick_s, self.admit_load = tick_s, admit_load
        model = prepare_model(stt_model, self.device, self.dtype)
        self.stt = SttStepper(model, max_streams, self.device, self.dtype, max_frames_per_tick, self._frame_ready,
                               lm, turns, precision, turn_end_probability, words)
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
        ADMISSION_WINDOW tick times is over admit_load x the budget, when the TTS renderer was
        busy more than admit_load of its recent time, or when the loop has fallen more than a
        tick behind its schedule.
        """
        retry_after_s = ADMISSION_WINDOW * self.tick_s  # the window has turned over by then
        if any(stepper.free_slots() == 0 for stepper in self.steppers):
            return False, retry_after_s
        recent = self.metrics.recent(ADMISSION_WINDOW)
        if len(recent) >= ADMISSION_MIN_TICKS and np.percentile(recent, 95) > self.admit_load * self.tick_s:
            return False, retry_after_s
        if self.tts is not None and self.tts.overloaded(time.perf_counter(), self.admit_load):
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
            streams_failed=self.stt.failed + (self.tts.failed if self.tts else 0),
            state_bytes_per_stream=self.stt.pool.bytes_per_slot() + (self.tts.bytes_per_slot() if self.tts else 0),
            tts_streams_open=self.tts.open_streams() if self.tts else 0,
            ttfa_ms_p50=_percentile_ms(c["ttfas"], 50), ttfa_ms_p95=_percentile_ms(c["ttfas"], 95),
            late_audio_chunks=c["late_audio_chunks"])


# -- the engine ---------------------------------------------------------------------------------

class SpeechEngine:
    """interface.Engine over one Runtime: what the gateway opens streams on.

        engine = SpeechEngine()            # shipped weights; FileNotFoundError if not trained yet
        await asyncio.to_thread(engine.start)   # warm-up + loop thread; then engine.ready
        ok, retry_after_s = engine.admission()  # before accepting a call: 503 + Retry-After if not ok
        stream = engine.open_stt(session_id)
    """

    def __init__(self, stt_model: Union[SttModel, str, None] = None, *, weights_path: Optional[Path] = None,
                 tts_model: Optional[TtsModel] = None, tts_weights_path: Optional[Path] = None,
                 with_tts: bool = False, readers: int = 1, **runtime_options: Any) -> None:
        """stt_model: a name from engine.models (default DEFAULT_STT_MODEL: Whisper reads the
        words, over the SSM at weights_path or the shipped one), or an SttModel, which then
        recognizes alone. readers: threads that run Whisper's readings. with_tts (or a
        tts_model) adds speech synthesis: the shipped TTS weights unless a path or model is
        given (FileNotFoundError when there are none)."""
        name = check_stt_model(stt_model if isinstance(stt_model, str) else DEFAULT_STT_MODEL if stt_model is None
                               else SSM)
        model = stt_model if isinstance(stt_model, SttModel) else load_model(weights_path)
        if name == WHISPER:
            runtime_options["words"] = (ReadingWorker(WhisperReader(), readers), SileroVad())
        self.stt_model = name
        if tts_model is None and (with_tts or tts_weights_path is not None):
            from .tts import load_model as load_tts

            tts_model = load_tts(tts_weights_path)
        self.runtime = Runtime(model, tts_model=tts_model, **runtime_options)
        self._ready = False

    def start(self) -> None:
        """Warm up on the device and start the tick loop (blocks for the warm-up)."""
        self.runtime.warm_up()
        self.runtime.start()
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready and self.runtime.running

    def open_stt(self, session_id: str) -> RuntimeSttStream:
        return self.runtime.open_stt(session_id)

    def open_tts(self, session_id: str, voice: str = "") -> RuntimeTtsStream:
        """A streaming synthesizer for one reply, batched into the tick (the default voice only)."""
        return self.runtime.open_tts(session_id)

    def admission(self) -> tuple[bool, float]:
        return self.runtime.admission()

    def stats(self) -> RuntimeStats:
        return self.runtime.stats()

    def close(self) -> None:
        self._ready = False
        self.runtime.close()
