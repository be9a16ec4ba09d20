"""Transcribe mode: a real aiortc caller, the gateway, and the real batched engine runtime.

The engine here runs a small model whose heads are set by hand (it always hears "a" and
always judges the turn over), so the wiring is checked exactly without trained weights:
audio reaches the engine, every recognizer event reaches the caller, admission control
answers 503 when the engine is full, and /metrics shows the engine loop.
"""

from __future__ import annotations

import torch
from prometheus_client.parser import text_string_to_metric_families

from engine import SpeechEngine
from engine.stt import CHAR_TO_ID, END_OF_TURN, SttConfig, SttModel
from tests.kit.peer import Caller
from tests.test_resume import DEADLINE_S, QUIET, connect, wait_until


def parrot_model() -> SttModel:
    """Hears "a" in every frame, and every frame ends the turn."""
    model = SttModel(SttConfig(width=32, depth=1))
    with torch.no_grad():
        for head, winner in ((model.ctc_head, CHAR_TO_ID["a"]), (model.eot_head, END_OF_TURN)):
            head.weight.zero_()
            head.bias.fill_(-10.0)
            head.bias[winner] = 10.0
    return model


def small_engine(max_streams: int = 4, **options) -> SpeechEngine:
    # turns=None: the parrot's head alone ends its turns (it never pauses, so the
    # turn-completion rule, which waits for a quiet moment, would never get to judge).
    return SpeechEngine(parrot_model(), max_streams=max_streams, device="cpu", num_threads=1, turns=None, **options)


async def test_transcribe_mode_sends_the_recognizers_events(start_gateway, http):
    gateway = await start_gateway(mode="transcribe", speech_engine=small_engine())
    caller = await connect(gateway.url, http)
    ready = await caller.wait_for_event("session.ready")
    assert ready["mode"] == "transcribe"
    partial = await caller.wait_for_event("transcript.partial", DEADLINE_S)
    start = await caller.wait_for_event("speech.start", DEADLINE_S)
    final = await caller.wait_for_event("transcript.final", DEADLINE_S)
    turn_end = await caller.wait_for_event("turn.end", DEADLINE_S)
    assert partial["text"] == "a" and partial["tentative"] == "" and final["text"] == "a"
    assert [w["word"] for w in final["words"]] == ["a"] and final["words"][0]["start"] <= final["words"][0]["end"]
    assert start["audio_t"] >= 0 and turn_end["confidence"] > 0.5
    assert start["seq"] < final["seq"] < turn_end["seq"]

    async with http.get(gateway.url + "/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    assert families["parley_engine_streams"].samples[0].value == 1
    ticks = {s.name: s.value for s in families["parley_engine_tick_seconds"].samples if not s.labels.get("le")}
    assert ticks["parley_engine_tick_seconds_count"] > 0
    await caller.hang_up(http)
    await wait_until(lambda: gateway.registry.engine.engine.stats().streams_open == 0, "the engine slot freed")


async def test_a_full_engine_answers_503_and_frees_the_slot_on_hang_up(start_gateway, http):
    # Only the slot count may refuse calls here: tick-time admission is not what this tests, and
    # a loaded machine can make ticks late (admit_load far above any real tick time).
    gateway = await start_gateway(mode="transcribe", speech_engine=small_engine(max_streams=1, admit_load=1000.0))
    first = await connect(gateway.url, http)
    second = Caller(gateway.url, light=True, packets=QUIET)
    await second.pc.setLocalDescription(await second.pc.createOffer())
    body = {"sdp": second.pc.localDescription.sdp, "type": "offer"}
    async with http.post(gateway.url + "/v1/calls", json=body) as response:
        assert response.status == 503 and int(response.headers["Retry-After"]) >= 1
        assert (await response.json())["error"]["code"] == "engine_busy"
    async with http.get(gateway.url + "/readyz") as response:
        assert response.status == 503 and (await response.json())["error"]["code"] == "full"
    assert gateway.registry.active == 1
    await second.close()
    await first.hang_up(http)
    await wait_until(lambda: gateway.registry.engine.admission()[0], "the engine admitting again")
    again = await connect(gateway.url, http)
    await again.hang_up(http)


async def test_unloadable_weights_keep_the_node_unready_with_a_clear_reason(start_gateway, http, tmp_path):
    broken = tmp_path / "stt.safetensors"
    broken.write_bytes(b"not a safetensors file")
    gateway = await start_gateway(mode="transcribe", stt_weights=str(broken), engine_threads=1)
    async with http.get(gateway.url + "/readyz") as response:
        assert response.status == 503
        error = (await response.json())["error"]
    assert error["code"] == "warm_up_failed"
    async with http.post(gateway.url + "/v1/calls", json={"sdp": "v=0", "type": "offer"}) as response:
        assert response.status == 503 and (await response.json())["error"]["code"] == "engine_busy"
