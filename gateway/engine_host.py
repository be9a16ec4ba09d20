"""The speech engine inside the gateway: built and warmed up at start, asked before a call
is admitted, scraped for /metrics, closed at shutdown.

The engine (engine.SpeechEngine) runs its batched tick loop on its own threads, in a child
process of its own (config engine_process, the default: engine.EngineProcess; its threads
share no GIL with the calls' event loop) or in this process; nothing here blocks the event
loop (loading and warm-up run in that process or in a worker thread). Only the engine
contract (engine.interface.Engine) is used here.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

import engine
from engine.interface import DEFAULT_VOICE, Engine, SttStream, TtsStream

from .config import Config

log = logging.getLogger("parley.engine")


class EngineHost:
    def __init__(self, config: Config, speech_engine: Optional[Engine] = None) -> None:
        """`speech_engine` replaces the one built from config (tests pass a small model's)."""
        self.config = config
        self.engine = speech_engine

    async def warm_up(self) -> None:
        """Load the weights (unless given an engine), warm up on the device, start the loop."""
        if self.engine is None and self.config.engine_process:
            process = engine.EngineProcess(self._options())
            await process.launch()
            self.engine = process
        else:
            if self.engine is None:
                self.engine = await asyncio.to_thread(lambda: engine.SpeechEngine(**self._options(paths=Path)))
            await asyncio.to_thread(self.engine.start)
        stats = self.engine.stats()
        log.info("engine ready", extra={"device": self.engine.device, "max_streams": stats.max_streams,
                                        "process": getattr(self.engine, "pid", None)})

    def _options(self, paths: Any = str) -> dict[str, Any]:
        """SpeechEngine's keyword arguments from the config (`paths`: how weight paths are given)."""
        config = self.config
        return dict(stt_model=config.stt_model, readers=config.stt_readers, turn_cues=config.turn_cues,
                    weights_path=paths(config.stt_weights) if config.stt_weights else None,
                    with_tts=config.mode == "conversation",
                    tts_weights_path=paths(config.tts_weights) if config.tts_weights else None,
                    max_streams=config.engine_max_streams, device=config.engine_device,
                    num_threads=config.engine_threads or None,
                    turn_end_probability=config.turn_end_probability or None)

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready

    def admission(self) -> tuple[bool, float]:
        """(admit a call now?, Retry-After seconds): no while warming up or when ticks run late."""
        if not self.ready:
            return False, float(self.config.retry_after_s)
        return self.engine.admission()

    def open_stt(self, session_id: str) -> SttStream:
        return self.engine.open_stt(session_id)

    def open_tts(self, session_id: str, voice: str = DEFAULT_VOICE) -> TtsStream:
        return self.engine.open_tts(session_id, voice)

    async def close(self) -> None:
        if isinstance(self.engine, engine.EngineProcess):
            await self.engine.aclose()
        elif self.engine is not None:
            await asyncio.to_thread(self.engine.close)

    def collect(self) -> Iterator[Any]:
        """Prometheus collector: tick time, batch size, lag and streams of the engine loop."""
        if self.engine is None:
            return
        if isinstance(self.engine, engine.EngineProcess):
            yield CounterMetricFamily("parley_engine_restarts", "Engine processes started again after one died",
                                      value=self.engine.restarts)
        stats = self.engine.stats()
        if stats is None:
            return
        ticks = HistogramMetricFamily("parley_engine_tick_seconds", "Duration of one batched engine tick")
        ticks.add_metric([], [(_bound(upper), count) for upper, count in stats.tick_histogram],
                         sum_value=stats.tick_seconds_sum)
        yield ticks
        yield CounterMetricFamily("parley_engine_late_ticks", "Engine ticks longer than the tick budget",
                                  value=stats.late_ticks)
        yield GaugeMetricFamily("parley_engine_batch_size", "Rows in the largest batched step of the last tick",
                                value=stats.last_batch)
        yield GaugeMetricFamily("parley_engine_streams", "Open engine STT streams", value=stats.streams_open)
        yield GaugeMetricFamily("parley_engine_tts_streams", "Replies being synthesized", value=stats.tts_streams_open)
        yield CounterMetricFamily("parley_engine_tts_late_chunks",
                                  "Synthesized audio chunks that came after their playout time",
                                  value=stats.late_audio_chunks)
        yield GaugeMetricFamily("parley_engine_max_streams", "Engine stream slots", value=stats.max_streams)
        yield GaugeMetricFamily("parley_engine_behind_seconds", "How far the tick loop is behind schedule",
                                value=stats.behind_ms / 1000)
        if stats.lag_ms_p95 is not None:
            yield GaugeMetricFamily("parley_engine_stt_lag_p95_seconds",
                                    "Audio pushed -> its frame recognized, p95 over recent frames",
                                    value=stats.lag_ms_p95 / 1000)
        if stats.ttfa_ms_p95 is not None:
            yield GaugeMetricFamily("parley_engine_tts_first_audio_p95_seconds",
                                    "A reply's first text -> its first synthesized audio, p95 over recent replies",
                                    value=stats.ttfa_ms_p95 / 1000)
        if stats.gpu_memory_bytes is not None:
            yield GaugeMetricFamily("parley_engine_gpu_memory_bytes", "CUDA memory allocated by the engine",
                                    value=stats.gpu_memory_bytes)


def _bound(upper: float) -> str:
    return "+Inf" if upper == float("inf") else repr(upper)
