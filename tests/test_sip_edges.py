"""The SIP bridge's edges with real peers (SIPp from Debian's sip-tester), no mocks: a flood of
INVITEs beyond sip_max_calls, a caller outside sip_allowed_networks, a refused transfer, SIGTERM
drain with live SIP calls, and REGISTER with digest auth against a SIPp registrar."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from gateway.conversation import TRANSFER_FAILED
from tests.kit import processes
from tests.kit.sipp import agent_flow, dtmf_capture, free_udp_port, run_sipp, scenario, serve_sipp, sip_gateway
from tests.test_sip_calls import _small_engine, need_sipp

pytestmark = pytest.mark.timeout(300)
DEADLINE_S = 60.0  # generous: the machine may be busy
STRANGER_IP = "127.0.0.2"  # another source on the loopback, outside 127.0.0.1/32
DRAIN_TIMEOUT_S = 5


def metric(gateway, line: str) -> float:
    """The value of one exposition line ('name{labels}'), 0 when absent."""
    for row in gateway.registry.metrics.exposition().decode().splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    return 0.0


async def test_a_flood_beyond_sip_max_calls_is_refused_and_admitted_calls_stay_up(start_gateway, tmp_path):
    """Twelve INVITEs in about 0.1 s against sip_max_calls=3: three are answered and stay up
    (each caller's BYE 2 s later is answered 200, outcome hangup), the other nine get 486
    Busy Here (503 would also do), and every refusal is counted (outcome busy)."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="echo-test", sip_max_calls=3)
    status, output = await run_sipp(scenario("flood", tmp_path, hold_ms=2000), agent.port, calls=12, rate=100)
    assert status == 0, output
    assert " 0 dead call msg" in output, output  # each refusal's ACK stopped its retransmissions
    assert len(events.all("session.ready")) == 3
    await events.wait(lambda: len(events.all("session.ended")) == 3, DEADLINE_S)
    assert metric(gateway, 'parley_sip_calls_total{outcome="busy"}') == 9
    assert metric(gateway, 'parley_sip_calls_total{outcome="hangup"}') == 3
    assert not agent.legs


async def test_a_caller_outside_sip_allowed_networks_gets_no_answer(start_gateway, tmp_path):
    """With sip_allowed_networks 127.0.0.1/32, SIPp calling from 127.0.0.2 hears nothing for
    3 s (its INVITE and retransmissions are dropped, counted not_allowed), while the same
    INVITE from 127.0.0.1 is answered."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="echo-test",
                                               sip_allowed_networks=["127.0.0.1/32"])
    status, output = await run_sipp(scenario("stranger", tmp_path, wait_ms=3000), agent.port, local_ip=STRANGER_IP)
    assert status == 0, output
    assert metric(gateway, 'parley_sip_ignored_total{reason="not_allowed"}') >= 1
    assert not events.all("session.ready") and not agent.legs
    # the control: the same scenario from an allowed source is answered, so it fails
    status, output = await run_sipp(scenario("stranger", tmp_path, wait_ms=3000), agent.port, local_ip="127.0.0.1")
    assert status != 0 and "unexpected" in output.lower(), output


async def test_a_refused_transfer_tells_the_caller_and_keeps_the_call(start_gateway, tmp_path):
    """The caller presses 0 for an agent twice. The first REFER is refused (603), the second
    is accepted but the target is busy (NOTIFY with a 486 sipfrag). Each time the caller gets
    an error event (transfer_failed) and Parley's spoken apology, and the call stays up:
    Parley sends no BYE, and the caller's own BYE is answered (outcome hangup)."""
    need_sipp()
    gateway, agent, events = await sip_gateway(start_gateway, mode="conversation", responder="scripted",
                                               flow_file=agent_flow(tmp_path), speech_engine=_small_engine())
    path = scenario("refused_referee", tmp_path, dtmf_pcap=dtmf_capture("0"), listen_ms=3000)
    status, output = await run_sipp(path, agent.port)
    assert status == 0, output
    assert [e["ok"] for e in events.all("transfer.ended")] == [False, False]
    assert [e["code"] for e in events.all("error")] == ["transfer_failed", "transfer_failed"]
    (call_events,) = events.by_call.values()
    said = [(e["type"], e.get("delta", e.get("code", ""))) for e in call_events
            if e["type"] in ("error", "response.text.delta", "response.audio.start")]
    apology = [("error", "transfer_failed"), ("response.text.delta", TRANSFER_FAILED), ("response.audio.start", "")]
    assert said.count(apology[1]) == 2 and all(said[i:i + 3] == apology for i, item in enumerate(said)
                                               if item == apology[0]), said
    await events.wait(lambda: events.all("session.ended"), DEADLINE_S)
    assert events.all("session.ended")[0]["reason"] == "hangup"
    assert metric(gateway, 'parley_sip_calls_total{outcome="hangup"}') == 1
    assert metric(gateway, 'parley_sip_calls_total{outcome="transferred"}') == 0


async def sip_server(*flags: str):
    """A real `python -m gateway serve` with SIP on a free port (echo-test: no engine)."""
    sip_port = free_udp_port()
    proc, url = await processes.start_server("--sip-port", str(sip_port), "--sip-t1-ms", "100", *flags)
    return proc, url, sip_port


async def server_metric(http: aiohttp.ClientSession, url: str, line: str) -> float:
    async with http.get(url + "/metrics") as response:
        for row in (await response.text()).splitlines():
            if row.startswith(line + " "):
                return float(row.split()[-1])
    return 0.0


async def active_calls(http: aiohttp.ClientSession, url: str, count: int) -> bool:
    return await server_metric(http, url, "parley_active_sessions") == count


async def draining(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/readyz") as response:
        return response.status == 503


async def until(check, deadline_s: float = DEADLINE_S) -> None:
    async with asyncio.timeout(deadline_s):
        while not await check():
            await asyncio.sleep(0.05)


async def test_sigterm_drains_live_sip_calls_then_hangs_up_and_exits_zero(http, tmp_path):
    """SIGTERM with two live SIP calls and drain_timeout_s 5: new INVITEs get 503; the caller
    who hangs up during the drain is answered 200; the other is sent BYE once the drain
    timeout has passed (not before); the process exits 0."""
    need_sipp()
    proc, url, sip_port = await sip_server("--drain-timeout-s", str(DRAIN_TIMEOUT_S))
    try:
        await processes.wait_ready(http, url)
        stays = asyncio.create_task(run_sipp(scenario("awaits_bye", tmp_path, wait_ms=30000), sip_port))
        leaves = asyncio.create_task(run_sipp(scenario("flood", tmp_path, hold_ms=3000), sip_port))
        await until(lambda: active_calls(http, url, 2))
        proc.send_signal(signal.SIGTERM)
        sigterm_at = time.monotonic()
        await until(lambda: draining(http, url))
        late = tmp_path / "late"
        late.mkdir()
        status, output = await run_sipp(scenario("flood", late, hold_ms=0), sip_port)
        assert status == 0, output
        assert await server_metric(http, url, 'parley_sip_calls_total{outcome="unavailable"}') == 1
        assert not leaves.done(), "the caller hung up before the drain began: the test's timing is off"
        status, output = await leaves
        assert status == 0, output  # its BYE during the drain was answered 200
        assert not stays.done()
        status, output = await stays
        hung_up_after = time.monotonic() - sigterm_at
        assert status == 0, output  # Parley's BYE came, and was answered
        assert hung_up_after >= DRAIN_TIMEOUT_S, f"BYE {hung_up_after:.1f} s after SIGTERM"
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0
    finally:
        await processes.kill(proc)


async def test_sigterm_exits_as_soon_as_the_last_sip_call_ends(http, tmp_path):
    """With a drain timeout of 60 s, the process exits (0) once its only SIP caller hangs up,
    long before the timeout."""
    need_sipp()
    proc, url, sip_port = await sip_server("--drain-timeout-s", "60")
    try:
        await processes.wait_ready(http, url)
        leaves = asyncio.create_task(run_sipp(scenario("flood", tmp_path, hold_ms=4000), sip_port))
        await until(lambda: active_calls(http, url, 1))
        proc.send_signal(signal.SIGTERM)
        sigterm_at = time.monotonic()
        await until(lambda: draining(http, url))
        assert not leaves.done(), "the caller hung up before the drain began: the test's timing is off"
        status, output = await leaves
        assert status == 0, output
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0
        assert time.monotonic() - sigterm_at < 30, "the drain waited for its timeout, not for the last call"
    finally:
        await processes.kill(proc)


@pytest.mark.parametrize("qop, password, registers", [("auth", "s3cret", True), ("", "s3cret", True),
                                                     ("auth", "wrong", False)])
async def test_register_answers_a_digest_challenge_from_a_sipp_registrar(start_gateway, tmp_path, qop, password,
                                                                         registers):
    """A SIPp registrar challenges Parley's REGISTER (401, MD5, with qop=auth or without) and
    checks the answer (SIPp's verifyauth): with the right password Parley is registered for
    the time granted (120 s), and on stopping un-registers (Expires: 0, challenged and
    answered again); with a wrong one the registrar refuses (403) and Parley is not registered."""
    need_sipp()
    registrar_port = free_udp_port()
    path = scenario("registrar", tmp_path, username="parley-ext", password="s3cret", grant_s=120,
                    qop=f', qop="{qop}"' if qop else "")
    registrar = asyncio.create_task(serve_sipp(path, registrar_port))
    await asyncio.sleep(0.5)  # SIPp binds its port
    gateway, agent, _ = await sip_gateway(start_gateway, mode="echo-test", sip_username="parley-ext",
                                          sip_password=password, sip_registrar=f"sip:127.0.0.1:{registrar_port}")
    try:
        if registers:
            await asyncio.wait_for(agent.registration.registered.wait(), DEADLINE_S)
            assert agent.registration.granted_s == 120
            await agent.registration.stop()
            assert not agent.registration.registered.is_set()
            status, output = await asyncio.wait_for(registrar, DEADLINE_S)
            assert status == 0, output
        else:
            status, output = await asyncio.wait_for(registrar, DEADLINE_S)
            assert status != 0 and "403" in output, output
            assert not agent.registration.registered.is_set()
    finally:
        registrar.cancel()

