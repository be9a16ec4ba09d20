"""A call over an impaired network the test makes itself: 5 % loss, 40 ms jitter with
reordering, 200 ms loss bursts. The echo-test call's jitter buffer must keep its delay
bounded and not growing, conceal what was lost, and the caller must keep hearing audio.

Two paths: the kernel's (the gateway in its own network namespace, a veth pair to the
caller, tc netem on both ends: tests/kit/netem.py; needs root and a kernel with sch_netem,
skipped with the reason otherwise), and a user-space UDP relay between the caller and a
gateway on loopback that applies the same profiles per datagram (tests/kit/impair.py), which
runs anywhere. bench/impairment.py measures the same paths in conversation mode (delay over
time, WER, reply continuity)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gateway.ice import use_host_addresses
from tests.kit.impair import ImpairedRelay
from tests.kit.netem import ImpairedPath, unavailable
from tests.kit.peer import Caller, encode_opus
from tests.kit.processes import DEADLINE_S, kill, start_server, wait_ready
from tests.kit.signals import voiced_speech

CALL_S = 12.0
MAX_DELAY_MS = 120.0 + 100.0  # the buffer's target ceiling plus its forced catch-up margin
MAX_GROWTH_MS = 40.0  # the last third's median delay against the first's
BURST_WAIT_MS = 400.0  # twice the mean of bursts_200ms's bursts


@pytest.fixture(scope="module")
def path():
    reason = unavailable()
    if reason:
        pytest.skip(f"network impairment unavailable here: {reason}")
    made = ImpairedPath(os.getpid() % 200 + 20).open()
    yield made
    made.close()


PROFILES = ["loss_5pct", "jitter_40ms", "bursts_200ms"]
RELAY_SEED = 8  # its first 200 ms bursts start at the 247th and 286th datagram: after the handshake, early in the call


@pytest.mark.parametrize("profile", PROFILES)
async def test_an_impaired_call_keeps_a_bounded_delay_and_conceals_losses(path, profile, http):
    path.apply(profile)
    use_host_addresses([path.caller_ip])
    proc, url = await start_server("--host", path.gateway_ip, env={"PARLEY_ICE_ADDRESSES": path.gateway_ip},
                                   prefix=tuple(path.command()))
    try:
        await wait_ready(http, url)
        await check_impaired_call(Caller(url, light=True, packets=encode_opus(voiced_speech(CALL_S, 48000))),
                                  profile, http)
    finally:
        await kill(proc)
        use_host_addresses(["127.0.0.1"])


@pytest.mark.parametrize("profile", PROFILES)
async def test_a_call_through_an_impairing_relay_keeps_a_bounded_delay_and_conceals_losses(profile, http):
    relay = await ImpairedRelay(profile, seed=RELAY_SEED).start()
    proc, url = await start_server(env={"PARLEY_ICE_ADDRESSES": "127.0.0.1"})
    try:
        await wait_ready(http, url)
        caller = Caller(url, light=True, packets=encode_opus(voiced_speech(CALL_S, 48000)),
                        offer_filter=relay.rewrite_offer, answer_filter=relay.rewrite_answer)
        await check_impaired_call(caller, profile, http)
        assert relay.counts["to_gateway"] > CALL_S * 50 * 0.8 and relay.counts["to_caller"] > CALL_S * 50 * 0.8
        if profile != "jitter_40ms":
            assert relay.counts["dropped"] > 0
    finally:
        relay.close()
        await kill(proc)


async def check_impaired_call(caller: Caller, profile: str, http) -> None:
    """A 12 s echo-test call: bounded, non-growing jitter-buffer delay, losses concealed (or,
    with jitter, reordering seen), and the caller hearing the echo throughout."""
    await caller.call(http)
    await caller.wait_connected(DEADLINE_S)
    await caller.wait_for_event(  # call.stats come once a second
        "call.stats", 2 * DEADLINE_S, where=lambda e: sum(x["type"] == "call.stats" for x in caller.events) >= CALL_S)
    stats = [e["jitter"] for e in caller.events if e["type"] == "call.stats" and e["jitter"]["packets_played"]]
    delays = [s["current_delay_ms"] for s in stats]
    # (a sample taken inside a loss burst sees the playout point wait the burst out)
    assert max(delays) <= MAX_DELAY_MS + (BURST_WAIT_MS if profile == "bursts_200ms" else 0), delays
    third = max(1, len(delays) // 3)
    assert np.median(delays[-third:]) <= np.median(delays[:third]) + MAX_GROWTH_MS, delays
    if profile != "jitter_40ms":
        assert stats[-1]["concealed_samples"] > 0, "losses were concealed"
    else:
        assert stats[-1]["packets_reordered"] > 0, "the jitter reorders packets"
    assert caller.counter.packets > CALL_S * 50 * 0.8, "the caller kept hearing the echo"
    await caller.hang_up(http)
