"""Parley's in-process speech engine. The gateway imports only what this module exports."""

from .interface import (
    STT_SAMPLE_RATE,
    Audio,
    EndOfTurn,
    Engine,
    Final,
    Partial,
    SpeechLikely,
    SpeechStart,
    SttEvent,
    SttStream,
    TtsEvent,
    TtsStream,
    WordMark,
)
from .models import DEFAULT_STT_MODEL, STT_MODELS

# The batched runtime pulls in torch: loaded on first use, so `import engine` stays light.
_RUNTIME_EXPORTS = ("CapacityError", "RuntimeStats", "SpeechEngine", "StreamFailed")

__all__ = [
    "STT_SAMPLE_RATE", "Audio", "EndOfTurn", "Engine", "Final", "Partial", "SpeechLikely",
    "SpeechStart", "SttEvent", "SttStream", "TtsEvent", "TtsStream", "WordMark", "DEFAULT_STT_MODEL", "STT_MODELS",
    *_RUNTIME_EXPORTS,
]


def __getattr__(name: str):
    if name in _RUNTIME_EXPORTS:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
