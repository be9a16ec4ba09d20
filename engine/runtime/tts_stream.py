"""Text-to-speech on the batched runtime: one reply's stream, the render thread, and TTS's part
of every tick.

    push_text ─► inbox ─► phonemes ─► encoder (per stream, a phrase at a time) ─► prior frames
      ─► every stream that needs audio: its next chunk (8, 16, 32, then 64 frames, with context) ─► ONE
         call of Piper's flow + decoder per chunk shape, on the render thread ─► WordMark, Audio

A reply's first text wakes the loop for an early tick, so time to first audio does not wait
for the next period; that tick encodes only the ids its first chunk needs (FIRST_ENCODE_IDS),
and the next tick the rest, while the chunk renders. Renders run on RenderWorker's thread, so
ticks (STT frames) never wait for one; admission also weighs the renderer's busy share
(TtsStepper.overloaded).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from torch import Tensor

from ..interface import Audio, TtsEvent, WordMark
from ..text import MAX_PENDING_CHARS
from ..tts import SAMPLE_RATE as TTS_SAMPLE_RATE, Chunk, Schedule, TtsModel, encode_ids, render, synthesize_offline, \
    to_int16
from ..worker_pool import WorkerPool, hand_over
from .slots import RuntimeStream, SlotTable, StatePool, StepReport

log = logging.getLogger("engine.runtime")

TTS_FIRST_FRAMES = 8  # a reply's first render: 93 ms of audio, for time to first audio; each next
TTS_CHUNK_FRAMES = 64  # render doubles (16, 32, 64) up to 743 ms, so the lead grows faster than playout.
# Each render also runs the flow over 2 x 24 and the decoder over 2 x 8 frames of context it does
# not keep: per second of audio a 64-frame chunk costs ~10 % less CPU than a 32-frame one. Not 128
# (~25 % less): a reply's first chunk may wait for a busy render thread, ~100 ms at 64, ~170 at 128.
TTS_MAX_LEAD_S = 0.8  # a stream this far ahead of its playout clock sits a tick out: others go first
TTS_TEXT_PIECE_CHARS = 64  # text is queued in pieces this long ...
TTS_READY_FRAMES = 2 * TTS_CHUNK_FRAMES  # ... and phonemized and encoded only while a stream has fewer
# frames ready: a long reply's text is spread over many ticks instead of stalling one tick for all.
TTS_ENCODE_MIN_IDS = 32  # ids gathered before one encoder call (each call has a fixed cost)
TTS_RENDER_THREADS = 2  # renders at once: a reply's next chunk need not wait behind another's
RENDER_BUSY_WINDOW_S = 2.0  # admission looks at the renderer's busy share over this long
_END_TEXT = object()  # inbox marker: the reply's text is complete


@dataclass
class LookaheadHistory:
    """The TTS encoder's last LOOKAHEAD embeddings, as a pool row (TtsModel.encode's `history`)."""

    embeddings: Tensor  # [B, lookahead, width]


class RuntimeTtsStream(RuntimeStream[TtsEvent]):
    """One reply's speech on the shared runtime (implements interface.TtsStream).

    push_text/end/cancel only queue and never block; phonemization and every model call run
    on the runtime thread. events() gives WordMark and Audio events in order and ends once the
    reply's audio is all out (at once after cancel), raising StreamFailed if this stream
    failed; its slot is then free for the next reply.
    """

    def __init__(self, stepper: "TtsStepper", session_id: str, slot: int, lookahead: int) -> None:
        super().__init__(session_id, slot)
        self.cancelled = False
        self._stepper = stepper
        self._inbox: collections.deque = collections.deque()  # text pieces and _END_TEXT
        self._queued_chars = 0
        self._queue_lock = threading.Lock()
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

    # -- runtime-thread side --

    def has_text(self) -> bool:
        return bool(self._inbox)

    def take_ids(self) -> tuple[list[int], list[Optional[str]]]:
        """Queued text through the front end until TTS_ENCODE_MIN_IDS ids (or the inbox) are
        out -> the ids for the next encoder call (Schedule.encode_limit) and their labels."""
        while self._inbox and len(self.schedule.unencoded) < TTS_ENCODE_MIN_IDS:
            item = self._inbox.popleft()
            if item is _END_TEXT:
                self.schedule.end()
                continue
            with self._queue_lock:
                self._queued_chars -= len(item)
            self.schedule.push_text(item)
        return self.schedule.take_unencoded(self.schedule.encode_limit())

    def lead(self, now: float) -> float:
        """Seconds of audio out beyond what a listener would have heard by `now`."""
        return self.samples_out / TTS_SAMPLE_RATE - (now - self.playout_origin)


RenderBatch = list[tuple["RuntimeTtsStream", Chunk, list[WordMark]]]


def render_batch(batch: RenderBatch) -> "list[np.ndarray] | BaseException":
    """One batch's int16 audio per stream, or the exception that failed the shared call (every
    stream in it fails; the caller goes on)."""
    try:
        return [to_int16(audio) for audio in render([chunk for _, chunk, _ in batch])]
    except Exception as exc:  # noqa: BLE001 - returned: the batch's streams fail, not the thread
        return exc


class RenderWorker(WorkerPool):
    """Piper's flow and decoder on their own threads: a render takes 20-100 ms of a core, longer
    than a tick, so the tick (STT frames, text encoding) hands batches over instead of waiting.
    onnxruntime computes without the GIL, so renders and ticks run side by side on the cores.
    One stream has one chunk in flight at a time, so its audio stays in order.

    Batches run oldest first, a reply's first chunk ahead of the rest; `done(batch, pcm or
    exception)` is called on the thread that rendered it."""

    def __init__(self, done: Callable[[RenderBatch, "list[np.ndarray] | BaseException"], None],
                 threads: int = TTS_RENDER_THREADS) -> None:
        super().__init__(threads, "tts-render")
        self._done = done
        self._queue: collections.deque = collections.deque()
        self._spans: collections.deque = collections.deque()  # (ended, seconds) of recent renders
        self.start()

    def submit(self, batch: RenderBatch, first: bool = False) -> None:
        """Queue a batch; `first` (a reply's first audio) goes ahead of the others' next chunks,
        which have a lead to play from."""
        self._queue_up(lambda: self._queue.appendleft(batch) if first else self._queue.append(batch))

    def busy_share(self, now: float) -> float:
        """Share of the last RENDER_BUSY_WINDOW_S spent rendering, with the queue counted as busy."""
        with self._ready:
            while self._spans and self._spans[0][0] < now - RENDER_BUSY_WINDOW_S:
                self._spans.popleft()
            busy = sum(seconds for _, seconds in self._spans) / (RENDER_BUSY_WINDOW_S * self.threads)
            return busy + (1.0 if self._queue else 0.0)

    def _queued(self) -> bool:
        return bool(self._queue)

    def _take(self) -> RenderBatch:
        return self._queue.popleft()

    def _work(self, batch: RenderBatch) -> None:
        started = time.perf_counter()
        result = render_batch(batch)
        ended = time.perf_counter()
        with self._ready:
            self._spans.append((ended, ended - started))
        hand_over(self._done, batch, result, what="rendered TTS audio")


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
        shapes: dict[tuple[int, int, int], RenderBatch] = {}
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
                self.worker.submit(batch, first=any(stream.playout_origin is None for stream, _, _ in batch))
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
        TTS_READY_FRAMES ready (batch of one: a phrase at a time, a few times per reply); a
        reply not yet sounding only until its first chunk is ready: the rest is encoded in the
        next tick, while that chunk renders on the other core."""
        wanted = TTS_FIRST_FRAMES if stream.schedule.rendered == 0 else TTS_READY_FRAMES
        try:
            while ((stream.has_text() or stream.schedule.unencoded) and stream.schedule.frames_ready() < wanted
                   and not stream.closed):
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
        self._put_audio(batch, render_batch(batch), report)

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

