"""Faults in a live conversation, through real parts (issue 34, deliver 5): what the caller
sees, what the operator sees, and that the session history stays whole.

- an engine stream failing in one call (its recognizer, or its voice), with another call on
  the same engine that must not notice;
- a responder that stalls past its deadline (a local HTTP server stands in for the remote
  webhook service);
- Redis restarting (empty) in the middle of a conversation-mode call.

(SIGKILL of a node with the caller resuming on another: tests/test_cross_node.py.)

Each fault is provoked the way it happens in service: the engine fails a stream whose input
it cannot take (audio that is not finite; more text than a stream may queue), the responder's
server stops sending, redis-server is killed. Real aiortc callers speak recorded utterances
to a real gateway on the batched engine; the TTS is the shipped model when there is one, else
a small random one of the same architecture (near-silent, with the reply's timing).
"""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
import torch
from aiohttp import web

from engine import SpeechEngine
from engine.stt import load_model
from engine.text import MAX_PENDING_CHARS
from engine.tts import SHIPPED_WEIGHTS as TTS_WEIGHTS
from engine.tts import TtsConfig, TtsModel
from engine.tts import load_model as load_tts
from gateway.conversation import STT_APOLOGY, TTS_APOLOGY
from gateway.reply import APOLOGY as RESPONDER_APOLOGY
from gateway.sessions import events_key, lease_key, session_key
from tests.kit.metrics import scrape
from tests.kit.peer import Caller
from tests.kit.talk import UTTERANCES, last_seq, next_event, say, silence, utterance
from tests.test_resume import DEADLINE_S, LEASE_TTL_S, SECRET, provoke_error_event, wait_until

TURN_S = 2 * DEADLINE_S  # a caller's utterance, its end of turn and the reply's start, on a busy machine
QUIET_S = 60.0  # idle prompts stay out of the way


def shared_engine() -> SpeechEngine:
    """One engine for every call of the test (its streams share the batched runtime)."""
    torch.manual_seed(0)
    tts = load_tts() if TTS_WEIGHTS.exists() else TtsModel(TtsConfig(width=64, encoder_depth=1)).eval()
    return SpeechEngine(load_model(), tts_model=tts, max_streams=3, device="cpu", num_threads=1, admit_load=1000.0)


async def connect(gateway, http) -> tuple[Caller, object]:
    caller = Caller(gateway.url, silence(0.5))  # silent until it says something (tests.kit.talk.say)
    await caller.call(http)
    await caller.wait_for_event("session.ready", DEADLINE_S)
    return caller, gateway.registry.by_session[caller.response["session_id"]]


def errors(caller: Caller) -> list[dict]:
    return [e for e in caller.events if e["type"] == "error"]


def failure_logs(caplog, message: str) -> list[str]:
    """The session ids of the log records with this message."""
    return [getattr(r, "session_id", None) for r in caplog.records if r.getMessage() == message]


# -- an engine stream fails in one call ------------------------------------------------------

async def test_a_recognizer_failing_in_one_call_leaves_the_other_calls_on_the_engine_alone(
        start_gateway, http, caplog):
    """Two calls on one engine. While B is in mid-sentence, the engine fails A's recognizer
    stream: A gets `error {stt_failed}` and a spoken request to repeat, and is heard again on
    a new stream; B's turn ends and is answered in full, on its own stream, with no error.
    The operator has one log line, for A, and parley_call_errors_total{code="stt_failed"} 1."""
    caplog.set_level(logging.WARNING, logger="parley.conversation")
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=shared_engine(),
                                  idle_prompt_s=QUIET_S)
    (a, call_a), (b, call_b) = await connect(gateway, http), await connect(gateway, http)
    b_stream = call_b.mode.stt
    say(b, utterance(UTTERANCES[0]))
    await b.wait_for_event("transcript.partial", TURN_S, where=lambda e: e["text"].strip())  # B is talking

    failed = call_a.mode.stt
    with pytest.raises(ValueError):
        failed.push(np.full(320, np.nan, np.float32))  # the runtime fails this stream (StreamFailed)
    error = await a.wait_for_event("error", DEADLINE_S)
    assert error["code"] == "stt_failed"
    apology = await a.wait_for_event("response.text.delta", DEADLINE_S, where=lambda e: e["delta"] == STT_APOLOGY)
    await a.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == apology["turn"])
    assert call_a.mode.stt is not failed

    reply = await b.wait_for_event("response.text.delta", TURN_S, where=lambda e: e["delta"].startswith("You said:"))
    await b.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == reply["turn"])
    assert call_b.mode.stt is b_stream and not errors(b), "B's recognizer went on untouched"
    user, answer = call_b.mode.history
    assert user.role == "user" and user.text and answer.text == "You said: " + user.text
    assert answer.heard_text == answer.text, "B heard its reply in full"
    assert call_b.pacer.stats.audio_samples_sent > 0

    say(a, utterance(UTTERANCES[1]))  # A is heard again, on the new stream
    again = await a.wait_for_event("response.text.delta", TURN_S, where=lambda e: e["delta"].startswith("You said:"))
    assert again["turn"] > apology["turn"] and len(errors(a)) == 1

    assert failure_logs(caplog, "speech recognition failed") == [a.response["session_id"]]
    metrics = await scrape(http, gateway.url)
    assert metrics["parley_call_errors_total{code=stt_failed}"] == 1.0
    await a.hang_up(http)
    await b.hang_up(http)


LONG_GREETING_FLOW = """
greeting: >-
  Thanks for calling. Before we start, here is what I can do for you today. I can check on an
  order and tell you when it ships, I can tell you our opening hours on weekdays and at the
  weekend, I can help with a question about a bill or a payment, and I can book a call back
  from one of our people at a time that suits you. So, how can I help you today?
fallback: Sorry?
intents:
  hours:
    keywords: [hours]
    reply: Nine to five.
"""


async def test_a_voice_failing_in_one_call_leaves_the_other_calls_on_the_engine_alone(
        start_gateway, http, caplog, tmp_path):
    """Two calls on one engine, both greeted (a scripted flow's long greeting). The engine
    fails A's TTS stream in mid-greeting: A gets `error {tts_failed, turn}`, the greeting ends
    there (the history keeps the words played) and a new stream speaks a short apology; B's
    greeting plays to its end. One log line, for A; parley_call_errors_total{code="tts_failed"} 1."""
    caplog.set_level(logging.WARNING, logger="parley.conversation")
    flow = tmp_path / "flow.yaml"
    flow.write_text(LONG_GREETING_FLOW)
    gateway = await start_gateway(mode="conversation", responder="scripted", flow_file=str(flow),
                                  speech_engine=shared_engine(), idle_prompt_s=QUIET_S)
    (a, call_a), (b, call_b) = await asyncio.gather(connect(gateway, http), connect(gateway, http))
    greeting = await a.wait_for_event("response.audio.start", DEADLINE_S)
    await b.wait_for_event("response.audio.start", DEADLINE_S)
    await wait_until(lambda: call_a.mode.reply is not None and call_a.mode.reply.heard(call_a.pacer)[0],
                     "A's first greeting word played")

    # More text than a stream may hold: the runtime fails this stream alone (StreamFailed).
    call_a.mode.speaker._tts.push_text("x" * (MAX_PENDING_CHARS + 1))
    error = await a.wait_for_event("error", DEADLINE_S)
    assert error["code"] == "tts_failed" and error["turn"] == greeting["turn"]
    apology = await a.wait_for_event("response.text.delta", DEADLINE_S, where=lambda e: e["delta"] == TTS_APOLOGY)
    await a.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == apology["turn"])
    assert not [e for e in a.events if e["type"] == "response.audio.end" and e["turn"] == greeting["turn"]]
    cut, said = call_a.mode.history
    heard, whole = words(cut.heard_text), words(cut.text)
    assert heard and heard == whole[:len(heard)] and len(heard) < len(whole), "the greeting's words played, no more"
    assert said.text == said.heard_text == TTS_APOLOGY
    assert call_a.mode.in_progress is None and call_a.mode.state == "listening"

    end = await b.wait_for_event("response.audio.end", 2 * DEADLINE_S)
    assert not errors(b)
    (greeted,) = call_b.mode.history
    assert greeted.text == cut.text and greeted.heard_text == greeted.text, "B heard its greeting in full"
    assert end["turn"] == 1

    assert failure_logs(caplog, "speech synthesis failed: the reply ends") == [a.response["session_id"]]
    metrics = await scrape(http, gateway.url)
    assert metrics["parley_call_errors_total{code=tts_failed}"] == 1.0
    await a.hang_up(http)
    await b.hang_up(http)


# -- a responder that stalls ---------------------------------------------------------------

class StallingWebhook:
    """A webhook service (text/plain): to the caller's first turn it says a few words and then
    nothing, past the gateway's deadline; to later turns it answers in full."""

    FIRST_WORDS = "Let me look that up."
    ANSWER = "Here is your answer."

    def __init__(self) -> None:
        self.requests: list[dict] = []
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        if sum(m["role"] == "user" for m in body["messages"]) == 1:
            await response.write(self.FIRST_WORDS.encode())
            await asyncio.Event().wait()  # stalls until the gateway gives up and disconnects
        await response.write(self.ANSWER.encode())
        await response.write_eof()
        return response


async def test_a_responder_that_stalls_mid_reply_is_apologised_for_and_the_history_stays_whole(
        start_gateway, http, redis_server, caplog):
    """The webhook says a few words, then stalls past responder_total_timeout_s: the caller
    gets `error {responder_timeout}` and hears the words and an apology, and the conversation
    goes on (the next turn is answered). The history in Redis is whole turns only: the
    stalled reply is one assistant turn (what was said, heard in full), never a half turn or
    a reply in progress; the responder is given exactly that history next time."""
    caplog.set_level(logging.WARNING, logger="parley.conversation")
    hook = StallingWebhook()
    url = await hook.start()
    try:
        gateway = await start_gateway(mode="conversation", responder="webhook", webhook_url=url,
                                      responder_timeout_s=1.0, responder_total_timeout_s=2.0,
                                      speech_engine=shared_engine(), idle_prompt_s=QUIET_S,
                                      redis_url=redis_server.url, secret=SECRET, lease_ttl_s=LEASE_TTL_S)
        caller, call = await connect(gateway, http)
        session_id = caller.response["session_id"]
        say(caller, utterance(UTTERANCES[0]))
        first = await caller.wait_for_event("response.text.delta", TURN_S,
                                            where=lambda e: e["delta"] == StallingWebhook.FIRST_WORDS)
        error = await next_event(caller, "error", first["seq"], DEADLINE_S)
        assert error["code"] == "responder_timeout"
        await next_event(caller, "response.text.delta", error["seq"], DEADLINE_S, turn=first["turn"])
        await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == first["turn"])

        before = last_seq(caller)
        say(caller, utterance(UTTERANCES[1]))
        answer = await next_event(caller, "response.text.delta", before, TURN_S)
        assert answer["delta"] == StallingWebhook.ANSWER and answer["turn"] > first["turn"]
        await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == answer["turn"])

        def stored() -> dict:
            raw = redis_server.client.get(session_key(session_id))
            return json.loads(raw) if raw else {}

        await wait_until(lambda: len(stored().get("history", [])) == 4 and stored()["in_progress"] is None,
                         "the second reply written to Redis")
        history = stored()["history"]
        stalled = f"{StallingWebhook.FIRST_WORDS} {RESPONDER_APOLOGY}"
        assert [(t["role"], t["text"], t["heard_text"]) for t in history[1:2] + history[3:]] == [
            ("assistant", stalled, stalled), ("assistant", StallingWebhook.ANSWER, StallingWebhook.ANSWER)]
        assert [t["role"] for t in history] == ["user", "assistant", "user", "assistant"]
        assert all(t["text"] for t in history) and history[0]["text"] != history[2]["text"]
        assert [(t.role, t.text) for t in call.mode.history] == [(t["role"], t["text"]) for t in history]
        asked = hook.requests[-1]["messages"]  # (its last turn may be the partial it was asked early on)
        assert asked[:2] == [{"role": t["role"], "content": t["text"]} for t in history[:2]], \
            "the responder is given whole turns, the stalled reply as it was heard"
        assert [m["role"] for m in asked] == ["user", "assistant", "user"]
        assert len(errors(caller)) == 1
        assert failure_logs(caplog, "responder failed") == [session_id]
        metrics = await scrape(http, gateway.url)
        assert metrics["parley_call_errors_total{code=responder_timeout}"] == 1.0
        await caller.hang_up(http)
    finally:
        await hook.runner.cleanup()


# -- Redis restarts under a conversation ------------------------------------------------------

async def test_a_conversation_goes_on_through_a_redis_restart_and_its_session_is_written_again(
        start_gateway, http, redis_server):
    """Redis dies (SIGKILL) while Parley is answering the caller, and comes back empty a turn
    later: the call never notices (the reply plays out, the next turn is heard and answered),
    and once Redis is back the whole session is in it again (history, event log, lease) and
    later changes are written as before."""
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=shared_engine(),
                                  idle_prompt_s=QUIET_S, redis_url=redis_server.url, secret=SECRET,
                                  lease_ttl_s=LEASE_TTL_S)
    keeper = gateway.registry.keeper
    caller, call = await connect(gateway, http)
    session_id = caller.response["session_id"]
    say(caller, utterance(UTTERANCES[0]))
    first = await caller.wait_for_event("response.audio.start", TURN_S)
    redis_server.stop()  # mid-reply
    await wait_until(lambda: not keeper.available, "the keeper noticing the outage")
    await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == first["turn"])

    before = last_seq(caller)
    say(caller, utterance(UTTERANCES[1]))  # a whole turn while Redis is away
    second = await next_event(caller, "response.text.delta", before, TURN_S)
    assert second["delta"].startswith("You said:")
    done = await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == second["turn"])
    assert call.close_reason is None and not errors(caller)

    redis_server.start()  # back, and empty
    await wait_until(lambda: keeper.available, "the keeper noticing Redis is back")

    def stored() -> dict:
        raw = redis_server.client.get(session_key(session_id))
        return json.loads(raw) if raw else {}

    await wait_until(lambda: len(stored().get("history", [])) == 4, "the session restored to Redis")
    record = stored()
    assert [(t["role"], t["text"], t["heard_text"]) for t in record["history"]] == [
        (t.role, t.text, t.heard_text) for t in call.mode.history]
    assert [t["role"] for t in record["history"]] == ["user", "assistant", "user", "assistant"]
    assert record["in_progress"] is None and record["last_event_seq"] >= done["seq"]
    assert redis_server.client.get(lease_key(session_id)) == gateway.registry.config.node_id
    logged = [json.loads(text) for text in redis_server.client.lrange(events_key(session_id), 0, -1)]
    assert done in logged, "the events of the turn during the outage are in the replay log"

    later = await provoke_error_event(caller)  # written as it happens again, not only restored
    await wait_until(lambda: stored().get("last_event_seq", 0) >= later["seq"], "a later change written")
    await caller.hang_up(http)


def words(text: str) -> list[str]:
    """The words of a text, without the punctuation a heard prefix may not carry ("calling" of "calling.")."""
    return [word.strip(".,!?;:") for word in text.split()]
