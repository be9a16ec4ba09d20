"""The engine's models by name: what `stt_model` (PARLEY_STT_MODEL, --stt-model) may choose.

- "whisper-tiny.en" (default): Whisper tiny.en reads the caller's words (engine/whisper.py,
  engine/whisper_stream.py); Parley's SSM recognizer, batched in the runtime's tick, decides
  when speech starts and when a turn ends. Real-dev WER 0.07 (MODEL_CARD.md).
- "ssm": Parley's SSM recognizer alone (engine/stt.py): the words from its own CTC head and
  language model. Light and fast, but learned from synthetic voices: 0.96 WER on real callers.
"""

from __future__ import annotations

WHISPER = "whisper-tiny.en"
SSM = "ssm"
STT_MODELS = (WHISPER, SSM)
DEFAULT_STT_MODEL = WHISPER


def check_stt_model(name: str) -> str:
    if name not in STT_MODELS:
        raise ValueError(f"unknown stt_model {name!r}: choose one of {', '.join(STT_MODELS)}")
    return name
