"""Readiness flips only after warm-up: /readyz is 503 warming_up (while /livez is 200) until it succeeds."""

import asyncio

from gateway.app import WARMUP_KEY
from gateway.echo_test import warm_up as echo_warm_up

DEADLINE_S = 60.0


async def readyz(http, url: str) -> tuple[int, dict]:
    async with http.get(url + "/readyz") as response:
        return response.status, await response.json()


async def test_ready_only_after_warm_up(start_gateway, http):
    release = asyncio.Event()
    started = asyncio.Event()

    async def controlled_warm_up() -> None:
        started.set()
        await release.wait()
        await echo_warm_up()  # the real work, once the test lets it run

    gateway = await start_gateway(warm_up=controlled_warm_up, wait_ready=False)
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    status, body = await readyz(http, gateway.url)
    assert status == 503 and body["error"]["code"] == "warming_up"
    async with http.get(gateway.url + "/livez") as response:
        assert response.status == 200

    release.set()
    await asyncio.wait_for(gateway.app[WARMUP_KEY].done.wait(), DEADLINE_S)
    status, body = await readyz(http, gateway.url)
    assert status == 200 and body["status"] == "ready"


async def test_failed_warm_up_keeps_the_node_unready(start_gateway, http):
    async def broken_warm_up() -> None:
        raise RuntimeError("no weights")

    gateway = await start_gateway(warm_up=broken_warm_up)
    status, body = await readyz(http, gateway.url)
    assert status == 503 and body["error"]["code"] == "warm_up_failed"
    assert "no weights" in body["error"]["message"]
