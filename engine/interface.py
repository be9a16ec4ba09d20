"""The engine's public interface: what the gateway may rely on (docs/architecture.md).

The engine takes audio and text streams and gives back text, events, audio and state;
it knows nothing of WebRTC, HTTP or Redis. Backends implement these Protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, Union, runtime_checkable

import numpy as np

STT_SAMPLE_RATE = 16000  # what SttStream.push takes: int16 mono


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
    """Unstable transcript of the words so far in this turn."""

    text: str


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


# -- streams and the engine -----------------------------------------------------------------

@runtime_checkable
class SttStream(Protocol):
    def push(self, pcm16k: np.ndarray) -> None:
        """Feed int16 mono audio at STT_SAMPLE_RATE; never blocks."""

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


@runtime_checkable
class Engine(Protocol):
    @property
    def ready(self) -> bool:
        """Weights loaded and warmed up on the device."""

    def open_stt(self, session_id: str) -> SttStream: ...

    def open_tts(self, session_id: str, voice: str) -> TtsStream: ...

    def close(self) -> None: ...
