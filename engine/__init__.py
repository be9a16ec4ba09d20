"""Parley's in-process speech engine. The gateway imports only what this module exports."""

from pathlib import Path
from typing import Any, Optional, Union

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
from .blas import single_threaded_blas
from .malloc import bound_and_trim
from .process import EngineProcess
from .models import DEFAULT_STT_MODEL, DEFAULT_TURN_CUES, DEFAULT_VOICE, STT_MODELS, TTS_VOICES, TURN_CUES

# The batched runtime pulls in torch: loaded on first use, so `import engine` stays light.
_RUNTIME_EXPORTS = ("RuntimeStats", "SpeechEngine")

__all__ = [
    "STT_SAMPLE_RATE", "Audio", "CapacityError", "EndOfTurn", "Engine", "EngineStats", "Final", "Partial",
    "SpeechLikely", "SpeechStart", "StreamFailed", "SttEvent", "SttStream", "TtsEvent", "TtsStream", "WordMark",
    "DEFAULT_STT_MODEL", "DEFAULT_VOICE", "STT_MODELS", "TTS_VOICES", "DEFAULT_TURN_CUES", "TURN_CUES",
    *_RUNTIME_EXPORTS, "EngineProcess", "say",
    "load_ssm_model", "ssm_recognizer", "use_threads", "single_threaded_blas", "bound_and_trim",
]


def say(text: str, path: str) -> float:
    """Speak `text` with the shipped voice into a WAV file at `path` (22.05 kHz, 16-bit mono),
    offline, through the same synthesis as a call's replies -> seconds of audio written."""
    from .tts import SAMPLE_RATE, load_model, synthesize_offline
    from .wavfile import write_wav

    audio, _ = synthesize_offline(load_model(), text)
    write_wav(path, audio, SAMPLE_RATE)
    return len(audio) / SAMPLE_RATE


def load_ssm_model(weights: Optional[Union[str, Path]] = None) -> Any:
    """Parley's SSM recognizer on the CPU: the shipped weights, or a .safetensors / training
    checkpoint at `weights` (FileNotFoundError naming the path when there are none). It decides
    when a caller's speech starts and when a turn ends, whatever `stt_model` reads the words;
    `parley replay` runs recorded calls through it."""
    from .stt import load_model

    return load_model(Path(weights) if weights else None)


def ssm_recognizer(model: Any, turn_end_probability: Optional[float] = None) -> Any:
    """One caller's recognizer over `model` (load_ssm_model's), as a call's, single stream:
    `.push(int16 16 kHz mono)` -> the SttEvents that audio caused, `.flush()` at the end.
    turn_end_probability: P(end) that closes a turn (None: the engine's)."""
    from .stt import Recognizer

    return Recognizer(model, turn_end_probability=turn_end_probability)


def use_threads(count: int) -> None:
    """CPU threads this process's model arithmetic may use (torch's intra-op threads)."""
    import torch

    torch.set_num_threads(count)


def __getattr__(name: str):
    if name in _RUNTIME_EXPORTS:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
