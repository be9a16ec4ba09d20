"""Transcribe mode: the caller's speech becomes live transcript events; nothing is spoken.

For captioning and call analytics, and the listening half of the conversation loop: the
16 kHz frames from the jitter buffer go to the engine's streaming recognizer, and its
events go to the caller's `events` channel (docs/events.md):

    SpeechStart -> speech.start    Partial -> transcript.partial
    Final       -> transcript.final (with word times)    EndOfTurn -> turn.end
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engine.interface import EndOfTurn, Final, Partial, SpeechStart

from .events import EventChannel

log = logging.getLogger("parley.transcribe")


class Transcribe:
    def __init__(self, stream: Any, events: EventChannel) -> None:
        self.stream = stream  # engine SttStream
        self.events = events
        self.failed = False

    def on_audio(self, pcm: np.ndarray) -> None:
        if not self.failed:
            self.stream.push(pcm)

    async def run(self) -> None:
        """Forward recognizer events until the stream ends; a failed stream is reported once."""
        try:
            async for event in self.stream.events():
                self._emit(event)
        except Exception as exc:  # the engine closed this stream on an error of its own
            self.failed = True
            log.warning("speech recognition stopped for this call", extra={"error": type(exc).__name__})
            self.events.error("engine_error", "speech recognition stopped for this call")

    def _emit(self, event: Any) -> None:
        if isinstance(event, SpeechStart):
            self.events.emit("speech.start", audio_t=round(event.t, 3))
        elif isinstance(event, Partial):
            self.events.emit("transcript.partial", text=event.text, tentative=event.tentative)
        elif isinstance(event, Final):
            words = [{"word": w, "start": round(t0, 3), "end": round(t1, 3)} for w, t0, t1 in event.words]
            self.events.emit("transcript.final", text=event.text, words=words)
        elif isinstance(event, EndOfTurn):
            self.events.emit("turn.end", confidence=round(event.confidence, 3))

    def describe(self) -> dict:
        return {"mode": "transcribe", "note": "live transcript of your speech; nothing is spoken back"}

    def close(self) -> None:
        self.stream.close()
