"""GET /metrics: Prometheus text that the client parser reads, with counters that move during a real call."""

import asyncio
import time

import numpy as np

from tests.kit.peer import RATE, Caller
from tests.kit.metrics import scrape
from tests.kit.signals import chirp_sequence

DEADLINE_S = 60.0  # generous: the machine may be busy


async def wait_for_metrics(http, url: str, predicate) -> dict[str, float]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        samples = await scrape(http, url)
        if predicate(samples):
            return samples
        assert time.monotonic() < deadline, f"metrics never met the condition: {samples}"
        await asyncio.sleep(0.2)


async def test_metrics_parse_and_move_during_a_call(start_gateway, http):
    gateway = await start_gateway(echo_delay_ms=100, stats_interval_s=0.5)
    async with http.get(gateway.url + "/no/such/page") as response:
        assert response.status == 404
    before = await scrape(http, gateway.url)
    assert before["parley_http_requests_total{route=unmatched,status=404}"] == 1
    assert before["parley_active_sessions"] == 0 and before["parley_draining"] == 0
    assert before["parley_ready"] == 1
    assert "process_cpu_seconds_total" in before  # the process collector is on this registry
    assert before["parley_pacing_lateness_seconds_count"] == 0

    caller = Caller(gateway.url, chirp_sequence(RATE))
    await caller.call(http)
    await caller.wait_connected()
    during = await wait_for_metrics(http, gateway.url, lambda s: s["parley_pacing_lateness_seconds_count"] > 0
                                    and s["parley_jitter_buffer_delay_ms_count"] > 0
                                    and s["parley_event_loop_lag_seconds_count"] > 0)
    assert during["parley_active_sessions"] == 1

    assert await caller.hang_up(http) == 204
    after = await scrape(http, gateway.url)
    assert after["parley_active_sessions"] == 0
    assert after["parley_calls_total{outcome=hangup}"] == 1
    assert after["parley_http_requests_total{route=/v1/calls,status=201}"] == 1
    assert after["parley_http_requests_total{route=/v1/calls/{call_id},status=204}"] == 1
    assert after["parley_pacing_lateness_seconds_count"] >= during["parley_pacing_lateness_seconds_count"]


async def test_apps_in_one_process_keep_separate_metrics(start_gateway, http):
    first = await start_gateway()
    second = await start_gateway()
    caller = Caller(first.url, np.zeros(RATE, dtype=np.float32))
    await caller.call(http)
    await caller.wait_connected()
    assert (await scrape(http, first.url))["parley_active_sessions"] == 1
    assert (await scrape(http, second.url))["parley_active_sessions"] == 0
    assert await caller.hang_up(http) == 204


async def test_drain_timeout_migrates_and_counts_drained(start_gateway, http):
    gateway = await start_gateway()
    caller = Caller(gateway.url, np.zeros(RATE * 60, dtype=np.float32))
    await caller.call(http)
    await caller.wait_connected()
    await caller.wait_for_event("session.ready")
    await gateway.registry.drain(0)
    migrate = await caller.wait_for_event("session.migrate")
    assert migrate["reason"] == "draining"
    samples = await scrape(http, gateway.url)
    assert samples["parley_draining"] == 1 and samples["parley_ready"] == 0
    assert samples["parley_calls_total{outcome=drained}"] == 1 and samples["parley_active_sessions"] == 0
    await caller.close()
