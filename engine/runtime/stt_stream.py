"""Speech-to-text on the batched runtime: one caller's stream, and STT's part of every tick.

    push(pcm) ─► inbox ─┐   every tick (FRAME_S = 40 ms), on the runtime's own thread:
    push(pcm) ─► inbox ─┼─► log-mel of all new audio in one call ─► for each frame index: gather
    push(pcm) ─► inbox ─┘   the ready streams' state rows ─► ONE model.step ─► scatter rows back
                              ─► per-stream StreamDecoder ─► EventQueue ─► async events()

push() only checks and queues audio, so it never blocks the caller's event loop; the model
and pool work runs on the runtime thread (torch releases the GIL while it computes). With a
Whisper reader (stt_model "whisper-tiny.en"), the SSM's events and the stream's audio also
go through a TurnReader, whose readings come back on the reader's thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import Tensor

from ..audio import FRAMES_PER_STEP, HOP_LENGTH, N_FFT, N_MELS, STEP_SAMPLES, FrameStacker, StreamingWindows, \
    log_mel_rows, to_finite_float
from ..interface import SttEvent
from ..models import DEFAULT_TURN_CUES, check_turn_cues
from ..stt import (SHIPPED, LmChoice, StreamDecoder, SttModel, TurnsChoice, check_turn_end_probability,
                   frame_outputs, resolve_lm, resolve_turns, streaming_model)
from ..vad import SileroVad
from ..whisper_readers import ReadingWorker
from ..whisper_stream import TurnReader
from .slots import RuntimeStream, SlotTable, StatePool, StepReport

log = logging.getLogger("engine.runtime")

MAX_FRAMES_PER_TICK = 8  # per stream: a stream that fell behind catches up fast, yet a tick stays bounded
WARM_UP_ROWS = 8
_FLUSH = object()  # inbox marker: finalise the turn once the audio before it is decoded


class RuntimeSttStream(RuntimeStream[SttEvent]):
    """One caller's speech-to-text on the shared runtime (implements interface.SttStream):
    events() until close(), raising StreamFailed if this stream failed; poll() without waiting."""

    def __init__(self, stepper: "SttStepper", session_id: str, slot: int) -> None:
        super().__init__(session_id, slot)
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
                 words: Optional[tuple[ReadingWorker, SileroVad]] = None,
                 turn_cues: str = DEFAULT_TURN_CUES) -> None:
        super().__init__(max_streams)
        self.model, self.device, self.dtype = model, device, dtype
        self.words = words  # Whisper reads the words (engine.whisper_stream); None: the SSM's own
        self.ssm_ends = "ssm" in check_turn_cues(turn_cues)  # (the pause head is the reading worker's)
        self.stepper = streaming_model(model, precision)  # the model, or its int8 form on CPU
        # The SSM's own transcripts: beam search with this LM (None: greedy). Where Whisper reads
        # the words, the SSM's are dropped (engine/whisper_stream.py), so no beam search runs:
        # it is pure Python on every frame of every stream, holding the GIL the event loop needs.
        self.lm = resolve_lm(lm) if words is None else None
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
                if self.ssm_ends:
                    stream.turns.advise(stream.decoder)  # the SSM's turn ends weigh Whisper's words
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

