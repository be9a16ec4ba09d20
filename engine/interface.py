"""The engine's public interface: everything the gateway may rely on (docs/architecture.md,
"The engine contract").

The engine takes audio and text streams and gives back text, events, audio and state;
it knows nothing of WebRTC, HTTP or Redis. Backends implement these Protocols and choose
their models by name (engine/models.py: STT_MODELS for `stt_model`, TTS_VOICES for a TTS
stream's `voice`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Protocol, Union, runtime_checkable

import numpy as np

from .models import (DEFAULT_STT_MODEL, DEFAULT_TURN_CUES, DEFAULT_VOICE, STT_MODELS, TTS_VOICES, TURN_CUES,
                     check_stt_model, check_turn_cues, check_voice)

STT_SAMPLE_RATE = 16000  # what SttStream.push takes: int16 mono

__all__ = [
    "STT_SAMPLE_RATE", "SpeechStart", "SpeechLikely", "Partial", "Final", "EndOfTurn", "SttEvent", "Audio",
    "WordMark", "TtsEvent", "CapacityError", "StreamFailed", "SttStream", "TtsStream", "EngineStats", "Engine",
    "DEFAULT_STT_MODEL", "DEFAULT_VOICE", "STT_MODELS", "TTS_VOICES", "check_stt_model", "check_voice",
    "DEFAULT_TURN_CUES", "TURN_CUES", "check_turn_cues",
]


# -- speech-to-text events ----------------------------------------------------------------

@dataclass(frozen=True)
class SpeechStart:
    """The caller started speaking (engine speech detection, not raw energy)."""

    t: float  # seconds of stream audio


@dataclass(frozen=True)
class SpeechLikely:
    """The recognizer leans towards speech, short of SpeechStart's certainty (its speech head
    fairly sure, or a first token): usually 40-80 ms before SpeechStart, now and then on a
    sound that is not speech. For actions that are cheap to undo (pausing a reply under a
    barge-in), not for turn-taking."""

    t: float  # seconds of stream audio
    probability: float


@dataclass(frozen=True)
class Partial:
    """The words heard so far in this turn: `text` will not change (later partials only add to
    it); `tentative`, the words after it in the latest reading, may still change or go."""

    text: str
    tentative: str = ""


@dataclass(frozen=True)
class Final:
    """Stable transcript of a stretch of speech with word times (seconds of stream audio)."""

    text: str
    words: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class EndOfTurn:
    """The model judges that the caller has finished their turn."""

    confidence: float


SttEvent = Union[SpeechStart, SpeechLikely, Partial, Final, EndOfTurn]


# -- text-to-speech events -----------------------------------------------------------------

@dataclass(frozen=True)
class Audio:
    pcm: np.ndarray  # int16 mono
    sample_rate: int


@dataclass(frozen=True)
class WordMark:
    """`word` starts at `sample_offset` samples into this stream's audio."""

    word: str
    sample_offset: int


TtsEvent = Union[Audio, WordMark]


# -- errors ------------------------------------------------------------------------------------

class CapacityError(RuntimeError):
    """Every slot is taken: the engine already carries max_streams streams."""


class StreamFailed(RuntimeError):
    """This stream was closed by an error in its own audio or decoding; other streams carry on."""


# -- streams and the engine -----------------------------------------------------------------

@runtime_checkable
class SttStream(Protocol):
    def push(self, pcm16k: np.ndarray) -> None:
        """Feed int16 mono audio at STT_SAMPLE_RATE; never blocks."""

    def flush(self) -> None:
        """The audio ended for now: a Final (and the turn's end) for what was heard so far,
        after the audio already pushed."""

    def events(self) -> AsyncIterator[SttEvent]:
        """Events in stream order until close()."""

    def close(self) -> None: ...


@runtime_checkable
class TtsStream(Protocol):
    def push_text(self, delta: str) -> None:
        """Append text; synthesis starts on the first stable phrase."""

    def end(self) -> None:
        """No more text: finish the last phrase."""

    def cancel(self) -> None:
        """Stop now; no further events."""

    def events(self) -> AsyncIterator[TtsEvent]: ...


@dataclass(frozen=True)
class EngineStats:
    """An engine's counters and recent percentiles, for /metrics (gateway/engine_host.py).
    Tick figures cover the last minute of ticks; lags and time to first audio the recent
    frames and replies."""

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
    lag_ms_p50: Optional[float]  # audio pushed -> its frame stepped, recent frames
    lag_ms_p95: Optional[float]
    behind_ms: float  # how far the tick loop is behind its schedule
    backlog_frames: int  # most frames any stream had waiting after the last tick
    streams_open: int
    max_streams: int
    streams_failed: int
    state_bytes_per_stream: int  # one call's slots: STT, plus TTS when the engine speaks
    tts_streams_open: int = 0
    ttfa_ms_p50: Optional[float] = None  # TTS: a reply's first text -> its first audio, recent replies
    ttfa_ms_p95: Optional[float] = None
    late_audio_chunks: int = 0  # TTS chunks that came after their playout time since start
    gpu_memory_bytes: Optional[int] = None  # CUDA memory allocated by the engine; None off CUDA


@runtime_checkable
class Engine(Protocol):
    @property
    def ready(self) -> bool:
        """Weights loaded and warmed up on the device."""

    @property
    def device(self) -> str:
        """Where the models run: "cpu", "cuda", "cuda:1"."""

    def start(self) -> None:
        """Warm up and start serving; blocks (call it from a worker thread)."""

    def admission(self) -> tuple[bool, float]:
        """(admit a new call now?, seconds before asking again): no when no slot is free or
        the engine would fall behind."""

    def open_stt(self, session_id: str) -> SttStream:
        """Raises CapacityError when no slot is free."""

    def open_tts(self, session_id: str, voice: str = DEFAULT_VOICE) -> TtsStream:
        """`voice`: a name in TTS_VOICES, or "default"/"" for DEFAULT_VOICE; ValueError for an
        unknown one. Raises CapacityError when no slot is free."""

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
