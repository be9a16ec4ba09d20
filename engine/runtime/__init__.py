"""One batched inference loop for every stream (docs/architecture.md, "The engine contract").

    slots.py       state pools, slot tables, the thread-to-loop event queue, the stream base
    stt_stream.py  a caller's STT stream and STT's part of each tick (SttStepper)
    tts_stream.py  a reply's TTS stream, the render thread and TTS's part of each tick (TtsStepper)
    loop.py        Runtime: the tick thread, its metrics and admission control
    engine.py      SpeechEngine: interface.Engine over one Runtime

Importing this package loads torch; `import engine` alone does not.
"""

from ..interface import CapacityError, EngineStats, StreamFailed
from .engine import SpeechEngine
from .loop import (ADMISSION_WINDOW, ADMIT_LOAD, BUSY_WINDOW_S, EARLY_TICK_BUSY, Runtime, RuntimeStats, TickMetrics,
                   default_dtype, prepare_model, resolve_device)
from .slots import EventQueue, RuntimeStream, SlotTable, StatePool, Stepper, StepReport
from .stt_stream import INT8_MAX_ROWS, MAX_FRAMES_PER_TICK, RuntimeSttStream, SttStepper, frame_end_sample
from .tts_stream import (TTS_CHUNK_FRAMES, TTS_ENCODE_MIN_IDS, TTS_FIRST_FRAMES, TTS_MAX_LEAD_S, TTS_READY_FRAMES,
                         TTS_TEXT_PIECE_CHARS, RenderWorker, RuntimeTtsStream, TtsStepper)

__all__ = [
    "CapacityError", "EngineStats", "StreamFailed", "SpeechEngine",
    "ADMISSION_WINDOW", "ADMIT_LOAD", "BUSY_WINDOW_S", "EARLY_TICK_BUSY", "Runtime", "RuntimeStats", "TickMetrics",
    "default_dtype", "prepare_model", "resolve_device",
    "EventQueue", "RuntimeStream", "SlotTable", "StatePool", "Stepper", "StepReport",
    "INT8_MAX_ROWS", "MAX_FRAMES_PER_TICK", "RuntimeSttStream", "SttStepper", "frame_end_sample",
    "TTS_CHUNK_FRAMES", "TTS_ENCODE_MIN_IDS", "TTS_FIRST_FRAMES", "TTS_MAX_LEAD_S", "TTS_READY_FRAMES",
    "TTS_TEXT_PIECE_CHARS", "RenderWorker", "RuntimeTtsStream", "TtsStepper",
]
