"""engine.EngineProcess: the engine in a child process hears what the same engine hears in
this one, refuses what it cannot hold, fails a stream on bad audio, tells a failed start-up's
reason, and when the child dies fails its streams and comes back."""

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from engine import CapacityError, EngineProcess, Final, SpeechEngine, StreamFailed
from engine.process import FLUSH_EVERY_S, _Wire
from engine.wavfile import read_wav

SPEECH = Path(__file__).parent / "data" / "speech" / "flite_slt-020.wav"  # "my name is sue"
OPTIONS = dict(stt_model="ssm", device="cpu", num_threads=1, max_streams=2)
DEADLINE_S = 120.0  # a start-up or a turn on a busy machine


def speech_pcm() -> np.ndarray:
    audio = read_wav(SPEECH)
    padded = np.concatenate([np.zeros(8000, np.float32), audio, np.zeros(8000, np.float32)])
    return (padded * 32767).astype(np.int16)


async def hear(engine, audio: np.ndarray) -> list:
    """Every event of one stream for `audio` pushed in 20 ms frames and flushed, to the Final."""
    stream = engine.open_stt("caller")
    for start in range(0, len(audio), 320):
        stream.push(audio[start:start + 320])
    stream.flush()
    events = []

    async def collect() -> None:
        async for event in stream.events():
            events.append(event)
            if isinstance(event, Final):
                return

    await asyncio.wait_for(collect(), DEADLINE_S)
    stream.close()
    return events


class Recorder(asyncio.Transport):
    """A transport that keeps each write, and when it came."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[float, bytes]] = []
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.writes.append((asyncio.get_running_loop().time(), data))
        self.wrote.set()

    def is_closing(self) -> bool:
        return False


async def test_audio_frames_leave_together_and_a_replys_text_at_once_with_them() -> None:
    wire = _Wire(lambda message: None, lambda: None)
    transport = Recorder()
    wire.connection_made(transport)
    sent_at = asyncio.get_running_loop().time()
    for k in range(3):
        wire.send(("push", 1, k), batch=True)
    await asyncio.wait_for(transport.wrote.wait(), DEADLINE_S)
    (written_at, frames), = transport.writes  # three frames, one write, a batch's wait later
    assert written_at - sent_at >= FLUSH_EVERY_S * 0.9 and frames.count(b"push") == 3
    wire.send(("push", 1, 3), batch=True)
    wire.send(("text", 2, "Hello"))  # the reply's text does not wait, nor the frame before it
    assert len(transport.writes) == 2 and transport.writes[1][1].index(b"push") < transport.writes[1][1].index(b"Hello")
    await asyncio.sleep(FLUSH_EVERY_S * 2)
    assert len(transport.writes) == 2  # no empty write when the batch's timer would have come


@pytest.fixture
async def engine_process():
    engine = EngineProcess(OPTIONS)
    await asyncio.wait_for(engine.launch(), DEADLINE_S)
    yield engine
    await engine.aclose()


async def test_the_child_hears_what_the_same_engine_hears_in_this_process(engine_process):
    audio = speech_pcm()
    local = SpeechEngine(OPTIONS["stt_model"], **{k: v for k, v in OPTIONS.items() if k != "stt_model"})
    await asyncio.to_thread(local.start)
    try:
        expected = await hear(local, audio)
    finally:
        await asyncio.to_thread(local.close)
    assert engine_process.ready and engine_process.device == "cpu" and engine_process.pid != os.getpid()
    got = await hear(engine_process, audio)
    assert [type(e).__name__ for e in got] == [type(e).__name__ for e in expected]
    assert [getattr(e, "text", None) for e in got] == [getattr(e, "text", None) for e in expected]
    assert got[-1].text.strip(), "the shipped SSM heard nothing in a clear sentence"
    stats = engine_process.stats()
    assert stats.frames > 0 and stats.max_streams == OPTIONS["max_streams"]


async def test_capacity_is_refused_at_once_and_bad_audio_fails_only_its_stream(engine_process):
    first, second = engine_process.open_stt("a"), engine_process.open_stt("b")
    assert engine_process.admission()[0] is False
    with pytest.raises(CapacityError):
        engine_process.open_stt("c")
    with pytest.raises(ValueError):
        first.push(np.full(320, np.nan, dtype=np.float32))
    with pytest.raises(StreamFailed):
        async for _ in first.events():
            pass
    second.push(np.zeros(320, np.int16))  # the other stream carries on
    second.close()
    assert [e async for e in second.events()] == []  # ended by close
    third = engine_process.open_stt("c")  # both slots free again
    third.close()
    with pytest.raises(RuntimeError, match="without text-to-speech"):
        engine_process.open_tts("a")


async def test_a_dead_child_fails_its_streams_and_a_new_one_serves(engine_process):
    stream = engine_process.open_stt("caller")
    os.kill(engine_process.pid, signal.SIGKILL)
    with pytest.raises(StreamFailed, match="engine process"):
        await asyncio.wait_for(_drain(stream), DEADLINE_S)
    assert engine_process.admission()[0] is False
    await asyncio.wait_for(_until_ready(engine_process), DEADLINE_S)  # the supervisor starts a new child
    assert engine_process.restarts == 1
    events = await hear(engine_process, speech_pcm())
    assert isinstance(events[-1], Final)


async def test_a_failed_start_up_raises_the_childs_reason(tmp_path):
    engine = EngineProcess({**OPTIONS, "weights_path": str(tmp_path / "missing.safetensors")})
    with pytest.raises(FileNotFoundError):
        await asyncio.wait_for(engine.launch(), DEADLINE_S)
    await engine.aclose()
    assert not engine.ready


async def _until_ready(engine) -> None:
    while not engine.ready:
        await asyncio.sleep(0.2)


async def _drain(stream) -> None:
    async for _ in stream.events():
        pass


async def test_a_node_whose_engine_process_dies_tells_its_caller_and_serves_again(http, tmp_path):
    """A gateway with engine_process: SIGKILL its engine mid-greeting. The caller gets an
    `error` event, the operator a restart on /metrics, and once the new engine is warm
    (/readyz 200 again) a new call is greeted."""
    import torch

    from engine import weights
    from engine.tts import TtsConfig, TtsModel
    from tests.kit.metrics import scrape
    from tests.kit.processes import kill, start_server, wait_ready
    from tests.test_resume import connect, wait_until

    torch.manual_seed(0)
    tts = TtsModel(TtsConfig(width=64, encoder_depth=1))
    with torch.no_grad():  # slow speech: the greeting is still playing when the engine dies
        tts.duration_head[-1].bias.fill_(2.0)
    tts_weights = tmp_path / "tts.safetensors"
    weights.save(tts, tts.config_dict(), tts_weights)
    proc, url = await start_server("--mode", "conversation", "--engine-process", "true", "--stt-model", "ssm",
                                   "--tts-weights", str(tts_weights), "--engine-threads", "1")
    try:
        await wait_ready(http, url)
        caller = await connect(url, http)
        await caller.wait_for_event("response.audio.start", DEADLINE_S)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as children:
            [engine_pid] = [int(pid) for pid in children.read().split()]
        os.kill(engine_pid, signal.SIGKILL)
        error = await caller.wait_for_event("error", DEADLINE_S)
        assert error["code"] in ("stt_failed", "tts_failed", "internal_error"), error

        async def restarted() -> bool:
            return (await scrape(http, url)).get("parley_engine_restarts_total", 0.0) == 1.0

        await wait_until(restarted, "a new engine process", DEADLINE_S)
        await wait_ready(http, url)
        await caller.close()
        again = await connect(url, http)
        await again.wait_for_event("response.audio.start", DEADLINE_S)
        await again.hang_up(http)
    finally:
        await kill(proc)
