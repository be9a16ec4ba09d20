"""The conversation loop's turn-taking, barge-in and responder handling, on the real pacer
(paced in real time) with the real responders.

Recognizer events are fed in directly (the loop's input contract), so each scenario is
exact. Speech comes from `ToneTts`, a small but complete TtsStream: each word becomes a
tone of WORD_S seconds with a WordMark at its start — real audio and real marks, so what
"the caller heard" is decided by the pacer's played-sample count exactly as in a call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, AsyncIterator, Callable, Optional

import numpy as np
import pytest

from engine import CapacityError, StreamFailed
from engine.interface import Audio, EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, WordMark
from gateway.barge_in import FALSE_INTERRUPTION_S, MAX_PAUSE_S
from gateway.conversation import TTS_APOLOGY, Conversation
from gateway.events import EventChannel
from gateway.pacer import PacedAudioTrack
from gateway.responders import EchoResponder, Handoff, Responder
from gateway.responders.openai import OpenAIResponder
from gateway.dialog import Turn
from tests.kit.ports import free_port

TTS_RATE = 16000
WORD_S = 0.1  # each word plays for this long
DEADLINE_S = 30.0  # generous: the machine may be busy
_END = object()


async def queued_events(queue: asyncio.Queue) -> AsyncIterator[Any]:
    """A test stream's events until _END; an exception in the queue is the engine failing it."""
    while True:
        item = await queue.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class ToneTts:
    """TtsStream: a tone per word, synthesized as soon as the word is complete."""

    sample_rate = TTS_RATE

    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pending = ""
        self._offset = 0
        self.spoken: list[str] = []

    def push_text(self, delta: str) -> None:
        self._pending += delta
        *complete, self._pending = self._pending.split(" ")
        for word in filter(None, complete):
            self._say(word)

    def end(self) -> None:
        if self._pending.strip():
            self._say(self._pending.strip())
        self._pending = ""
        self._queue.put_nowait(_END)

    def cancel(self) -> None:
        self._queue.put_nowait(_END)

    def _say(self, word: str) -> None:
        n = int(WORD_S * TTS_RATE)
        tone = (np.sin(2 * np.pi * 300 * np.arange(n) / TTS_RATE) * 8000).astype(np.int16)
        self._queue.put_nowait(WordMark(word, self._offset))
        self._queue.put_nowait(Audio(tone, TTS_RATE))
        self._offset += n
        self.spoken.append(word)

    def events(self) -> AsyncIterator[Any]:
        return queued_events(self._queue)


class FailingTts(ToneTts):
    """A ToneTts that the engine fails once `words` words have been synthesized: their audio
    comes out, then events() raises StreamFailed (as the runtime does for a broken stream)."""

    def __init__(self, words: int) -> None:
        super().__init__()
        self.words = words

    def _say(self, word: str) -> None:
        if len(self.spoken) == self.words:
            self._queue.put_nowait(StreamFailed("TTS stream 's' failed: RuntimeError('decoder diverged')"))
        super()._say(word)


class ScriptedStt:
    """A recognizer stream the test drives: `hear` gives it events, `fail` breaks it as the
    runtime does (events() raises StreamFailed; pushes after that are ignored)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def push(self, pcm: np.ndarray) -> None: ...

    def flush(self) -> None: ...

    def hear(self, text: str) -> None:
        words = [(word, 0.2 + 0.35 * i, 0.5 + 0.35 * i) for i, word in enumerate(text.split())]
        for event in (SpeechStart(0.1), Partial(text), Final(text, words), EndOfTurn(0.9)):
            self._queue.put_nowait(event)

    def fail(self) -> None:
        self._queue.put_nowait(StreamFailed("STT stream 's' failed: ValueError('audio is not finite')"))

    def events(self) -> AsyncIterator[Any]:
        return queued_events(self._queue)

    def close(self) -> None:
        self.closed = True
        self._queue.put_nowait(_END)


class IdleStt:
    """The loop's recognizer stream when the test feeds events itself."""

    flushed = 0

    def push(self, pcm: np.ndarray) -> None: ...

    def flush(self) -> None:
        self.flushed += 1

    async def events(self) -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield  # pragma: no cover

    def close(self) -> None: ...


class Harness:
    """`open_tts` makes each reply's TTS stream (ToneTts by default); `open_stt`, when given,
    makes the recognizer stream and each one that replaces a failed one (else IdleStt)."""

    def __init__(self, responder: Responder, history: Optional[list[Turn]] = None,
                 open_tts: Callable[[], Any] = ToneTts, open_stt: Optional[Callable[[], Any]] = None,
                 **options) -> None:
        self.sent: list[dict] = []
        self.pacer = PacedAudioTrack()
        self.tts_streams: list[Any] = []
        self.stt_streams: list[Any] = []
        self.hung_up: list[str] = []
        self._make_tts, self._make_stt = open_tts, open_stt
        events = EventChannel(on_emit=lambda event, text: self.sent.append(event))
        stt = self._open_stt() if open_stt is not None else IdleStt()
        if open_stt is not None:
            options["reopen_stt"] = self._open_stt
        self.conversation = Conversation(stt, self._open_tts, responder, self.pacer, events,
                                         history=history if history is not None else [],
                                         hang_up=self._hang_up, on_change=self._changed, **options)
        self.changes = 0
        self._player = asyncio.ensure_future(self._play())

    def _open_tts(self) -> Any:
        self.tts_streams.append(self._make_tts())
        return self.tts_streams[-1]

    def _open_stt(self) -> Any:
        self.stt_streams.append(self._make_stt())
        return self.stt_streams[-1]

    def _changed(self) -> None:
        self.changes += 1

    async def _hang_up(self, reason: str) -> None:
        self.hung_up.append(reason)

    async def _play(self) -> None:
        while True:  # what aiortc's RTP sender does: pull a frame every 20 ms
            await self.pacer.recv()

    def say(self, text: str) -> None:
        words, t = [], 0.2
        for word in text.split():
            words.append((word, t, t + 0.3))
            t += 0.35
        for event in (SpeechStart(0.1), Partial(text), Final(text, words), EndOfTurn(0.9)):
            self.conversation.on_stt_event(event)

    def types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    async def wait_for(self, type_: str, count: int = 1) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while len([e for e in self.sent if e["type"] == type_]) < count:
            assert time.monotonic() < deadline, f"no {type_} within {DEADLINE_S} s; got {self.types()}"
            await asyncio.sleep(0.01)
        return [e for e in self.sent if e["type"] == type_][count - 1]

    async def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S} s; got {self.types()}"
            await asyncio.sleep(0.01)

    async def frames_sent(self, count: int) -> None:
        target = self.pacer.stats.frames_sent + count
        deadline = time.monotonic() + DEADLINE_S
        while self.pacer.stats.frames_sent < target:
            assert time.monotonic() < deadline, "the pacer stopped sending"
            await asyncio.sleep(0.005)

    async def wait_played(self, seconds: float) -> None:
        reply = self.conversation.reply
        deadline = time.monotonic() + DEADLINE_S
        while reply.start_sample is None or self.pacer.played_samples - reply.start_sample < seconds * 48000:
            assert time.monotonic() < deadline, "the reply did not play"
            await asyncio.sleep(0.005)

    def start(self) -> None:
        self._runner = asyncio.ensure_future(self.conversation.run())

    async def close(self) -> None:
        if hasattr(self, "_runner"):
            self._runner.cancel()
        self.conversation.close()
        self._player.cancel()
        self.pacer.stop()


@pytest.fixture
async def harness():
    made: list[Harness] = []

    def make(responder: Responder, **kwargs) -> Harness:
        made.append(Harness(responder, **kwargs))
        return made[-1]

    yield make
    for h in made:
        await h.close()


LONG = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"


async def test_a_reply_streams_plays_out_and_enters_the_history(harness):
    h = harness(EchoResponder())
    h.say("hello there")
    end = await h.wait_for("response.audio.end")
    assert h.types().index("response.text.delta") < h.types().index("response.audio.start") < h.types().index(
        "response.audio.end")
    metrics = await h.wait_for("metrics.turn")
    assert metrics["turn"] == end["turn"] == 1
    assert metrics["end_of_turn_ms"] >= 0 and metrics["total_ms"] >= metrics["first_frame_ms"] >= 0
    history = h.conversation.history
    assert history[0] == Turn("user", "hello there")
    assert history[1].role == "assistant" and history[1].heard_text == history[1].text == "You said: hello there"
    assert h.tts_streams[0].spoken == ["You", "said:", "hello", "there"]
    assert h.conversation.state == "listening"


async def long_reply_playing(harness, words_played: int) -> Harness:
    """A conversation whose (echoed) reply to LONG has played `words_played` words."""
    h = harness(EchoResponder())
    h.say(LONG)
    await h.wait_for("response.audio.start")
    await h.wait_played(words_played * WORD_S)
    return h


async def test_the_pages_playout_report_adds_the_browser_stage(harness):
    """playout.started {turn} completes the reply's metrics with a second metrics.turn; a
    malformed or stale report gets an error event and the reply plays on."""
    h = await long_reply_playing(harness, 1)
    server_stages = await h.wait_for("metrics.turn")
    turn = server_stages["turn"]
    bad = [{"type": "playout.started"}, {"type": "playout.started", "turn": "1"},
           {"type": "playout.started", "turn": True}, {"type": "playout.started", "turn": turn + 1}]
    for message in bad:
        h.conversation.events.receive(json.dumps(message))
    assert [e["code"] for e in h.sent if e["type"] == "error"] == ["bad_message"] * len(bad)

    h.conversation.events.receive(json.dumps({"type": "playout.started", "turn": turn}))
    browser_stage = await h.wait_for("metrics.turn", count=2)
    assert browser_stage["turn"] == turn and browser_stage["browser_playout_ms"] >= 0
    assert "total_ms" not in browser_stage, "the server's stages are not sent (or counted) twice"
    h.conversation.events.receive(json.dumps({"type": "playout.started", "turn": turn}))
    assert [e["code"] for e in h.sent if e["type"] == "error"] == ["bad_message"] * (len(bad) + 1), \
        "a turn is reported once"
    assert (await h.wait_for("response.audio.end"))["turn"] == turn, "the reply played on"


async def test_barge_in_stops_audio_at_once_and_keeps_only_what_was_heard(harness):
    h = await long_reply_playing(harness, 5)
    h.conversation.on_stt_event(SpeechStart(3.0))
    assert h.pacer.held and h.types()[-1] == "response.paused", "the caller's onset silences the next frame"
    assert h.conversation.state == "speaking" and h.pacer.queued_ms > 0, "paused, not yet interrupted"
    played = h.pacer.played_samples
    await h.frames_sent(3)
    assert h.pacer.played_samples == played, "nothing plays while paused"
    h.conversation.on_stt_event(Partial("wait"))
    assert h.pacer.queued_ms == 0 and not h.pacer.held, "a word drops the queued reply"
    interrupted = await h.wait_for("response.interrupted")
    assert interrupted["played_ms"] == round(played * 1000 / 48000), "heard up to the pause"
    full = "You said: " + LONG
    heard = interrupted["heard_text"]
    assert full.startswith(heard) and 5 <= len(heard.split()) < len(full.split())
    assert 5 * WORD_S * 1000 <= interrupted["played_ms"] < len(full.split()) * WORD_S * 1000
    assert h.conversation.history[-1] == Turn("assistant", full, heard_text=heard)
    await asyncio.sleep(0.2)
    assert h.pacer.queued_ms == 0 and "response.audio.end" not in h.types(), "nothing more is played"
    assert h.conversation.state == "user_speaking"


async def test_a_cough_or_mm_hm_does_not_stop_the_reply(harness):
    h = await long_reply_playing(harness, 4)
    for event in (SpeechStart(3.0), Partial("mm hm"), Partial("s"), Final("mm hm", [("mm", 3.0, 3.2), ("hm", 3.3, 3.5)])):
        h.conversation.on_stt_event(event)  # what a recognizer makes of a cough or a backchannel
    assert h.pacer.held and h.types().count("response.paused") == 1
    continued = await h.wait_for("response.continued")
    assert continued["paused_ms"] >= 500 and not h.pacer.held, "no word within 600 ms: it plays on"
    await h.wait_for("response.audio.end")
    assert "response.interrupted" not in h.types()
    assert h.tts_streams[0].spoken == ("You said: " + LONG).split(), "spoken once, in full"
    assert h.conversation.history[-1].heard_text == "You said: " + LONG


async def test_likely_speech_pauses_the_reply_and_plays_it_on_when_no_word_follows(harness):
    h = await long_reply_playing(harness, 4)
    h.conversation.on_stt_event(SpeechLikely(3.0, 0.85))
    assert h.pacer.held and h.types()[-1] == "response.paused", "the head's lean is enough to pause"
    assert h.conversation.state == "speaking"
    continued = await h.wait_for("response.continued")
    assert continued["paused_ms"] >= 500 and continued["rewound_ms"] == 0, "no cut at the client: nothing to rewind"
    await h.wait_for("response.audio.end")
    assert h.conversation.history[-1].heard_text == "You said: " + LONG


async def report_playout_delay(h: Harness) -> float:
    """The page's playout.started for the reply now playing, sent as its first frame goes
    out: returns the playout delay the gateway measured (s)."""
    first = await h.wait_for("metrics.turn")
    h.conversation.events.receive(json.dumps({"type": "playout.started", "turn": first["turn"]}))
    return (await h.wait_for("metrics.turn", count=2))["browser_playout_ms"] / 1000


async def test_a_client_cut_rewinds_a_reply_that_plays_on(harness):
    """playback.cut: the page silenced the audio still on its way at the pause, so the reply
    plays on from one playout delay before the pause, and no word is lost."""
    h = harness(EchoResponder())
    h.say(LONG)
    delay = await report_playout_delay(h)
    await h.wait_played(4 * WORD_S)
    h.conversation.on_stt_event(SpeechLikely(3.0, 0.85))
    turn = h.conversation.reply.turn
    paused_at = h.pacer.played_samples
    bad = [{"type": "playback.cut"}, {"type": "playback.cut", "turn": "x"}, {"type": "playback.cut", "turn": 0}]
    for message in bad + [{"type": "playback.cut", "turn": turn}]:
        h.conversation.events.receive(json.dumps(message))
    assert [e["code"] for e in h.sent if e["type"] == "error"] == ["bad_message"] * len(bad)
    continued = await h.wait_for("response.continued")
    assert continued["rewound_ms"] == pytest.approx(delay * 1000, abs=1)
    await h.frames_sent(1)
    assert h.pacer.played_samples <= paused_at - round(delay * 48000) + 960, "played on from before the pause"
    await h.wait_for("response.audio.end")
    assert h.tts_streams[0].spoken == ("You said: " + LONG).split(), "synthesized once"


async def test_tentative_words_are_shown_but_only_settled_words_barge_in(harness):
    h = await long_reply_playing(harness, 4)
    h.conversation.on_stt_event(Partial("", "wait"))  # heard once: the next reading may not agree
    partial = [e for e in h.sent if e["type"] == "transcript.partial"][-1]
    assert (partial["text"], partial["tentative"]) == ("", "wait")
    assert not h.pacer.held and h.conversation.state == "speaking", "a tentative word acts on nothing"
    h.conversation.on_stt_event(Partial("wait", ""))
    assert (await h.wait_for("response.interrupted"))["heard_text"], "a settled word interrupts"


async def test_a_client_cut_leaves_the_unheard_words_out_of_the_history(harness):
    h = harness(EchoResponder())
    h.say(LONG)
    delay = await report_playout_delay(h)
    await h.wait_played(6 * WORD_S + delay)
    h.conversation.on_stt_event(SpeechLikely(3.0, 0.85))
    played = h.pacer.played_samples - h.conversation.reply.start_sample
    h.conversation.events.receive(json.dumps({"type": "playback.cut", "turn": h.conversation.reply.turn}))
    h.conversation.on_stt_event(Partial("wait"))
    interrupted = await h.wait_for("response.interrupted")
    assert interrupted["played_ms"] == round((played - round(delay * 48000)) * 1000 / 48000)
    words_heard = math.ceil((played - round(delay * 48000)) / 48000 / WORD_S)  # a word counts once it started
    assert len(interrupted["heard_text"].split()) == words_heard


async def test_a_reply_stays_paused_while_the_caller_is_still_making_sound(harness):
    h = await long_reply_playing(harness, 4)
    h.conversation.on_stt_event(SpeechStart(3.0))
    await asyncio.sleep(FALSE_INTERRUPTION_S + 0.3)
    assert h.pacer.held and "response.continued" not in h.types(), "no Final or end of turn yet: still sounding"
    h.conversation.on_stt_event(Partial("hold on"))
    assert (await h.wait_for("response.interrupted"))["heard_text"], "the word came late, but it came"


async def test_a_long_wordless_sound_pauses_the_reply_for_a_bounded_time(harness):
    h = await long_reply_playing(harness, 4)
    h.conversation.on_stt_event(SpeechStart(3.0))   # a recognizer that hears speech in a buzz
    continued = await h.wait_for("response.continued")
    assert continued["paused_ms"] >= (MAX_PAUSE_S - 0.1) * 1000 and not h.pacer.held
    await h.wait_for("response.audio.end")


async def test_a_failing_responder_apologises_instead_of_going_silent(harness):
    h = harness(OpenAIResponder(f"http://127.0.0.1:{free_port()}/v1", "model", "key", "", 2.0, 5.0, None))
    h.say("what are your opening hours")
    error = await h.wait_for("error")
    assert error["code"].startswith("responder_")
    await h.wait_for("response.audio.end")
    assert "trouble" in h.conversation.history[-1].text
    assert h.tts_streams[0].spoken


async def test_actions_run_after_their_text_has_played(harness):
    class Closing(Responder):
        async def respond(self, history):
            yield "Let me get someone for you."
            yield Handoff("asked for a person")

    h = harness(Closing())
    h.say("can i talk to a person")
    handoff = await h.wait_for("session.handoff")
    assert handoff["reason"] == "asked for a person"
    assert h.types().index("response.audio.end") < h.types().index("session.handoff")


async def test_the_demo_flow_ends_the_call_after_saying_goodbye(harness):
    from gateway.config import Config
    from gateway.responders import make_responder

    h = harness(make_responder(Config().validate()), history=[Turn("assistant", "hi", heard_text="hi")])
    h.say("goodbye")
    await h.wait_for("response.audio.end")
    deadline = time.monotonic() + DEADLINE_S
    while not h.hung_up:
        assert time.monotonic() < deadline, "the call was not ended"
        await asyncio.sleep(0.01)
    assert h.hung_up == ["assistant_ended"]


async def test_a_turn_without_words_starts_nothing(harness):
    h = harness(EchoResponder())
    h.conversation.on_stt_event(SpeechStart(0.1))
    h.conversation.on_stt_event(EndOfTurn(0.8))
    await asyncio.sleep(0.2)
    assert "response.text.delta" not in h.types() and h.conversation.reply is None
    assert h.types() == ["turn.end"]
    assert h.conversation.state == "listening", "a cough must not leave the call waiting for words"


async def test_a_reconnected_caller_hears_the_rest_of_the_cut_off_reply(harness):
    first = await long_reply_playing(harness, 6)
    await asyncio.sleep(0.3)  # a progress save happens every 0.25 s while the reply plays
    pending = first.conversation.in_progress
    assert first.changes > 0 and pending is not None and pending.text == "You said: " + LONG
    heard = len(pending.heard_text.split())
    assert heard >= 6 and pending.played_ms >= 6 * WORD_S * 1000
    await first.close()  # the connection drops mid-reply

    second = harness(EchoResponder(), history=list(first.conversation.history), pending=pending)
    second.start()
    resumed = await second.wait_for("response.resumed")
    assert resumed["from_word"] == heard
    await second.wait_for("response.audio.end")
    assert second.tts_streams[0].spoken == pending.text.split()[heard:]
    assert second.conversation.history[-1] == Turn("assistant", pending.text, heard_text=pending.text)
    assert second.conversation.in_progress is None


async def test_turn_numbers_go_on_across_a_resume(harness):
    """A resumed session numbers its replies on from the last one (the session record keeps
    it), and the reply cut off by the drop goes on under its own number: one `turn` never names
    two replies. (Numbering from 1 again, bench/reconnect.py waited for a resumed reply's end
    by its turn, got the idle goodbye's, and spoke into a call that was ending.)"""
    first = harness(EchoResponder())
    first.say("hello")
    assert (await first.wait_for("response.audio.end"))["turn"] == 1
    first.say(LONG)
    await first.wait_until(lambda: first.conversation.reply is not None and first.conversation.reply.turn == 2,
                           "the second reply")
    await first.wait_played(3 * WORD_S)
    await asyncio.sleep(0.3)  # a progress save happens every 0.25 s while the reply plays
    pending, last_turn = first.conversation.in_progress, first.conversation.speaker.turns
    assert pending is not None and pending.turn == 2 and last_turn == 2
    await first.close()  # the connection drops mid-reply

    second = harness(EchoResponder(), history=list(first.conversation.history), pending=pending,
                     last_turn=last_turn)
    second.start()
    assert (await second.wait_for("response.resumed"))["turn"] == 2
    assert (await second.wait_for("response.audio.end"))["turn"] == 2
    second.say("again")
    reply = await second.wait_for("response.text.delta")
    assert reply["turn"] == 3 and (await second.wait_for("response.audio.end", count=2))["turn"] == 3


async def test_resume_mode_drop_records_the_reply_as_cut_short(harness):
    from gateway.dialog import PendingTurn

    pending = PendingTurn("Your order ships on Monday morning.", 900, "Your order ships")
    h = harness(EchoResponder(), history=[Turn("user", "where is my order")], pending=pending,
                resume_unfinished="drop")
    h.start()
    await asyncio.sleep(0.2)
    assert h.tts_streams == [] and "response.resumed" not in h.types()
    assert h.conversation.history[-1] == Turn("assistant", pending.text, heard_text="Your order ships")


async def test_a_silent_caller_is_asked_then_the_call_ends(harness):
    h = harness(EchoResponder(), history=[Turn("user", "hi")], idle_prompt_s=0.3, idle_hangup_s=0.3)
    h.start()
    prompt = await h.wait_for("response.text.delta")
    assert "still there" in prompt["delta"]
    goodbye = await h.wait_for("response.text.delta", count=2)
    assert "Goodbye" in goodbye["delta"]
    deadline = time.monotonic() + DEADLINE_S
    while not h.hung_up:
        assert time.monotonic() < deadline, "the idle call was not ended"
        await asyncio.sleep(0.01)
    assert h.hung_up == ["idle"]
    assert h.types().count("response.audio.end") == 2, "both were spoken in full first"


async def test_a_caller_who_never_pauses_is_answered_at_the_turn_limit(harness):
    h = harness(EchoResponder(), history=[Turn("user", "hi")], max_turn_s=0.3, idle_prompt_s=60)
    h.start()
    h.conversation.on_stt_event(SpeechStart(0.1))
    h.conversation.on_stt_event(Partial("and another thing"))
    deadline = time.monotonic() + DEADLINE_S
    while not h.conversation.stt.flushed:
        assert time.monotonic() < deadline, "the long turn was not cut"
        await asyncio.sleep(0.01)
    h.conversation.on_stt_event(Final("and another thing", [("and", 0.2, 0.4), ("another", 0.5, 0.9),
                                                          ("thing", 1.0, 1.3)]))  # what flush() gives
    turn_end = await h.wait_for("turn.end")
    assert turn_end["forced"] is True
    delta = await h.wait_for("response.text.delta")
    assert delta["delta"] == "You said: and another thing"


class SlowResponder(Responder):
    """An LLM-like responder: its first words take THINK_S; records what it was asked and
    which attempts were abandoned."""

    THINK_S = 0.5

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.abandoned: list[str] = []

    async def respond(self, history):
        question = history[-1].text
        self.asked.append(question)
        try:
            await asyncio.sleep(self.THINK_S)
            yield f"Answer to: {question}"
        except (asyncio.CancelledError, GeneratorExit):
            self.abandoned.append(question)
            raise


def caller_talking_to_a_slow_responder(harness) -> tuple[Harness, SlowResponder]:
    responder = SlowResponder()
    h = harness(responder, history=[Turn("user", "hi")], idle_prompt_s=60)
    h.start()
    h.conversation.on_stt_event(SpeechStart(0.1))
    return h, responder


async def test_a_stable_partial_starts_the_responder_before_the_turn_ends(harness):
    h, responder = caller_talking_to_a_slow_responder(harness)
    h.conversation.on_stt_event(Partial("what time is it"))
    await asyncio.sleep(SlowResponder.THINK_S + 0.5)  # the partial stays stable meanwhile
    assert responder.asked == ["what time is it"], "the responder started on the stable partial"
    assert "response.text.delta" not in h.types(), "its text is held back until the turn ends"
    h.conversation.on_stt_event(Final("what time is it", [("what", 0.2, 0.4), ("time", 0.5, 0.7),
                                                        ("is", 0.8, 0.9), ("it", 1.0, 1.1)]))
    h.conversation.on_stt_event(EndOfTurn(0.95))
    delta = await h.wait_for("response.text.delta")
    assert delta["delta"] == "Answer to: what time is it"
    metrics = await h.wait_for("metrics.turn")
    assert metrics["responder_first_token_ms"] < SlowResponder.THINK_S * 1000, "its latency was hidden"
    assert responder.asked == ["what time is it"], "asked once"


async def test_when_the_caller_says_more_the_early_attempt_is_dropped_unheard(harness):
    h, responder = caller_talking_to_a_slow_responder(harness)
    h.conversation.on_stt_event(Partial("what time"))
    deadline = time.monotonic() + DEADLINE_S
    while not responder.asked:
        assert time.monotonic() < deadline, "no early attempt"
        await asyncio.sleep(0.01)
    h.conversation.on_stt_event(Partial("what time do you close"))
    h.conversation.on_stt_event(Final("what time do you close", [("what", 0.2, 0.4), ("close", 1.4, 1.7)]))
    h.conversation.on_stt_event(EndOfTurn(0.95))
    await h.wait_for("response.audio.end")
    deltas = [e["delta"] for e in h.sent if e["type"] == "response.text.delta"]
    assert deltas == ["Answer to: what time do you close"], "nothing from the early attempt is shown or spoken"
    assert responder.abandoned == ["what time"]
    assert h.tts_streams[-1].spoken == "Answer to: what time do you close".split()


# -- failures: a broken recognizer or voice must neither deafen nor wedge the call ----------------

def texts(h: Harness) -> str:
    return " ".join(e["delta"] for e in h.sent if e["type"] == "response.text.delta")


async def test_a_failed_recognizer_stream_is_reopened_and_the_caller_asked_to_repeat(harness):
    h = harness(EchoResponder(), history=[Turn("user", "hi")], open_stt=ScriptedStt, idle_prompt_s=60)
    h.start()
    first = h.stt_streams[0]
    first.fail()
    error = await h.wait_for("error")
    assert error["code"] == "stt_failed"
    await h.wait_for("response.audio.end")
    assert "say it again" in texts(h), "the caller is told, in the voice that still works"
    assert len(h.stt_streams) == 2 and h.conversation.stt is h.stt_streams[1], "a new stream listens"
    h.stt_streams[1].hear("where is my order")
    await h.wait_for("response.audio.end", count=2)
    assert h.conversation.history[-2:] == [Turn("user", "where is my order"),
                                           Turn("assistant", "You said: where is my order",
                                                heard_text="You said: where is my order")]
    assert h.hung_up == []


async def test_a_recognizer_that_cannot_be_reopened_ends_the_call_with_a_goodbye(harness):
    opened: list[ScriptedStt] = []

    def open_stt() -> ScriptedStt:
        if opened:
            raise CapacityError("all 1 STT slots are in use")
        opened.append(ScriptedStt())
        return opened[0]

    h = harness(EchoResponder(), history=[Turn("user", "hi")], open_stt=open_stt, idle_prompt_s=60)
    h.start()
    opened[0].fail()
    error = await h.wait_for("error")
    assert error["code"] == "stt_failed"
    await h.wait_until(lambda: h.hung_up, "the deaf call was ended")
    assert h.hung_up == ["stt_failed"]
    assert "can't hear you" in texts(h) and "response.audio.end" in h.types(), "said before hanging up"


async def test_a_voice_failing_mid_reply_ends_the_reply_and_gives_the_caller_the_floor(harness):
    streams = iter([FailingTts(words=3)])
    h = harness(EchoResponder(), history=[Turn("user", "hi")], open_tts=lambda: next(streams, None) or ToneTts(),
                idle_prompt_s=1.0)
    h.start()
    h.say(LONG)
    error = await h.wait_for("error")
    assert error["code"] == "tts_failed" and error["turn"] == 1
    # A new stream speaks a short apology (the caller is not left with half a sentence and silence).
    end = await h.wait_for("response.audio.end")
    assert end["turn"] == 2 and "cut off" in texts(h)
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    user, assistant, apology = h.conversation.history[-3:]
    assert user == Turn("user", LONG)
    assert assistant.role == "assistant" and assistant.text.startswith("You said: one")
    heard = assistant.heard_text.split()
    assert heard == assistant.text.split()[:len(heard)] and len(heard) <= 3, "only what was played before the failure"
    assert apology == Turn("assistant", TTS_APOLOGY, heard_text=TTS_APOLOGY)
    # Listening again, the idle watchdog runs: a silent caller is asked, in a voice that works.
    await h.wait_until(lambda: "still there" in texts(h), "the idle prompt")
    await h.wait_for("response.audio.end")


class EndlessTts(ToneTts):
    """A TtsStream whose audio comes out but whose events() never end (a stream wedged in the engine)."""

    def end(self) -> None:
        if self._pending.strip():
            self._say(self._pending.strip())
        self._pending = ""


async def test_a_reply_whose_voice_never_ends_is_ended_and_the_caller_gets_the_floor(harness):
    streams = iter([EndlessTts()])
    h = harness(EchoResponder(), history=[Turn("user", "hi")], open_tts=lambda: next(streams, None) or ToneTts(),
                idle_prompt_s=60, reply_stall_s=0.5)
    h.start()
    h.say("hello there")
    await h.wait_for("response.audio.start")
    error = await h.wait_for("error")
    assert error["code"] == "reply_stalled" and error["turn"] == 1
    end = await h.wait_for("response.audio.end")  # the apology, in a new stream
    assert end["turn"] == 2 and "cut off" in texts(h)
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    stalled = h.conversation.history[-2]
    assert stalled.text == "You said: hello there" and stalled.heard_text == stalled.text, "all of it had played"


async def test_a_reply_nobody_plays_out_is_ended_without_a_loop_of_apologies(harness):
    h = harness(EchoResponder(), history=[Turn("user", "hi")], idle_prompt_s=60, reply_stall_s=0.5)
    h.start()
    h._player.cancel()  # the RTP sender stopped reading the pacer
    h.say("hello there")
    error = await h.wait_for("error")
    assert error["code"] == "reply_stalled" and error["turn"] == 1
    await h.wait_for("error", count=2)  # its apology could not play either: it ends, and no third reply starts
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    await asyncio.sleep(1.0)
    assert len([e for e in h.sent if e["type"] == "error"]) == 2 and h.conversation.reply is None
    assert "response.audio.end" not in h.types()


async def test_a_reply_task_that_raises_ends_the_reply_with_an_error(harness, caplog):
    h = harness(EchoResponder(), history=[Turn("user", "hi")], idle_prompt_s=60)
    h.start()
    h.say(LONG)
    await h.wait_for("response.audio.start")
    broken = []

    def fail_once() -> None:  # saving the reply's progress raises, once: a bug inside the reply's task
        if not broken:
            broken.append(1)
            raise RuntimeError("session store bug")

    h.conversation.on_change = fail_once
    with caplog.at_level(logging.ERROR, logger="parley.conversation"):
        error = await h.wait_for("error")
    assert error["code"] == "internal_error" and error["turn"] == 1
    assert any("conversation task failed" in r.getMessage() and r.exc_info for r in caplog.records)
    await h.wait_for("response.audio.end")  # the apology, then the caller has the floor
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    assert h.conversation.history[-2].text.startswith("You said: one")


async def test_no_free_voice_for_a_reply_ends_it_instead_of_wedging_the_call(harness):
    refused: list[int] = []

    def open_tts() -> ToneTts:
        if not refused:
            refused.append(1)
            raise CapacityError("all 1 TTS slots are in use")
        return ToneTts()

    h = harness(EchoResponder(), history=[Turn("user", "hi")], open_tts=open_tts, idle_prompt_s=60)
    h.start()
    h.say("hello there")
    error = await h.wait_for("error")
    assert error["code"] == "tts_failed" and error["turn"] == 1
    await h.wait_for("response.audio.end")  # the apology, in the voice that was free again
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    assert h.conversation.history == [Turn("user", "hi"), Turn("user", "hello there"),
                                      Turn("assistant", TTS_APOLOGY, heard_text=TTS_APOLOGY)]
    h.say("are you there")
    await h.wait_for("response.audio.end", count=2)
    assert h.conversation.history[-1].heard_text == "You said: are you there"


async def test_a_resumed_reply_with_no_free_voice_is_recorded_as_cut_short(harness):
    from gateway.dialog import PendingTurn

    def open_tts() -> ToneTts:
        raise CapacityError("all 1 TTS slots are in use")

    pending = PendingTurn("Your order ships on Monday morning.", 900, "Your order ships")
    h = harness(EchoResponder(), history=[Turn("user", "where is my order")], pending=pending, open_tts=open_tts,
                idle_prompt_s=60)
    h.start()
    error = await h.wait_for("error")
    assert error["code"] == "tts_failed"
    await h.wait_for("error", count=2)  # its apology found no voice either: no third try, no loop
    await h.wait_until(lambda: h.conversation.state == "listening", "back to listening")
    await asyncio.sleep(0.2)
    assert len([e for e in h.sent if e["type"] == "error"]) == 2
    assert h.conversation.history[-1] == Turn("assistant", pending.text, heard_text="Your order ships")
    assert h.conversation.in_progress is None


@pytest.mark.parametrize("log_content", [False, True])
async def test_logs_carry_transcript_text_only_when_privacy_log_content_allows(harness, caplog, log_content):
    caplog.set_level(logging.INFO, logger="parley.conversation")
    h = harness(EchoResponder(), history=[Turn("user", "hi")], log_content=log_content)
    h.say("my card number is four two")
    await h.wait_for("response.audio.end")
    turns = [r for r in caplog.records if r.name == "parley.conversation" and r.getMessage() == "turn"]
    assert [(r.role, r.words) for r in turns] == [("user", 6), ("assistant", 8)], "each turn is logged"
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert ("card number" in logged) is log_content
