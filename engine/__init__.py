"""Parley's in-process speech engine. The gateway imports only what this module exports."""

from .interface import (
    STT_SAMPLE_RATE,
    Audio,
    CapacityError,
    EndOfTurn,
    Engine,
    EngineStats,
    Final,
    Partial,
    SpeechLikely,
    SpeechStart,
    SttEvent,
    StreamFailed,
    SttStream,
    TtsEvent,
    TtsStream,
    WordMark,
)
from .models import DEFAULT_STT_MODEL, DEFAULT_VOICE, STT_MODELS, TTS_VOICES

# The batched runtime pulls in torch: loaded on first use, so `import engine` stays light.
_RUNTIME_EXPORTS = ("RuntimeStats", "SpeechEngine")

__all__ = [
    "STT_SAMPLE_RATE", "Audio", "CapacityError", "EndOfTurn", "Engine", "EngineStats", "Final", "Partial",
    "SpeechLikely", "SpeechStart", "StreamFailed", "SttEvent", "SttStream", "TtsEvent", "TtsStream", "WordMark",
    "DEFAULT_STT_MODEL", "DEFAULT_VOICE", "STT_MODELS", "TTS_VOICES", *_RUNTIME_EXPORTS, "say",
]


def say(text: str, path: str) -> float:
    """Speak `text` with the shipped voice into a WAV file at `path` (22.05 kHz, 16-bit mono),
    offline, through the same synthesis as a call's replies -> seconds of audio written."""
    from .tts import SAMPLE_RATE, load_model, synthesize_offline
    from .wavfile import write_wav

    audio, _ = synthesize_offline(load_model(), text)
    write_wav(path, audio, SAMPLE_RATE)
    return len(audio) / SAMPLE_RATE


def __getattr__(name: str):
    if name in _RUNTIME_EXPORTS:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
