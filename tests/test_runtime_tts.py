"""engine.runtime's TTS stepper: every reply's chunks go through one batched call of Piper's
flow and decoder per chunk shape, with the same audio (but for chunk seams) and word marks as
the single-stream Synthesizer; failures stay in their stream, slots come back clean, cancel is
immediate.

Ticks are driven with Runtime.tick() wherever timing is not the point (and the real-time lead
limit is lifted), so a busy machine cannot change an outcome.
"""

import asyncio

import numpy as np
import pytest
import torch

from engine.interface import DEFAULT_VOICE, TTS_VOICES, Audio, TtsStream, WordMark
from engine.runtime import CapacityError, Runtime, SpeechEngine, StreamFailed
from engine.stt import SttConfig, SttModel
from engine.text import MAX_PENDING_CHARS
from engine.tts import FIRST_ENCODE_IDS, SHIPPED_WEIGHTS, TtsConfig, TtsModel, load_model as load_tts, synthesize_offline

TEXTS = ["Sure, your order 4512 ships on Monday. The total is $12.50, anything else?",
         "Hello there! How can I help you today?",
         "Yes.",
         "Your account number is A B 7 7 1 9, and the balance is zero."]
EVENT_DEADLINE_S = 60.0
SEAM_LIMIT = 0.1  # as tests/test_tts.py


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tts_model() -> TtsModel:
    torch.manual_seed(0)
    return TtsModel(TtsConfig(width=32, encoder_depth=2, lookahead=4)).eval()


def stt_model() -> SttModel:
    torch.manual_seed(0)
    return SttModel(SttConfig(width=48, depth=2)).eval()


def runtime_with(tts_model: TtsModel, max_streams: int = 4, **options) -> Runtime:
    return Runtime(stt_model(), tts_model=tts_model, max_streams=max_streams, device="cpu",
                   tts_max_lead_s=float("inf"), **options)


def drain(runtime: Runtime, streams) -> None:
    for _ in range(5000):
        if all(stream.closed for stream in streams):
            return
        runtime.tick()
    raise AssertionError("the streams never finished")


def split(events: list) -> tuple[np.ndarray, list[WordMark]]:
    audio = [e.pcm for e in events if isinstance(e, Audio)]
    return (np.concatenate(audio) if audio else np.zeros(0, np.int16)), [e for e in events if isinstance(e, WordMark)]


def assert_same_speech(events: list, model: TtsModel, text: str) -> None:
    audio, marks = split(events)
    expected_audio, expected_marks = synthesize_offline(model, text)
    assert len(audio) == len(expected_audio)
    if len(audio):  # chunks fall elsewhere than the Synthesizer's: only the seams may differ
        error = np.sqrt(np.mean((audio.astype(np.float64) - expected_audio) ** 2))
        assert error <= SEAM_LIMIT * np.sqrt(np.mean(expected_audio.astype(np.float64) ** 2))
    assert marks == expected_marks


def test_batched_replies_equal_single_stream_synthesis(tts_model):
    runtime = runtime_with(tts_model)
    streams = [runtime.open_tts(f"reply-{i}") for i in range(len(TEXTS))]
    cursors = [0] * len(TEXTS)
    sizes = [1, 7, 3, 40]  # characters per push: a token stream, words, a whole sentence
    rounds = 0
    while any(cursor < len(text) for cursor, text in zip(cursors, TEXTS)):
        for k, (stream, text) in enumerate(zip(streams, TEXTS)):
            if cursors[k] < len(text):
                stream.push_text(text[cursors[k]:cursors[k] + sizes[k]])
                cursors[k] += sizes[k]
                if cursors[k] >= len(text):
                    stream.end()
        rounds += 1
        if rounds % 2:  # ticks between pushes: audio starts while text still arrives
            runtime.tick()
    drain(runtime, streams)
    for stream, text in zip(streams, TEXTS):
        assert stream.error is None
        assert_same_speech(stream.poll(), tts_model, text)
    stats = runtime.stats()
    assert stats.mean_batch > 1 and stats.ttfa_ms_p50 is not None and stats.tts_streams_open == 0
    assert runtime.tts.free_slots() == 4


@pytest.mark.skipif(not SHIPPED_WEIGHTS.exists(), reason="no engine/weights/tts.safetensors")
def test_a_replys_first_chunk_does_not_wait_for_the_whole_text_to_be_encoded():
    """A reply pushed whole: its first tick encodes only what the first chunk needs and
    renders it; the rest is encoded in the ticks after (while that chunk renders, with a
    render thread). The speech is the single-stream synthesis all the same."""
    model = load_tts()
    runtime = runtime_with(model)
    stream = runtime.open_tts("reply")
    stream.push_text(TEXTS[0])
    stream.end()
    runtime.tick()
    first = stream.poll()
    assert any(isinstance(event, Audio) for event in first)
    assert stream.schedule.ids_seen == FIRST_ENCODE_IDS  # what the encoder has seen so far
    drain(runtime, [stream])
    assert_same_speech(first + stream.poll(), model, TEXTS[0])


def test_reused_slot_starts_clean(tts_model):
    runtime = runtime_with(tts_model, max_streams=1)
    first = runtime.open_tts("first")
    with pytest.raises(CapacityError, match="1 TTS slots"):
        runtime.open_tts("one too many")
    assert runtime.admission()[0] is False
    first.push_text(TEXTS[0])
    first.end()
    for _ in range(6):  # part of the reply: the encoder's state and the frames are mid-sound
        runtime.tick()
    assert split(first.poll())[0].size > 0
    first.cancel()
    assert runtime.tts.free_slots() == 1  # (admission also weighs tick times: hand-driven ticks render inline)

    second = runtime.open_tts("second")
    assert second.slot == first.slot
    second.push_text(TEXTS[1])
    second.end()
    drain(runtime, [second])
    assert_same_speech(second.poll(), tts_model, TEXTS[1])


async def test_one_replys_bad_text_leaves_the_others_alone(tts_model):
    runtime = runtime_with(tts_model)
    good = runtime.open_tts("good")
    flood, after_end = runtime.open_tts("flood"), runtime.open_tts("after-end")
    with pytest.raises(TypeError, match="str"):
        good.push_text(b"bytes")  # the caller's bug, refused at once; the stream is fine
    good.push_text(TEXTS[0])
    good.end()
    flood.push_text("x" * (MAX_PENDING_CHARS + 1))  # more unreleased text than the front end holds
    after_end.push_text("Hello.")
    after_end.end()
    after_end.push_text("more after end")
    drain(runtime, [good, flood, after_end])

    for failed in (flood, after_end):
        assert isinstance(failed.error, StreamFailed)
        with pytest.raises(StreamFailed):
            async for _ in failed.events():
                pass
    assert good.error is None and runtime.stats().streams_failed == 2
    assert_same_speech(good.poll(), tts_model, TEXTS[0])


@pytest.mark.parametrize("hostile", ["", "😀" * 50, "<speak>x</speak>", "\x00\x1b", "你好", "9" * 200, "...!!!"])
def test_hostile_text_ends_cleanly(tts_model, hostile):
    runtime = runtime_with(tts_model)
    stream = runtime.open_tts("hostile")
    stream.push_text(hostile)
    stream.end()
    drain(runtime, [stream])
    assert stream.error is None and runtime.tts.free_slots() == 4
    assert_same_speech(stream.poll(), tts_model, hostile)


async def test_engine_thread_speaks_and_cancel_is_immediate(tts_model):
    engine = SpeechEngine(stt_model(), tts_model=tts_model, device="cpu", max_streams=2, num_threads=1)
    await asyncio.to_thread(engine.start)
    whole = engine.open_tts("caller", "default")
    assert isinstance(whole, TtsStream)
    whole.push_text(TEXTS[1])
    whole.end()
    events = await asyncio.wait_for(_collect(whole), EVENT_DEADLINE_S)
    assert split(events)[0].size > 0
    assert_same_speech(events, tts_model, TEXTS[1])

    cut = engine.open_tts("caller", "default")
    cut.push_text(TEXTS[0] * 3)
    cut.end()
    got = []

    async def until_cancelled():
        async for event in cut.events():
            got.append(event)
            if sum(isinstance(e, Audio) for e in got) == 2:
                cut.cancel()
        return got

    await asyncio.wait_for(until_cancelled(), EVENT_DEADLINE_S)
    assert sum(isinstance(e, Audio) for e in got) == 2  # nothing after cancel()
    assert cut.closed and engine.runtime.tts.free_slots() == 2
    stats = engine.stats()
    assert stats.ttfa_ms_p50 is not None and stats.state_bytes_per_stream <= 2 * 1024 * 1024
    await asyncio.to_thread(engine.close)


def test_open_tts_honours_the_voice(tts_model):
    """The engine has one voice, joe: "joe", "default" and "" name it; any other name is refused
    with the voices to choose from, before a slot is taken."""
    engine = SpeechEngine(stt_model(), tts_model=tts_model, device="cpu", max_streams=1, num_threads=1)
    assert TTS_VOICES == ("joe",) and DEFAULT_VOICE == "joe"
    for voice in ("joe", "default", ""):
        engine.open_tts("caller", voice).cancel()
    with pytest.raises(ValueError, match=r"unknown voice 'amy': choose one of joe"):
        engine.open_tts("caller", "amy")
    assert engine.runtime.tts.free_slots() == 1 and engine.device == "cpu"
    engine.close()


async def _collect(stream) -> list:
    return [event async for event in stream.events()]
