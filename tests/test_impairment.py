"""A call over an impaired network the test makes itself: the gateway in its own network
namespace, a veth pair to the caller, tc netem on both ends (tests/kit/netem.py): 5 % loss,
40 ms jitter with reordering, 200 ms loss bursts. The echo-test call's jitter buffer must
keep its delay bounded and not growing, conceal what was lost, and the caller must keep
hearing audio. Needs root and a kernel with sch_netem; skipped with the reason otherwise.
bench/impairment.py measures the same paths in conversation mode (delay over time, WER,
reply continuity)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from gateway.ice import use_host_addresses
from tests.kit.netem import ImpairedPath, unavailable
from tests.kit.peer import Caller, encode_opus
from tests.kit.processes import DEADLINE_S, kill, start_server, wait_ready
from tests.kit.signals import voiced_speech

CALL_S = 12.0
MAX_DELAY_MS = 120.0 + 100.0  # the buffer's target ceiling plus its forced catch-up margin
MAX_GROWTH_MS = 40.0  # the last third's median delay against the first's


@pytest.fixture(scope="module")
def path():
    reason = unavailable()
    if reason:
        pytest.skip(f"network impairment unavailable here: {reason}")
    made = ImpairedPath(os.getpid() % 200 + 20).open()
    yield made
    made.close()


@pytest.mark.parametrize("profile", ["loss_5pct", "jitter_40ms", "bursts_200ms"])
async def test_an_impaired_call_keeps_a_bounded_delay_and_conceals_losses(path, profile, http):
    path.apply(profile)
    use_host_addresses([path.caller_ip])
    proc, url = await start_server("--host", path.gateway_ip, env={"PARLEY_ICE_ADDRESSES": path.gateway_ip},
                                   prefix=tuple(path.command()))
    try:
        await wait_ready(http, url)
        caller = Caller(url, light=True, packets=encode_opus(voiced_speech(CALL_S, 48000)))
        await caller.call(http)
        await caller.wait_connected(DEADLINE_S)
        await caller.wait_for_event(  # call.stats come once a second
            "call.stats", 2 * DEADLINE_S, where=lambda e: sum(x["type"] == "call.stats" for x in caller.events) >= CALL_S)
        stats = [e["jitter"] for e in caller.events if e["type"] == "call.stats" and e["jitter"]["packets_played"]]
        delays = [s["current_delay_ms"] for s in stats]
        assert max(delays) <= MAX_DELAY_MS, delays
        third = max(1, len(delays) // 3)
        assert np.median(delays[-third:]) <= np.median(delays[:third]) + MAX_GROWTH_MS, delays
        if profile != "jitter_40ms":
            assert stats[-1]["concealed_samples"] > 0, "losses were concealed"
        else:
            assert stats[-1]["packets_reordered"] > 0, "netem's jitter reorders packets"
        assert caller.counter.packets > CALL_S * 50 * 0.8, "the caller kept hearing the echo"
        await caller.hang_up(http)
    finally:
        await kill(proc)
        use_host_addresses(["127.0.0.1"])
