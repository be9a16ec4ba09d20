"""SIGTERM drain against a real `python -m gateway serve`: readyz 503, new calls 503 with Retry-After,
the live caller gets session.migrate after the drain timeout, and the process exits 0."""

import asyncio
import os
import re
import signal
import subprocess
import sys

import aiohttp
import numpy as np

from tests.peer import RATE, Caller

DRAIN_TIMEOUT_S = 2
DEADLINE_S = 60.0  # generous: the machine may be busy
ENV = {**os.environ, "PARLEY_ICE_ADDRESSES": "127.0.0.1", "PARLEY_LOG_LEVEL": "warning"}


async def start_server(drain_timeout_s: float = DRAIN_TIMEOUT_S) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", "0", "--drain-timeout-s", str(drain_timeout_s),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=ENV)
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S)).decode()
        assert line, "the server exited before listening"
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1)


async def wait_ready(http: aiohttp.ClientSession, url: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        async with http.get(url + "/readyz") as response:
            if response.status == 200:
                return
        assert asyncio.get_running_loop().time() < deadline, "never ready"
        await asyncio.sleep(0.1)


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
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


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
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
