"""The engine's models by name: what `stt_model` (PARLEY_STT_MODEL, --stt-model), `turn_cues`
(PARLEY_TURN_CUES) and a TTS stream's `voice` (Engine.open_tts) may choose. A new backend adds its name here, and
engine/runtime/engine.py builds it.

Speech-to-text:
- "whisper-tiny.en" (default): Whisper tiny.en reads the caller's words (engine/whisper.py,
  engine/whisper_stream.py); Parley's SSM recognizer, batched in the runtime's tick, decides
  when speech starts; at a pause, the words and `turn_cues` (below) decide whether the turn
  ended (engine/turn_cues.py). Real-dev WER 0.07 (MODEL_CARD.md).
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

# Whisper's turn ends: which heads that hear the voice may confirm a turn's end at a pause
# (engine/whisper_stream.py Pause.heard_end), besides the words: the pause head
# (engine/pause_head.py), the SSM's end-of-turn head, both, or neither.
TURN_CUES = ("pause", "ssm", "ssm+pause", "words")
DEFAULT_TURN_CUES = "pause"  # chosen on held-out synthetic turns whose pauses the voice made inside
# one utterance (engine/train/pause_data.py, every 7th file: 69 turns, 128 pauses): the pause head
# took 6.3 % of the pauses for ends, 851 ms p50 after the last word; the SSM's head 10.9 %, 585 ms.
# The pause-taking target (5 %) binds first: a caller cut off mid-turn is talked over. On real
# voices (measured only, MODEL_CARD.md) the SSM's head took 64 % of the pauses between whole
# sentences and 11 % of those inside sentences; the pause head 7 % and 0 %.


def check_turn_cues(name: str) -> str:
    if name not in TURN_CUES:
        raise ValueError(f"unknown turn_cues {name!r}: choose one of {', '.join(TURN_CUES)}")
    return name


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
