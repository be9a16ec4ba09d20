"""A real softphone calls Parley: baresip (Debian's) dials over SIP, plays a recorded
question from a WAV (aufile) and records what it hears (sndfile). Parley's transcript must
hold the caller's words, and the recording must hold Parley's spoken reply, not silence."""

from __future__ import annotations

import asyncio
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest

from engine import SpeechEngine
from engine.tts import load_model as load_tts
from engine.wavfile import read_wav
from tests.conftest import missing
from tests.kit.sipp import CALLER_WAV, EVENT_DEADLINE_S as DEADLINE_S
from tests.test_sip_calls import sip_gateway

pytestmark = pytest.mark.timeout(300)  # whole-suite cost: about half a minute
BARESIP = shutil.which("baresip")
BARESIP_MODULES = Path("/usr/lib/baresip/modules")
SILENCE_DBFS = -45.0  # a 100 ms window louder than this is sound, not line silence
MIN_LOUD_S = 0.5  # a spoken reply has at least this much sound


def baresip_config(home: Path, question: Path) -> None:
    (home / "config").write_text(
        "poll_method poll\nsip_listen 127.0.0.1:0\n"
        f"audio_source aufile,{question}\naudio_player aufile,{home / 'player.wav'}\n"
        f"audio_alert aufile,{home / 'alert.wav'}\naudio_srate 8000\naudio_channels 1\n"
        f"module_path {BARESIP_MODULES}\nmodule stdio.so\nmodule g711.so\nmodule aufile.so\n"
        f"module sndfile.so\nmodule_app account.so\nmodule_app menu.so\nsnd_path {home}\n")
    (home / "accounts").write_text("<sip:caller@127.0.0.1>;regint=0;audio_codecs=PCMU\n")
    (home / "contacts").write_text("")


def question_wav(path: Path) -> Path:
    """The caller's question at 8 kHz (aufile plays only that rate), then quiet while Parley answers."""
    pcm = read_wav(CALLER_WAV, 8000)
    if pcm.dtype != np.int16:
        pcm = np.clip(pcm * 32767, -32768, 32767).astype(np.int16)
    pcm = np.concatenate([np.zeros(4000, np.int16), pcm, np.zeros(8000 * 60, np.int16)])
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(8000)
        out.writeframes(pcm.tobytes())
    return path


def loud_seconds(path: Path) -> float:
    with wave.open(str(path)) as recording:
        rate = recording.getframerate()
        pcm = np.frombuffer(recording.readframes(recording.getnframes()), np.int16).astype(np.float64)
    window = rate // 10
    frames = pcm[:len(pcm) // window * window].reshape(-1, window)
    dbfs = 20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) / 32768 + 1e-12)
    return float((dbfs > SILENCE_DBFS).sum() * 0.1)


async def test_baresip_asks_and_records_a_spoken_answer(start_gateway, tmp_path):
    if BARESIP is None:
        missing("baresip is not installed (apt-get install baresip; `make test` does)")
    engine = SpeechEngine("whisper-tiny.en", tts_model=load_tts(), max_streams=2, device="cpu", num_threads=1)
    gateway, agent, events = await sip_gateway(start_gateway, mode="conversation", responder="echo",
                                               speech_engine=engine)
    baresip_config(tmp_path, question_wav(tmp_path / "question.wav"))
    phone = await asyncio.create_subprocess_exec(
        BARESIP, "-f", str(tmp_path), "-e", f"/dial sip:parley@127.0.0.1:{agent.port}", "-t", str(int(DEADLINE_S)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await events.wait(lambda: any(e.get("turn", 0) >= 2 for e in events.all("response.audio.end")))
    finally:
        phone.stdin.write(b"q")  # baresip's menu: quit (hangs up with BYE)
        await phone.stdin.drain()
        await asyncio.wait_for(phone.wait(), DEADLINE_S)
    finals = " ".join(e["text"].lower() for e in events.all("transcript.final"))
    heard = set(finals.replace(".", " ").replace(",", " ").split())
    assert len(heard & {"my", "name", "is", "sue"}) >= 3, finals
    replies = [e["delta"] for e in events.all("response.text.delta")]
    assert any("You said" in r for r in replies), replies
    recorded = next(tmp_path.glob("dump-*-dec.wav"))  # what baresip heard from Parley
    assert loud_seconds(recorded) >= MIN_LOUD_S, "baresip recorded silence, not Parley's spoken reply"
    await events.wait(lambda: events.all("session.ended") or gateway.registry.active == 0)
