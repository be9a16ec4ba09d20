"""SIP calls end to end with a real peer (SIPp): a caller speaking G.711 RTP from a recorded
voice, a DTMF key, hold and unhold, BYE; a transfer by REFER when the caller presses 0 or
asks for an agent in words; twenty calls at once; and malformed datagrams. The gateway is
the real one (create_app) with its real engine where speech is involved (Whisper tiny.en
reads the caller). The other edges (INVITE floods beyond sip_max_calls, sources outside
sip_allowed_networks, failed transfers, SIGTERM drain, REGISTER with digest auth) are in
tests/test_sip_edges.py."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine import SpeechEngine
from engine.tts import TtsConfig, TtsModel
from engine.tts import load_model as load_tts
from tests.conftest import missing
from tests.kit.sipp import AGENT_URI, CALLER_WAV, EVENT_DEADLINE_S, SIPP, agent_flow, dtmf_capture, rtp_capture, \
    run_sipp, scenario, sip_gateway, ulaw_file

pytestmark = pytest.mark.timeout(600)  # whole-suite cost: about two minutes on a busy 2-core machine
DEADLINE_S = EVENT_DEADLINE_S


def voice():
    """The shipped TTS; where it cannot be loaded (weights being retrained), a small random
    model of the same architecture: its "speech" is quiet noise with the reply's timing."""
    try:
        return load_tts()
    except Exception:
        torch.manual_seed(0)
        return TtsModel(TtsConfig(width=64, encoder_depth=1)).eval()


@pytest.fixture
def whisper_engine():
    """One per test: a gateway's shutdown closes the engine it was given."""
    return SpeechEngine("whisper-tiny.en", tts_model=voice(), max_streams=4, device="cpu", num_threads=1)


def need_sipp() -> None:
    if SIPP is None:
        missing("sipp is not installed (apt-get install sip-tester; `make test` does)")


async def test_a_phone_call_is_heard_and_keys_hold_and_bye_work(start_gateway, whisper_engine, tmp_path):
    """SIPp calls with PCMU RTP of a recorded voice: its words reach the transcript, the
    DTMF key reaches the conversation (RFC 4733), hold and unhold are answered recvonly and
    sendrecv, and BYE ends the call, counted by outcome in /metrics."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="conversation", responder="echo",
                                               speech_engine=whisper_engine)
    path = scenario("caller", tmp_path, audio=ulaw_file(CALLER_WAV, tmp_path / "caller.ulaw"),
                    talk_ms=9000, dtmf_pcap=dtmf_capture("1"), after_ms=3000)
    status, output = await run_sipp(path, agent.port)
    assert status == 0, output
    finals = " ".join(e["text"].lower() for e in events.all("transcript.final"))
    heard = set(finals.replace(".", " ").replace(",", " ").split())
    assert len(heard & {"my", "name", "is", "sue"}) >= 3, finals  # through 8 kHz G.711 "sue" may come out "you"
    assert [e["digit"] for e in events.all("dtmf")] == ["1"]
    assert events.all("dtmf")[0]["source"] == "rfc4733"
    assert [e["on_hold"] for e in events.all("call.hold")] == [True, False]
    assert events.all("response.text.delta"), "the responder answered the caller"
    await events.wait(lambda: events.all("session.ended"))
    metrics = gateway.registry.metrics.exposition().decode()
    assert 'parley_sip_calls_total{outcome="hangup"} 1.0' in metrics
    assert "parley_jitter_buffer_delay_ms_count" in metrics


async def test_twenty_concurrent_calls_are_all_answered(start_gateway, tmp_path):
    """Twenty SIPp callers at once, each sending RTP: all answered, each call's jitter buffer
    plays their packets, and its delay is reported (call stats and /metrics)."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="echo-test", max_sessions=32, sip_max_calls=24)
    path = scenario("caller", tmp_path, audio=ulaw_file(CALLER_WAV, tmp_path / "caller.ulaw"),
                    talk_ms=4000, dtmf_pcap=dtmf_capture("5"), after_ms=1000)
    delays: list[float] = []

    async def sample_when_all_up() -> None:
        await events.wait(lambda: len(events.all("session.ready")) == 20)
        await events.wait(lambda: len(events.all("dtmf")) == 20)  # every caller has sent for a while
        delays.extend(call.playout.buffer.stats.current_delay_ms for call in gateway.registry.calls.values()
                      if call.playout.buffer.stats.packets_played)

    sampler = asyncio.create_task(sample_when_all_up())
    status, output = await run_sipp(path, agent.port, calls=20, rate=20)
    assert status == 0, output
    await sampler
    assert len(delays) == 20, f"{len(delays)} of 20 calls had played RTP when sampled"
    print(f"jitter-buffer delay over 20 SIP calls: p50 {np.percentile(delays, 50):.0f} ms, "
          f"p95 {np.percentile(delays, 95):.0f} ms")
    await events.wait(lambda: len(events.all("session.ended")) == 20)
    assert 'parley_sip_calls_total{outcome="hangup"} 20.0' in gateway.registry.metrics.exposition().decode()


async def test_pressing_zero_for_an_agent_transfers_the_call_by_refer(start_gateway, tmp_path):
    """The flow's agent intent (keys "0", or the words) hands off with a transfer target:
    Parley says its line, REFERs the caller there, follows the NOTIFYs to the target's 200,
    then hangs up (outcome transferred)."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="conversation", responder="scripted",
                                               flow_file=agent_flow(tmp_path), speech_engine=_small_engine())
    path = scenario("referee", tmp_path, caller_pcap=dtmf_capture("0"))
    status, output = await run_sipp(path, agent.port)
    assert status == 0, output
    assert [e["digit"] for e in events.all("dtmf")] == ["0"]
    assert events.all("session.handoff")[0]["target"] == AGENT_URI
    assert events.all("transfer.ended")[0]["ok"] is True
    await events.wait(lambda: 'outcome="transferred"' in gateway.registry.metrics.exposition().decode())


async def test_asking_for_an_agent_in_words_transfers_the_call_by_refer(start_gateway, whisper_engine, tmp_path):
    """The caller says "I'd like to talk to an agent, please." (Parley's voice, offline, as
    PCMU RTP replayed by SIPp, then 1.5 s of silence to end the turn): Whisper reads the words,
    the flow's agent intent matches its keyword and hands off with the transfer target, and
    Parley REFERs the caller there (SIPp checks Refer-To, answers 202 and NOTIFYs 100, 200)."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="conversation", responder="scripted",
                                               flow_file=agent_flow(tmp_path, dtmf=False),
                                               speech_engine=whisper_engine)
    speech = rtp_capture(ulaw_file(_spoken("I'd like to talk to an agent, please.", tmp_path / "ask.wav"),
                                   tmp_path / "ask.ulaw", lead_s=0.5, tail_s=1.5), tmp_path / "ask.pcap")
    path = scenario("referee", tmp_path, caller_pcap=speech)
    status, output = await run_sipp(path, agent.port)
    finals = [e["text"] for e in events.all("transcript.final")]
    assert status == 0, (finals, output)
    assert "agent" in " ".join(finals).lower(), finals
    assert not events.all("dtmf")
    assert events.all("session.handoff")[0]["target"] == AGENT_URI
    assert events.all("transfer.ended")[0]["ok"] is True  # the REFER was accepted (202) and the NOTIFYs followed
    await events.wait(lambda: 'outcome="transferred"' in gateway.registry.metrics.exposition().decode())


def _spoken(text: str, path: Path) -> Path:
    """`text` spoken in Parley's voice (engine.say); flite's where the shipped voice cannot load."""
    try:
        engine.say(text, str(path))
    except Exception:
        if shutil.which("flite") is None:
            missing("neither Parley's voice nor flite can speak the caller's words")
        subprocess.run(["flite", "-t", text, "-o", str(path)], check=True)
    return path


def _small_engine() -> SpeechEngine:
    """Keys, not words, drive the transfer test: the SSM recognizer alone is enough to hear."""
    return SpeechEngine("ssm", tts_model=voice(), max_streams=2, device="cpu", num_threads=1)


async def test_bad_datagrams_are_refused_cleanly(start_gateway, tmp_path):
    """Malformed SIP gets 400 (or silence when unanswerable) and the agent keeps serving."""
    gateway, agent, events = await sip_gateway(start_gateway, mode="echo-test", sip_max_calls=1)
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[bytes] = asyncio.Queue()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data, addr):
            replies.put_nowait(data)

    transport, _ = await loop.create_datagram_endpoint(Client, local_addr=("127.0.0.1", 0))
    try:
        bad = (b"OPTIONS sip:parley@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:1;branch=z9hG4bKx\r\n"
               b"From: <sip:a@b>;tag=1\r\nTo: <sip:p@q>\r\nCall-ID: c1\r\nCSeq: one OPTIONS\r\n\r\n")
        transport.sendto(bad, ("127.0.0.1", agent.port))
        assert (await asyncio.wait_for(replies.get(), DEADLINE_S)).startswith(b"SIP/2.0 400 bad CSeq")
        transport.sendto(b"\x00\xff garbage", ("127.0.0.1", agent.port))
        good = bad.replace(b"CSeq: one", b"CSeq: 1").replace(b"c1", b"c2")
        transport.sendto(good, ("127.0.0.1", agent.port))
        reply = await asyncio.wait_for(replies.get(), DEADLINE_S)
        assert reply.startswith(b"SIP/2.0 200 OK") and b"Allow: INVITE" in reply
    finally:
        transport.close()
    metrics = gateway.registry.metrics.exposition().decode()
    assert 'parley_sip_ignored_total{reason="malformed"} 2.0' in metrics
