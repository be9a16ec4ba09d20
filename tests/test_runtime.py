"""engine.runtime: the batched loop gives exactly the single-stream events, isolates failures,
reuses clean slots, refuses streams when ticks run late, and stops cleanly.

Ticks are driven with Runtime.tick() wherever timing is not the point, so a busy machine
cannot change an outcome.
"""

import asyncio
import copy
import math
import threading
import time

import numpy as np
import pytest
import torch

from engine import weights
from engine.runtime import stt_stream
from engine.priority import ENGINE_NICE, native_threads, thread_nice
from engine.interface import Engine, EndOfTurn, Final, Partial, SpeechLikely, SpeechStart, SttStream
from engine.runtime.loop import RecentValues
from engine.runtime import (BUSY_WINDOW_S, EARLY_TICK_BUSY, CapacityError, Runtime, SpeechEngine, StreamFailed,
                            frame_end_sample)
from engine.stt import END_OF_TURN, SHIPPED, Recognizer, StreamDecoder, SttConfig, SttModel, load_model

RATE = 16000
EVENT_DEADLINE_S = 60.0  # generous: the machine may be busy


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_model(seed: int = 0) -> SttModel:
    torch.manual_seed(seed)
    model = SttModel(SttConfig(width=48, depth=2)).eval()
    with torch.no_grad():
        model.eot_head.bias[END_OF_TURN] += 3.0  # a random model then ends turns now and then
    return model


def speechy(seconds: float, seed: int) -> np.ndarray:
    """int16 bursts of harmonic sound and noise with pauses: enough to move a random model."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = rng.uniform(90, 220)
    voiced = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(1.5, 4) * t), 0, None)
    audio = 0.3 * envelope * voiced + 0.05 * rng.normal(size=len(t))
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


def chunks(audio: np.ndarray, size: int) -> list[np.ndarray]:
    return [audio[i:i + size] for i in range(0, len(audio), size)]


class RecordingModel:
    """The model, with every step's CTC logits kept (batch of one)."""

    def __init__(self, model: SttModel) -> None:
        self.model, self.logits = model, []

    def step(self, x, state):
        ctc, eot, state = self.model.step(x, state)
        self.logits.append(ctc[0].clone())
        return ctc, eot, state


def reference(model: SttModel, audio: np.ndarray, size: int = 320, turns=SHIPPED,
              precision: str = "auto") -> tuple[list, torch.Tensor]:
    """Events and logits of an independent single-stream Recognizer, flushed at the end."""
    recognizer = Recognizer(model, turns=turns, precision=precision)
    recognizer.model = RecordingModel(recognizer.model)
    events = [e for piece in chunks(audio, size) for e in recognizer.push(piece)] + recognizer.flush()
    return events, torch.stack(recognizer.model.logits)


def record_logits(runtime: Runtime) -> dict[int, list[torch.Tensor]]:
    """slot -> CTC logits rows of every batched step, in order."""
    by_slot: dict[int, list[torch.Tensor]] = {}
    forward = runtime.stt.forward

    def recording(slots, x):
        ctc, eot = forward(slots, x)
        for slot, row in zip(slots.tolist(), ctc):
            by_slot.setdefault(slot, []).append(row.clone())
        return ctc, eot

    runtime.stt.forward = recording
    return by_slot


def drain(runtime: Runtime) -> None:
    """Tick until a tick has nothing left to step."""
    for _ in range(1000):
        if not any(report.batches for report in runtime.tick()):
            return
    raise AssertionError("runtime never went idle")


def assert_same_events(got: list, expected: list) -> None:
    assert [type(e) for e in got] == [type(e) for e in expected]
    for a, b in zip(got, expected):
        if isinstance(a, EndOfTurn):
            assert math.isclose(a.confidence, b.confidence, abs_tol=1e-4)
        elif isinstance(a, SpeechStart):
            assert math.isclose(a.t, b.t, abs_tol=1e-9)
        elif isinstance(a, SpeechLikely):
            assert math.isclose(a.t, b.t, abs_tol=1e-9) and math.isclose(a.probability, b.probability, abs_tol=1e-4)
        elif isinstance(a, Final):
            assert a.text == b.text and len(a.words) == len(b.words)
            assert all(w == v and math.isclose(s, t, abs_tol=1e-9) and math.isclose(e, f, abs_tol=1e-9)
                       for (w, s, e), (v, t, f) in zip(a.words, b.words))
        else:
            assert a == b


def batched_and_independent(turns, precision: str) -> tuple[list, list]:
    """Four streams of different lengths and chunkings through one runtime, and each through
    its own Recognizer: [(batched events, logits)], [(independent events, logits)]."""
    model = small_model()
    runtime = Runtime(model, max_streams=4, device="cpu", turns=turns, precision=precision)
    logits = record_logits(runtime)
    specs = [(1.3, 160, 1), (2.2, 333, 2), (0.7, 1000, 3), (1.9, 4000, 4)]  # seconds, chunk, seed
    audios = [speechy(seconds, seed) for seconds, _, seed in specs]
    streams = [runtime.open_stt(f"s{i}") for i in range(len(specs))]
    feeds = [chunks(audio, size) for audio, (_, size, _) in zip(audios, specs)]
    for round_ in range(max(len(f) for f in feeds)):
        for stream, feed in zip(streams, feeds):
            if round_ < len(feed):
                stream.push(feed[round_])
        if round_ % 3 == 0:  # ticks that find 0, 1 or many frames per stream
            runtime.tick()
    for stream in streams:
        stream.flush()
    drain(runtime)

    assert runtime.stats().mean_batch > 1
    batched = [(stream.poll(), torch.stack(logits[stream.slot])) for stream in streams]
    return batched, [reference(model, audio, turns=turns, precision=precision) for audio in audios]


@pytest.mark.parametrize("turns", [SHIPPED, None])  # None: the small model's own head ends turns
def test_batched_equals_independent_recognizers(turns):
    all_events = []
    for (events, got), (expected_events, expected_logits) in zip(*batched_and_independent(turns, "float")):
        assert got.shape == expected_logits.shape
        assert torch.allclose(got, expected_logits, atol=1e-4)
        assert_same_events(events, expected_events)
        all_events += events
    assert {Partial, SpeechStart, Final} <= {type(e) for e in all_events}  # the test saw real decoding
    assert EndOfTurn in {type(e) for e in all_events} or turns is not None


def test_int8_batched_steps_stay_close_to_independent_ones():
    """int8 products round their output to bf16, and the kernel's summation order depends on
    the batch size, so logits agree to a bf16 step or so, not bit for bit; another stream's
    audio leaking into a row would be off by whole units."""
    for (_, got), (_, expected_logits) in zip(*batched_and_independent(SHIPPED, "int8")):
        assert got.shape == expected_logits.shape
        assert (got - expected_logits).abs().max() < 0.1


def test_large_batches_step_the_float_model(monkeypatch):
    """Where int8 stops paying (INT8_MAX_ROWS rows) the runtime steps the exact model."""
    monkeypatch.setattr(stt_stream, "INT8_MAX_ROWS", {"torch": 1, "parley": 1})
    model = small_model()
    runtime = Runtime(model, max_streams=1, device="cpu", precision="int8")
    logits = record_logits(runtime)
    stream, audio = runtime.open_stt("caller"), speechy(1.0, seed=30)
    stream.push(audio)
    stream.flush()
    drain(runtime)
    _, expected_logits = reference(model, audio, precision="float")
    assert torch.allclose(torch.stack(logits[stream.slot]), expected_logits, atol=1e-4)


def test_the_turn_end_probability_reaches_every_stream():
    runtime = Runtime(small_model(), max_streams=2, device="cpu", turn_end_probability=0.7)
    assert runtime.open_stt("a").decoder.turn_end_probability == 0.7
    assert Runtime(small_model(), max_streams=1, device="cpu").open_stt("b").decoder.turn_end_probability == \
        StreamDecoder(turns=runtime.stt.turns).turn_end_probability, "default: the engine's"
    with pytest.raises(ValueError, match="turn_end_probability"):
        Runtime(small_model(), max_streams=1, device="cpu", turn_end_probability=1.2)


def test_reused_slot_starts_clean():
    model = small_model()
    runtime = Runtime(model, max_streams=1, device="cpu")
    first = runtime.open_stt("first")
    with pytest.raises(CapacityError, match="1 STT slots"):
        runtime.open_stt("one too many")
    first.push(speechy(1.5, seed=7))
    drain(runtime)
    first.close()
    assert runtime.stt.free_slots() == 1

    second = runtime.open_stt("second")
    assert second.slot == first.slot
    logits = record_logits(runtime)
    audio = speechy(1.2, seed=8)
    for piece in chunks(audio, 640):
        second.push(piece)
    second.flush()
    drain(runtime)
    expected_events, expected_logits = reference(model, audio)
    assert torch.allclose(torch.stack(logits[second.slot]), expected_logits, atol=1e-4)
    assert_same_events(second.poll(), expected_events)


def test_slot_closed_and_reopened_mid_tick_starts_clean():
    model = small_model()
    runtime = Runtime(model, max_streams=1, device="cpu")
    old = runtime.open_stt("old")
    old.push(speechy(0.5, seed=9))
    forward, reopened = runtime.stt.forward, []

    def close_and_reopen_during_step(slots, x):
        if not reopened:  # the old row is written back after its stream has gone
            old.close()
            reopened.append(runtime.open_stt("new"))
        return forward(slots, x)

    runtime.stt.forward = close_and_reopen_during_step
    runtime.tick()
    runtime.stt.forward = forward
    new = reopened[0]
    assert new.slot == old.slot and old.closed and not new.closed
    audio = speechy(1.0, seed=10)
    new.push(audio)
    new.flush()
    drain(runtime)
    assert_same_events(new.poll(), reference(model, audio)[0])


async def test_one_streams_bad_input_leaves_the_others_alone():
    model = small_model()
    runtime = Runtime(model, max_streams=5, device="cpu", precision="float")  # batched == single, exactly
    good = [runtime.open_stt("good-a"), runtime.open_stt("good-b")]
    nan_audio, huge_audio, bad_decoder = (runtime.open_stt(name) for name in ("nan", "huge", "decoder"))
    audios = [speechy(1.5, seed=11), speechy(1.0, seed=12)]

    def broken(*_):
        raise RuntimeError("decoder bug")

    bad_decoder.decoder.on_frame = broken
    for step in range(10):
        for stream, audio in zip(good, audios):
            stream.push(audio[step * 2400:(step + 1) * 2400])
        bad_decoder.push(speechy(0.1, seed=step))
        if step == 2:
            with pytest.raises(ValueError, match="NaN"):
                nan_audio.push(np.array([0.0, np.nan], np.float32))
            huge_audio.push(np.full(2400, 1e30, np.float32))  # finite samples, non-finite features
        runtime.tick()
    for stream in good:
        stream.flush()
    drain(runtime)

    for failed in (nan_audio, huge_audio, bad_decoder):
        assert failed.closed and isinstance(failed.error, StreamFailed)
        with pytest.raises(StreamFailed):
            async for _ in failed.events():
                pass
    assert runtime.stt.free_slots() == 3 and runtime.stats().streams_failed == 3
    for stream, audio in zip(good, audios):
        assert not stream.closed
        assert_same_events(stream.poll(), reference(model, audio, precision="float")[0])


def test_admission_refuses_when_ticks_run_late():
    runtime = Runtime(small_model(), max_streams=2, device="cpu", tick_s=1e-4)  # a 0.1 ms budget
    assert runtime.admission() == (True, 0.0)
    stream = runtime.open_stt("busy")
    stream.push(speechy(2.0, seed=3))
    for _ in range(10):
        runtime.tick()
    admit, retry_after_s = runtime.admission()
    stats = runtime.stats()
    assert not admit and retry_after_s > 0
    assert stats.late_ticks > 0 and stats.ticks == 10 and stats.tick_ms_p99 >= stats.tick_ms_p50
    assert stats.last_batch == 0 and stats.frames == 2 * 25 - 1 and stats.lag_ms_p95 is not None
    assert stats.tick_histogram[-1] == (float("inf"), 10)


def test_admission_forgets_slow_ticks_once_the_last_stream_has_gone():
    # A busy spell that ended with its last call must not refuse the calls after it: while no
    # stream is open no tick comes to replace its slow ones (a node once stayed "full" so)
    runtime = Runtime(small_model(), max_streams=2, device="cpu", tick_s=1e-4)
    stream = runtime.open_stt("busy")
    stream.push(speechy(2.0, seed=3))
    for _ in range(10):
        runtime.tick()
    assert runtime.admission()[0] is False
    stream.close()
    runtime.start()
    try:
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while not runtime.admission()[0]:
            assert time.monotonic() < deadline, "the idle runtime still refuses streams"
            time.sleep(0.01)
    finally:
        runtime.close()


def test_admission_refuses_when_every_slot_is_taken():
    runtime = Runtime(small_model(), max_streams=1, device="cpu")
    stream = runtime.open_stt("only")
    assert runtime.admission()[0] is False
    stream.close()
    assert runtime.admission() == (True, 0.0)


def test_recent_values_keep_the_newest_in_order_across_the_ring_end():
    recent = RecentValues(5)
    assert len(recent) == 0 and recent.values().size == 0
    recent.extend([1, 2, 3])
    recent.extend([4, 5, 6, 7])  # wraps
    assert recent.values().tolist() == [3, 4, 5, 6, 7]
    recent.append(8)
    recent.extend(range(20))  # more than the ring holds: the newest five
    assert recent.values().tolist() == [15, 16, 17, 18, 19] and len(recent) == 5
    held = recent.values()
    recent.append(99)
    assert held.tolist() == [15, 16, 17, 18, 19]  # a snapshot is a copy


async def test_engine_thread_delivers_events_and_stops_cleanly():
    model = small_model()
    audio = speechy(2.0, seed=21)
    expected, _ = reference(copy.deepcopy(model), audio)
    engine = SpeechEngine(model, device="cpu", max_streams=4, num_threads=1)
    assert isinstance(engine, Engine) and not engine.ready
    await asyncio.to_thread(engine.start)
    assert engine.ready and engine.device == "cpu" and engine.stats().gpu_memory_bytes is None
    stream = engine.open_stt("caller")
    assert isinstance(stream, SttStream)
    for piece in chunks(audio, 320):  # faster than real time: the loop catches up per tick
        stream.push(piece)
    stream.flush()

    async def collect(count: int) -> list:
        got = []
        async for event in stream.events():
            got.append(event)
            if len(got) == count:
                return got
        return got

    events = await asyncio.wait_for(collect(len(expected)), EVENT_DEADLINE_S)
    assert_same_events(events, expected)
    thread = engine.runtime._thread
    await asyncio.to_thread(engine.close)
    assert not engine.ready and not thread.is_alive()
    assert [e async for e in stream.events()] == []  # ended by close
    assert engine.runtime.stt.free_slots() == 4
    with pytest.raises(RuntimeError, match="without text-to-speech"):
        engine.open_tts("caller", "default")


def test_the_engines_threads_give_way_to_the_event_loop():
    caller = thread_nice(threading.get_native_id())
    before = native_threads()
    engine = SpeechEngine(small_model(), device="cpu", max_streams=2, num_threads=1, with_tts=True)
    engine.start()
    try:
        started = native_threads() - before
        assert started, "the engine started no thread"
        assert all(thread_nice(tid) == min(19, caller + ENGINE_NICE) for tid in started)
        assert thread_nice(threading.get_native_id()) == caller  # (the event loop's, in the gateway)
    finally:
        engine.close()


def test_a_completed_frame_wakes_a_lightly_loaded_loop_and_waits_under_load():
    runtime = Runtime(small_model(), max_streams=2, device="cpu", tick_s=3600.0)  # periods never come
    runtime.start()
    try:
        stream = runtime.open_stt("caller")
        stream.push(speechy(1.0, seed=5)[:frame_end_sample(0) - 1])
        stream.push(speechy(1.0, seed=5)[frame_end_sample(0) - 1:frame_end_sample(2)])
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while runtime.stats().frames < 3:
            assert time.monotonic() < deadline, "the frames waited for the next period"
            time.sleep(0.01)
    finally:
        runtime.close()
    busy = Runtime(small_model(), max_streams=1, device="cpu")
    busy._update_load(time.perf_counter(), EARLY_TICK_BUSY * BUSY_WINDOW_S)   # a second's worth of ticking
    stream = busy.open_stt("caller")
    busy._wake.clear()
    stream.push(np.zeros(frame_end_sample(4), np.float32))
    assert not busy._wake.is_set(), "under load a frame waits for the period, to batch with the others"


def test_half_precision_weights_keep_fp32_states():
    model = small_model()
    runtime = Runtime(copy.deepcopy(model), max_streams=2, device="cpu", dtype=torch.bfloat16)
    assert runtime.stt.model.input.weight.dtype == torch.bfloat16
    assert runtime.stt.model.core.blocks[0].rglru.decay_param.dtype == torch.float32
    stream = runtime.open_stt("bf16")
    stream.push(speechy(1.0, seed=5))
    drain(runtime)
    assert all(pool.dtype == torch.float32 for layer in runtime.stt.pool.layers for pool in layer.values())
    stats = runtime.stats()
    assert stats.streams_failed == 0 and stats.frames == 24 and not stream.closed


def test_weights_loader(tmp_path):
    missing = tmp_path / "stt.safetensors"
    with pytest.raises(FileNotFoundError, match="stt.safetensors"):
        load_model(missing)
    with pytest.raises(FileNotFoundError):
        SpeechEngine(weights_path=missing)
    model = small_model()
    weights.save(model, model.config_dict(), missing)
    loaded = load_model(missing)
    x = torch.randn(3, 320)
    with torch.no_grad():
        assert torch.equal(loaded.step(x, loaded.initial_state(3))[0], model.step(x, model.initial_state(3))[0])
    assert Runtime.from_shipped(missing, device="cpu", max_streams=1).stt.max_streams == 1
