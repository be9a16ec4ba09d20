"""A whole conversation turn through real parts: an aiortc caller speaks (a recorded
utterance), the gateway's jitter buffer feeds the shipped STT model on the batched
runtime, the end of turn starts the echo responder, the reply is synthesized by the
engine's streaming TTS and paced back to the caller — who hears it.

The TTS is the shipped model when there is one; otherwise a small randomly initialised model
of the same architecture, whose "speech" is near-silent noise with the reply's timing — then
the test checks that the reply's audio was paced out rather than how loud it is."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import torch

from engine import SpeechEngine
from engine.stt import load_model
from engine.tts import SHIPPED_WEIGHTS as TTS_WEIGHTS
from engine.tts import TtsConfig, TtsModel
from engine.tts import load_model as load_tts
from engine.wavfile import read_wav
from bench.replay_call import replay
from gateway.recording import read_recording
from tests.peer import RATE, Caller
from tests.signals import resample
from tests.test_resume import DEADLINE_S
from tests.test_stt_shipped import SPEECH


def conversation_engine() -> SpeechEngine:
    torch.manual_seed(0)
    tts = load_tts() if TTS_WEIGHTS.exists() else TtsModel(TtsConfig(width=64, encoder_depth=1, decoder_depth=1)).eval()
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
