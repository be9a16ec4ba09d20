"""Parley's in-process speech engine. The gateway imports only what this module exports."""

from .interface import (
    STT_SAMPLE_RATE,
    Audio,
    EndOfTurn,
    Engine,
    Final,
    Partial,
    SpeechStart,
    SttEvent,
    SttStream,
    TtsEvent,
    TtsStream,
    WordMark,
)

__all__ = [
    "STT_SAMPLE_RATE", "Audio", "EndOfTurn", "Engine", "Final", "Partial", "SpeechStart",
    "SttEvent", "SttStream", "TtsEvent", "TtsStream", "WordMark",
]
