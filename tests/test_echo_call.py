"""A real aiortc caller in echo-test mode hears its own chirps back, delayed and intact."""

import asyncio
import time

import numpy as np

from tests.kit.peer import RATE, Caller
from tests.kit.signals import chirp_sequence, match_chirps, resample

ECHO_DELAY_MS = 300


async def test_echo_returns_the_signal(start_gateway, http):
    gateway = await start_gateway(echo_delay_ms=ECHO_DELAY_MS, stats_interval_s=0.5)
    signal = chirp_sequence(RATE)
    caller = Caller(gateway.url, signal)
    response = await caller.call(http)
    assert response["type"] == "answer" and response["call_id"] and response["session_id"]
    assert response["location"] == f"/v1/calls/{response['call_id']}"
    assert "useinbandfec=1" in response["sdp"]

    ready = await caller.wait_for_event("session.ready")
    assert ready["seq"] == 1 and ready["mode"] == "echo-test" and ready["echo_delay_ms"] == ECHO_DELAY_MS
    await caller.wait_connected()

    # Record until the whole signal plus the echo delay has come back.
    duration = len(signal) / RATE + ECHO_DELAY_MS / 1000 + 1.5
    deadline = time.monotonic() + duration * 4  # generous on a loaded machine
    while sum(len(r) for r in caller.received) < duration * RATE and time.monotonic() < deadline:
        await asyncio.sleep(0.1)

    stats = await caller.wait_for_event("call.stats")
    assert {"jitter", "pacer", "connection"} <= stats.keys()
    assert stats["jitter"]["packets_received"] > 0
    seqs = [e["seq"] for e in caller.events]
    assert seqs == list(range(1, len(seqs) + 1))

    recorded = resample(caller.recording(), RATE, 16000)
    reference = resample(signal, RATE, 16000)
    chirps = match_chirps(reference, recorded, 16000)
    print("chirps (delay s, ncc):", [(round(d, 3), round(c, 2)) for d, c in chirps])
    heard = [delay for delay, ncc in chirps if ncc > 0.6]
    assert len(heard) >= len(chirps) - 1, f"returned audio does not match the chirps: {chirps}"
    # One path delay for all chirps (up to a few 20 ms frames the jitter buffer may drop in silence).
    assert max(heard) - min(heard) <= 0.1
    delay_ms = (caller.first_audio_at + float(np.median(heard)) - caller.track.started_at) * 1000
    assert ECHO_DELAY_MS <= delay_ms <= ECHO_DELAY_MS + 600, delay_ms

    assert await caller.hang_up(http) == 204
    assert not gateway.registry.calls


def media_port(answer_sdp: str) -> int:
    for line in answer_sdp.split("\r\n"):
        if line.startswith("a=candidate:") and " 127.0.0.1 " in line:
            return int(line.split()[5])
    raise AssertionError("no loopback candidate in the answer")


async def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_garbage_rtp_and_bad_client_messages_do_not_break_the_call(start_gateway, http):
    gateway = await start_gateway(echo_delay_ms=100, stats_interval_s=0.3)
    caller = Caller(gateway.url, np.tile(np.float32(0.0), RATE))
    response = await caller.call(http)
    await caller.wait_connected()
    await caller.wait_for_event("session.ready")

    # Garbage at the media port: random bytes, fake RTP and RTCP headers, empty datagrams.
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=("127.0.0.1", media_port(response["sdp"])))
    rng = np.random.default_rng(5)
    for k in range(500):
        kind = k % 4
        if kind == 0:
            datagram = rng.bytes(int(rng.integers(1, 1400)))
        elif kind == 1:
            datagram = bytes([0x80, 111]) + rng.bytes(int(rng.integers(10, 200)))  # RTP header, no valid SRTP
        elif kind == 2:
            datagram = bytes([0x80, 200]) + rng.bytes(int(rng.integers(6, 100)))  # RTCP sender report shape
        else:
            datagram = b""
        transport.sendto(datagram)
    transport.close()

    # The data channel: text that is not JSON, JSON that is not an event, binary, then a ping.
    caller.channel.send("this is not json")
    caller.channel.send('["a list"]')
    caller.channel.send(b"\x00\x01binary")
    caller.channel.send('{"type": "ping", "id": 7}')
    pong = await caller.wait_for_event("pong")
    assert pong["ping_id"] == 7
    errors = [e for e in caller.events if e["type"] == "error"]
    assert len(errors) == 3 and all(e["code"] == "bad_message" for e in errors)

    # The call keeps flowing both ways afterwards.
    before = len(caller.received)
    stats_before = sum(e["type"] == "call.stats" for e in caller.events)
    await wait_until(lambda: len(caller.received) > before + 50)
    await wait_until(lambda: sum(e["type"] == "call.stats" for e in caller.events) > stats_before + 2)
    assert gateway.registry.calls[response["call_id"]].pc.connectionState == "connected"
    async with http.get(gateway.url + "/livez") as r:
        assert r.status == 200
    assert await caller.hang_up(http) == 204
