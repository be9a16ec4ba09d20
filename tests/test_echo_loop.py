"""Parley must not interrupt itself when its voice comes back through the caller's
microphone — and a caller talking over it must still get through.

The whole listening path is real: the pacer (on a simulated clock, so ~17 replies run in
seconds), the echo suppressor, the shipped STT model on the batched runtime (ticked in step
with the audio), and the conversation loop. Parley's voice is recorded speech (a held-out
voice, tests/data/speech) played as the reply audio, and the caller's "microphone" hears it
back at -6 dB after 60-250 ms, plus faint noise.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncIterator, Optional

import numpy as np
import pytest

from engine.audio import to_float
from engine.interface import Audio, WordMark
from engine.runtime import Runtime
from engine.stt import load_model
from gateway.conversation import Conversation
from gateway.events import EventChannel
from gateway.pacer import PacedAudioTrack
from gateway.responders import EchoResponder
from tests.test_stt_shipped import SPEECH, fixtures

FRAME_16K = 320
ECHO_GAIN = 0.5  # -6 dB
REPLIES_PER_DELAY = 17  # x 3 delays: 51 replies
CHUNK = 1600  # TTS audio arrives in 100 ms pieces


def as_int16(audio: np.ndarray) -> np.ndarray:
    return (to_float(audio) * 32767).astype(np.int16)


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class RecordedTts:
    """TtsStream whose voice is a recording: every reply is that utterance, with word marks."""

    def __init__(self, audio: np.ndarray, text: str) -> None:
        self.audio, self.words = audio, text.split()
        self._queue: asyncio.Queue = asyncio.Queue()

    def push_text(self, delta: str) -> None: ...

    def end(self) -> None:
        step = len(self.audio) // len(self.words)
        for i, word in enumerate(self.words):
            self._queue.put_nowait(WordMark(word, i * step))
        for start in range(0, len(self.audio), CHUNK):
            self._queue.put_nowait(Audio(self.audio[start:start + CHUNK], 16000))
        self._queue.put_nowait(None)

    def cancel(self) -> None:
        self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[Any]:
        while (item := await self._queue.get()) is not None:
            yield item


class EchoCall:
    """A call whose caller has no echo cancellation: what Parley sends comes back."""

    def __init__(self, delay_ms: int, caller_speech: Optional[np.ndarray] = None, barge_in_at_s: float = 0.0):
        voice, self.text = fixtures()[1]  # "timing must be perfect now"
        self.voice = as_int16(voice)
        self.clock = SimulatedClock()
        self.pacer = PacedAudioTrack(clock=self.clock, sleep=self.clock.sleep)
        self.runtime = Runtime(load_model(), max_streams=1, device="cpu", num_threads=1)
        self.sent: list[dict] = []
        events = EventChannel(on_emit=lambda event, text: self.sent.append(event))
        self.conversation = Conversation(self.runtime.open_stt("caller"), lambda: RecordedTts(self.voice, self.text),
                                         EchoResponder(), self.pacer, events, history=[], idle_prompt_s=1e9,
                                         speculate_after_s=None)
        reference = self.pacer.on_sent
        self.pacer.on_sent = lambda frame: (reference(frame), self._outbound.append(frame.audio))
        self._outbound: deque = deque()
        self._echo_line = deque([np.zeros(FRAME_16K, np.float32)] * (delay_ms // 20))
        self._noise = np.random.default_rng(1)
        self.caller_speech, self.barge_in_at_s = caller_speech, barge_in_at_s
        self._caller_pos: Optional[int] = None

    def count(self, type_: str) -> int:
        return sum(e["type"] == type_ for e in self.sent)

    async def run(self, replies: int, max_steps: int = 40_000) -> None:
        listener = asyncio.ensure_future(self.conversation.run())
        try:
            for step in range(max_steps):
                if self.count("response.audio.end") + self.count("response.interrupted") >= replies:
                    return
                if self.conversation.state == "listening" and self.conversation.reply is None:
                    self.conversation.say(self.text)
                await self.pacer.recv()  # one 20 ms frame out, on the simulated clock
                self.conversation.on_audio(self._microphone())
                if step % 2:
                    self.runtime.tick()
                for _ in range(3):
                    await asyncio.sleep(0)
            raise AssertionError(f"only {self.count('response.audio.end')} replies in {max_steps} frames")
        finally:
            listener.cancel()
            self.conversation.close()
            self.runtime.close()

    def _microphone(self) -> np.ndarray:
        sent = self._outbound.popleft().astype(np.float32) if self._outbound else np.zeros(960, np.float32)
        self._echo_line.append(sent.reshape(-1, 3).mean(axis=1))
        heard = ECHO_GAIN * self._echo_line.popleft() + self._noise.normal(0, 30, FRAME_16K)
        heard += self._caller_frame()
        return np.clip(heard, -32768, 32767).astype(np.int16)

    def _caller_frame(self) -> np.ndarray:
        reply = self.conversation.reply
        if self.caller_speech is None or reply is None or reply.start_sample is None:
            return 0.0
        if self._caller_pos is None and self.pacer.played_samples - reply.start_sample > self.barge_in_at_s * 48000:
            self._caller_pos = 0
        if self._caller_pos is None or self._caller_pos >= len(self.caller_speech):
            return 0.0
        frame = np.zeros(FRAME_16K, np.float32)
        piece = self.caller_speech[self._caller_pos:self._caller_pos + FRAME_16K]
        frame[:len(piece)] = piece
        self._caller_pos += FRAME_16K
        return frame


@pytest.mark.parametrize("delay_ms", [60, 150, 250])
async def test_parley_never_interrupts_itself_on_its_own_echo(delay_ms):
    call = EchoCall(delay_ms)
    await call.run(REPLIES_PER_DELAY)
    assert call.count("response.audio.end") == REPLIES_PER_DELAY
    assert call.count("response.interrupted") == 0 and call.count("response.resumed") == 0, \
        f"self-interruptions at {delay_ms} ms: {[e for e in call.sent if e['type'].startswith('response.')][:6]}"
    assert call.count("response.paused") == 0, f"Parley paused for its own echo at {delay_ms} ms"
    assert call.conversation.echo.suppressed_frames > 0


async def test_a_caller_still_barges_in_over_the_echo():
    caller, _ = fixtures()[0]  # "my name is sue", another voice than Parley's
    call = EchoCall(150, caller_speech=as_int16(caller).astype(np.float32), barge_in_at_s=1.0)
    await call.run(replies=1)
    interrupted = [e for e in call.sent if e["type"] == "response.interrupted"]
    assert interrupted, f"no barge-in: {[e['type'] for e in call.sent]}"
    assert call.count("response.paused") == 1, "the caller's onset paused the reply before their word stopped it"
    assert 900 <= interrupted[0]["played_ms"] < 3000
