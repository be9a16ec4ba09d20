"""The engine's models by name: what `stt_model` (PARLEY_STT_MODEL, --stt-model) and a TTS
stream's `voice` (Engine.open_tts) may choose. A new backend adds its name here, and
engine/runtime/engine.py builds it.

Speech-to-text:
- "whisper-tiny.en" (default): Whisper tiny.en reads the caller's words (engine/whisper.py,
  engine/whisper_stream.py); Parley's SSM recognizer, batched in the runtime's tick, decides
  when speech starts and when a turn ends. Real-dev WER 0.07 (MODEL_CARD.md).
- "ssm": Parley's SSM recognizer alone (engine/stt.py): the words from its own CTC head and
  language model. Light and fast, but learned from synthetic voices: 0.96 WER on real callers.

Text-to-speech voices:
- "joe" (default; "default" and "" name it too): Parley's SSM encoder predicts the prior of
  Piper's en_US joe voice, and joe's own flow and HiFi-GAN decoder render it (engine/tts.py,
  engine/piper.py).
"""

from __future__ import annotations

WHISPER = "whisper-tiny.en"
SSM = "ssm"
STT_MODELS = (WHISPER, SSM)
DEFAULT_STT_MODEL = WHISPER

JOE = "joe"
TTS_VOICES = (JOE,)
DEFAULT_VOICE = JOE
VOICE_ALIASES = {"": DEFAULT_VOICE, "default": DEFAULT_VOICE}  # what a caller may say for the default voice


def check_stt_model(name: str) -> str:
    if name not in STT_MODELS:
        raise ValueError(f"unknown stt_model {name!r}: choose one of {', '.join(STT_MODELS)}")
    return name


def check_voice(name: str) -> str:
    """The voice `name` stands for ("" and "default": DEFAULT_VOICE); ValueError if there is none."""
    voice = VOICE_ALIASES.get(name, name)
    if voice not in TTS_VOICES:
        raise ValueError(f"unknown voice {name!r}: choose one of {', '.join(TTS_VOICES)} (or 'default')")
    return voice
