"""SpeechEngine: interface.Engine over one Runtime, the engine the gateway opens streams on.

It chooses the models by name (engine/models.py): the STT model, with Whisper's readers and
the VAD when Whisper reads the words, and the TTS voice a stream asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from ..interface import EngineStats
from ..models import (DEFAULT_STT_MODEL, DEFAULT_TURN_CUES, DEFAULT_VOICE, SSM, WHISPER, check_stt_model,
                      check_turn_cues, check_voice)
from ..priority import lower_priority_of_new_threads
from ..stt import SttModel, load_model
from ..tts import TtsModel
from ..vad import SileroVad
from ..whisper import WhisperReader
from ..whisper_readers import ReadingWorker
from .loop import Runtime
from .stt_stream import RuntimeSttStream
from .tts_stream import RuntimeTtsStream


class SpeechEngine:
    """interface.Engine over one Runtime: what the gateway opens streams on.

        engine = SpeechEngine()            # shipped weights; FileNotFoundError if not trained yet
        await asyncio.to_thread(engine.start)   # warm-up + loop thread; then engine.ready
        ok, retry_after_s = engine.admission()  # before accepting a call: 503 + Retry-After if not ok
        stream = engine.open_stt(session_id)
    """

    def __init__(self, stt_model: Union[SttModel, str, None] = None, *, weights_path: Optional[Path] = None,
                 tts_model: Optional[TtsModel] = None, tts_weights_path: Optional[Path] = None,
                 with_tts: bool = False, readers: int = 1, turn_cues: str = DEFAULT_TURN_CUES,
                 **runtime_options: Any) -> None:
        """stt_model: a name from engine.models (default DEFAULT_STT_MODEL: Whisper reads the
        words, over the SSM at weights_path or the shipped one), or an SttModel, which then
        recognizes alone. readers: threads that run Whisper's readings; turn_cues: which heads
        confirm a turn's end at a pause (engine.turn_cues.TURN_CUES). with_tts (or a
        tts_model) adds speech synthesis: the shipped TTS weights unless a path or model is
        given (FileNotFoundError when there are none)."""
        with lower_priority_of_new_threads():  # every thread the engine starts (engine/priority.py)
            name = check_stt_model(stt_model if isinstance(stt_model, str)
                                   else DEFAULT_STT_MODEL if stt_model is None else SSM)
            model = stt_model if isinstance(stt_model, SttModel) else load_model(weights_path)
            if name == WHISPER:
                head = "shipped" if "pause" in check_turn_cues(turn_cues) else None
                runtime_options["words"] = (ReadingWorker(WhisperReader(), readers, head), SileroVad())
                runtime_options["turn_cues"] = turn_cues
            self.stt_model = name
            if tts_model is None and (with_tts or tts_weights_path is not None):
                from ..tts import load_model as load_tts

                tts_model = load_tts(tts_weights_path)
            self.runtime = Runtime(model, tts_model=tts_model, **runtime_options)
        self._ready = False

    def start(self) -> None:
        """Warm up on the device and start the tick loop (blocks for the warm-up)."""
        with lower_priority_of_new_threads():  # the tick loop, the renderers, the libraries' threads
            self.runtime.warm_up()
            self.runtime.start()
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready and self.runtime.running

    @property
    def device(self) -> str:
        return str(self.runtime.device)

    def open_stt(self, session_id: str) -> RuntimeSttStream:
        return self.runtime.open_stt(session_id)

    def open_tts(self, session_id: str, voice: str = DEFAULT_VOICE) -> RuntimeTtsStream:
        """A streaming synthesizer for one reply, batched into the tick. `voice`: one of
        engine.models.TTS_VOICES ("default" or "": the default one); ValueError otherwise."""
        check_voice(voice)
        return self.runtime.open_tts(session_id)

    def admission(self) -> tuple[bool, float]:
        return self.runtime.admission()

    def stats(self) -> EngineStats:
        return self.runtime.stats()

    def close(self) -> None:
        self._ready = False
        self.runtime.close()
