"""Whole conversations through real parts: an aiortc caller speaks (recorded utterances),
the gateway's jitter buffer feeds the shipped STT model on the batched runtime, the end of
turn starts the responder, the reply is synthesized by the engine's streaming TTS and paced
back to the caller — who hears it. Then the same parts in the loop's hard cases: a barge-in
over the greeting (the history keeps the words heard), a responder that never answers and a
caller who then says nothing, and a caller who never pauses.

The TTS is the shipped model when there is one; otherwise a small randomly initialised model
of the same architecture, whose "speech" is near-silent noise with the reply's timing — then
the test checks that the reply's audio was paced out rather than how loud it is."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from engine import SpeechEngine
from engine.stt import load_model
from engine.tts import SHIPPED_WEIGHTS as TTS_WEIGHTS
from engine.tts import TtsConfig, TtsModel
from engine.tts import load_model as load_tts
from engine.wavfile import read_wav
from gateway.recording import read_recording
from gateway.replay import replay
from tests.kit.peer import RATE, Caller
from tests.kit.signals import resample
from tests.test_resume import DEADLINE_S
from tests.test_stt_shipped import SPEECH


def conversation_engine() -> SpeechEngine:
    torch.manual_seed(0)
    tts = load_tts() if TTS_WEIGHTS.exists() else TtsModel(TtsConfig(width=64, encoder_depth=1)).eval()
    return SpeechEngine(load_model(), tts_model=tts, max_streams=2, device="cpu", num_threads=1, admit_load=1000.0)


async def test_a_caller_speaks_and_hears_the_reply(start_gateway, http, tmp_path):
    """One turn end to end; the client's playout report (a malformed one first) adds the
    browser stage; /metrics then holds the turn's stage latencies. The call is recorded
    (record_dir), and replaying the recording offline finds the caller's turn and its end."""
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=conversation_engine(),
                                  record_dir=str(tmp_path))
    speech = read_wav(SPEECH / "flite_slt-020.wav", 16000).astype(np.float32)
    speech = speech / 32768 if np.abs(speech).max() > 1 else speech
    samples = np.concatenate([np.zeros(RATE // 2, np.float32), resample(speech, 16000, RATE),
                              np.zeros(RATE * 8, np.float32)])
    caller = Caller(gateway.url, samples)
    await caller.call(http)
    ready = await caller.wait_for_event("session.ready", DEADLINE_S)
    assert ready["mode"] == "conversation"
    final = await caller.wait_for_event("transcript.final", DEADLINE_S)
    assert final["text"]
    await caller.wait_for_event("turn.end", DEADLINE_S)
    delta = await caller.wait_for_event("response.text.delta", DEADLINE_S)
    assert delta["delta"].startswith("You said:")
    start = await caller.wait_for_event("response.audio.start", DEADLINE_S)
    metrics = await caller.wait_for_event("metrics.turn", DEADLINE_S)
    assert metrics["turn"] == start["turn"] and metrics["total_ms"] is not None
    caller.channel.send(json.dumps({"type": "playout.started", "turn": "first"}))
    error = await caller.wait_for_event("error", DEADLINE_S)
    assert error["code"] == "bad_message" and "playout.started" in error["message"]
    caller.channel.send(json.dumps({"type": "playout.started", "turn": start["turn"]}))
    playout = await caller.wait_for_event("metrics.turn", DEADLINE_S, where=lambda e: "browser_playout_ms" in e)
    assert playout["turn"] == start["turn"] and playout["browser_playout_ms"] > 0
    end = await caller.wait_for_event("response.audio.end", DEADLINE_S)
    assert end["turn"] == start["turn"]
    call = gateway.registry.by_session[caller.response["session_id"]]
    assert call.pacer.stats.audio_samples_sent > 0, "the reply's audio was paced out to the caller"
    if TTS_WEIGHTS.exists():
        assert np.sqrt(np.mean(caller.recording() ** 2)) > 1e-3, "the caller heard the reply"
    history = call.mode.history
    assert history[0].role == "user" and history[1].text.startswith("You said:")
    assert gateway.registry.keeper.live[caller.response["session_id"]].record.history is history
    async with http.get(gateway.url + "/metrics") as response:
        exposition = await response.text()
    assert 'parley_turn_stage_seconds_count{stage="total"} 1.0' in exposition
    assert 'parley_turn_stage_seconds_count{stage="browser_playout"} 1.0' in exposition
    recording = call.mode.recording
    await caller.hang_up(http)
    await wait_until(lambda: recording.closed, DEADLINE_S)
    check_recording(recording.path, reply_audible=TTS_WEIGHTS.exists())


async def wait_until(condition, timeout_s: float) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(poll(), timeout_s)


def check_recording(path, reply_audible: bool) -> None:
    inbound, reference = read_recording(path)
    assert len(inbound) == len(reference) and len(inbound) > 16000 * 3
    assert np.abs(inbound).max() > 3000, "the caller's words are on the left channel"
    if reply_audible:
        assert np.abs(reference).max() > 1000, "Parley's reply is on the right channel"
    report = replay(inbound, reference, load_model(), fresh_lead_s=2.0)
    turn = report["turns"][0]
    assert turn["end_of_turn_ms"]["call"] is not None, report


# -- scenarios over the same real parts --------------------------------------------------------

def utterance(name: str) -> np.ndarray:
    """A held-out flite utterance at 48 kHz, float32."""
    speech = read_wav(SPEECH / name, 16000).astype(np.float32)
    return resample(speech / 32768 if np.abs(speech).max() > 1 else speech, 16000, RATE)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


async def test_a_caller_barges_into_the_greeting_and_the_history_keeps_what_was_heard(start_gateway, http):
    """The scripted flow's 8 s greeting; the caller talks over it 3 s in, then speaks again
    after the reply: the greeting is cut off (its heard words only in the history), and both
    of the caller's turns get a reply."""
    gateway = await start_gateway(mode="conversation", responder="scripted", speech_engine=conversation_engine())
    caller = Caller(gateway.url, np.concatenate([silence(3.0), utterance("flite_slt-020.wav"), silence(12.0),
                                                 utterance("flite_slt-021.wav"), silence(8.0)]))
    await caller.call(http)
    greeting = await caller.wait_for_event("response.audio.start", DEADLINE_S)
    interrupted = await caller.wait_for_event("response.interrupted", DEADLINE_S)
    assert interrupted["turn"] == greeting["turn"]
    call = gateway.registry.by_session[caller.response["session_id"]]
    said = call.mode.history[0]
    assert said.role == "assistant" and said.heard_text == interrupted["heard_text"]
    heard, whole = bare_words(said.heard_text), bare_words(said.text)
    assert heard and heard == whole[:len(heard)] and len(heard) < len(whole), \
        "the words played before the caller spoke, not the whole greeting"
    assert caller.events.index(interrupted) > max(i for i, e in enumerate(caller.events)
                                                  if e["type"] == "response.paused" or i == 0), "paused first"
    await wait_until(lambda: len([t for t in call.mode.history if t.role == "user"]) >= 2, 3 * DEADLINE_S)
    await caller.wait_for_event("response.audio.start", DEADLINE_S,
                                where=lambda e: e["turn"] > greeting["turn"] + 1)
    users = [t for t in call.mode.history if t.role == "user"]
    assert all(t.text for t in users), "two transcribed turns"
    assert not [e for e in caller.events if e["type"] == "error"]
    await caller.hang_up(http)


async def test_a_hanging_responder_gets_an_apology_and_a_silent_caller_is_hung_up_on(start_gateway, http):
    """An OpenAI-compatible endpoint that never answers: after responder_timeout_s the caller
    hears an apology and gets an error event, not silence. Then the caller says nothing: they
    are asked whether they are still there, and the call ends (reason idle)."""
    from aiohttp import web

    async def never_answers(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", never_answers)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        gateway = await start_gateway(
            mode="conversation", responder="openai", speech_engine=conversation_engine(),
            openai_base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1", openai_model="m",
            responder_timeout_s=1.5, idle_prompt_s=2.0, idle_hangup_s=2.0)
        caller = Caller(gateway.url, np.concatenate([silence(0.5), utterance("flite_slt-020.wav")]))
        await caller.call(http)
        await caller.wait_for_event("turn.end", DEADLINE_S)
        error = await caller.wait_for_event("error", DEADLINE_S)
        assert error["code"].startswith("responder_")
        apology = await caller.wait_for_event("response.text.delta", DEADLINE_S, where=lambda e: "trouble" in e["delta"])
        await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == apology["turn"])
        await caller.wait_for_event("response.text.delta", DEADLINE_S, where=lambda e: "still there" in e["delta"])
        ended = await caller.wait_for_event("session.ended", DEADLINE_S)
        assert ended["reason"] == "idle"
        await caller.close()
    finally:
        await runner.cleanup()


async def test_a_caller_who_never_pauses_is_answered_at_the_turn_limit(start_gateway, http):
    """Speech without a pause for twice max_turn_s: the loop ends the turn itself at the limit,
    and the reply starts while the caller is still talking."""
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=conversation_engine(),
                                  max_turn_s=3.0)
    voiced = [trim(utterance(name)) for name in ("flite_slt-020.wav", "flite_slt-021.wav")]
    talking = np.concatenate([silence(0.5)] + voiced * 4)
    caller = Caller(gateway.url, np.concatenate([talking, silence(4.0)]))
    await caller.call(http)
    end = await caller.wait_for_event("turn.end", 3 * DEADLINE_S, where=lambda e: e.get("forced"))
    reply = await caller.wait_for_event("response.text.delta", DEADLINE_S,
                                        where=lambda e: caller.events.index(e) > caller.events.index(end))
    assert reply["delta"].startswith("You said:")
    sent_s = caller.track._pts / RATE  # how much of the caller's audio had gone out by then
    assert sent_s < len(talking) / RATE, f"answered after the caller stopped ({sent_s:.1f} s); {end}"
    await caller.hang_up(http)


async def test_a_failed_recognizer_stream_is_replaced_and_the_caller_heard_again(start_gateway, http):
    """The engine fails the call's STT stream (audio that is not finite): the caller gets an
    `error` and a spoken request to repeat, a new stream listens, and their next turn is
    answered; /metrics counts the failure."""
    gateway = await start_gateway(mode="conversation", responder="echo", speech_engine=conversation_engine())
    caller = Caller(gateway.url, silence(0.5))  # then silence, until the caller speaks below
    await caller.call(http)
    await caller.wait_for_event("session.ready", DEADLINE_S)
    call = gateway.registry.by_session[caller.response["session_id"]]
    failed = call.mode.stt
    with pytest.raises(ValueError):
        failed.push(np.full(320, np.nan, np.float32))  # the runtime fails this stream (StreamFailed)
    error = await caller.wait_for_event("error", DEADLINE_S)
    assert error["code"] == "stt_failed"
    apology = await caller.wait_for_event("response.text.delta", DEADLINE_S, where=lambda e: "again" in e["delta"])
    await caller.wait_for_event("response.audio.end", DEADLINE_S, where=lambda e: e["turn"] == apology["turn"])
    assert call.mode.stt is not failed
    now = caller.track._pts  # the caller speaks from here on (the track plays samples by position)
    caller.track.samples = np.concatenate([silence(now / RATE + 0.5), utterance("flite_slt-020.wav"), silence(8.0)])
    reply = await caller.wait_for_event("response.text.delta", 2 * DEADLINE_S,
                                        where=lambda e: e["delta"].startswith("You said:"))
    assert reply["turn"] > apology["turn"] and any(t.role == "user" and t.text for t in call.mode.history)
    async with http.get(gateway.url + "/metrics") as response:
        assert 'parley_call_errors_total{code="stt_failed"} 1.0' in await response.text()
    await caller.hang_up(http)


def bare_words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


def trim(samples: np.ndarray) -> np.ndarray:
    """The voiced part of an utterance: no leading or trailing silence."""
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    return samples[loud[0]:loud[-1] + 1]
