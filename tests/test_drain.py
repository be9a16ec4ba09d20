"""SIGTERM drain against a real `python -m gateway serve`: readyz 503, new calls 503 with Retry-After,
the live caller gets session.migrate after the drain timeout, and the process exits 0."""

import asyncio
import signal

import numpy as np

from tests.kit import processes
from tests.kit.peer import RATE, Caller
from tests.kit.processes import DEADLINE_S, kill, wait_ready

DRAIN_TIMEOUT_S = 2


async def start_server(drain_timeout_s: float = DRAIN_TIMEOUT_S) -> tuple[asyncio.subprocess.Process, str]:
    return await processes.start_server("--drain-timeout-s", str(drain_timeout_s))


async def test_sigterm_drains_migrates_and_exits_zero(http):
    proc, url = await start_server()
    try:
        await wait_ready(http, url)
        caller = Caller(url, np.zeros(RATE * 60, dtype=np.float32))
        await caller.call(http)
        await caller.wait_connected(DEADLINE_S)
        await caller.wait_for_event("session.ready", DEADLINE_S)

        frames_at_sigterm = len(caller.received)
        proc.send_signal(signal.SIGTERM)
        while True:  # the signal is handled asynchronously: wait for readyz to say so
            async with http.get(url + "/readyz") as response:
                if response.status == 503:
                    assert (await response.json())["error"]["code"] == "draining"
                    assert response.headers["Retry-After"]
                    break
            await asyncio.sleep(0.05)

        async with http.post(url + "/v1/calls", json={"sdp": "v=0", "type": "offer"}) as response:
            assert response.status == 503 and response.headers["Retry-After"]
            assert (await response.json())["error"]["code"] == "draining"
        async with http.post(url + "/v1/whip", data="v=0", headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 503 and response.headers["Retry-After"]

        migrate = await caller.wait_for_event("session.migrate", DEADLINE_S)
        assert migrate["reason"] == "draining" and migrate["session_id"] == caller.response["session_id"]
        assert migrate["resume_token"]
        assert len(caller.received) > frames_at_sigterm, "the live call stopped flowing during the drain"
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0
        await caller.close()
    finally:
        await kill(proc)


async def test_second_sigterm_exits_at_once(http):
    proc, url = await start_server(drain_timeout_s=DEADLINE_S * 10)  # only the second signal can end it
    try:
        await wait_ready(http, url)
        caller = Caller(url, np.zeros(RATE * 60, dtype=np.float32))
        await caller.call(http)
        await caller.wait_connected(DEADLINE_S)
        proc.send_signal(signal.SIGTERM)
        while True:
            async with http.get(url + "/readyz") as response:
                if response.status == 503:
                    break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0
        assert not any(e["type"] == "session.migrate" for e in caller.events)
        await caller.close()
    finally:
        await kill(proc)
