"""The speech engine inside the gateway: built and warmed up at start, asked before a call
is admitted, scraped for /metrics, closed at shutdown.

The engine (engine.SpeechEngine) runs its batched tick loop on its own thread; nothing
here blocks the event loop (loading and warm-up run in a worker thread). Only the engine
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
        if self.engine is None:
            self.engine = await asyncio.to_thread(self._build)
        await asyncio.to_thread(self.engine.start)
        stats = self.engine.stats()
        log.info("engine ready", extra={"device": self.engine.device, "max_streams": stats.max_streams})

    def _build(self) -> Engine:
        weights = Path(self.config.stt_weights) if self.config.stt_weights else None
        tts_weights = Path(self.config.tts_weights) if self.config.tts_weights else None
        return engine.SpeechEngine(self.config.stt_model, weights_path=weights, readers=self.config.stt_readers,
                                   turn_cues=self.config.turn_cues,
                                   with_tts=self.config.mode == "conversation",
                                   tts_weights_path=tts_weights, max_streams=self.config.engine_max_streams,
                                   device=self.config.engine_device, num_threads=self.config.engine_threads or None,
                                   turn_end_probability=self.config.turn_end_probability or None)

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
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)

    def collect(self) -> Iterator[Any]:
        """Prometheus collector: tick time, batch size, lag and streams of the engine loop."""
        if self.engine is None:
            return
        stats = self.engine.stats()
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
