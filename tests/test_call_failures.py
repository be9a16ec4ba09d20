"""A call whose mode fails is ended, not left up deaf: the caller gets an `error` event and
`session.ended`, the operator a log line and /metrics counters. A real gateway and a real
aiortc caller; the mode is one with a bug (its run() raises once the call is up)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np

import gateway.registry as registry_module
from gateway.events import EventChannel
from tests.kit.peer import RATE, Caller
from tests.test_metrics import DEADLINE_S, wait_for_metrics

OPEN_POLL_S = 0.02


class CrashingMode:
    """A call mode with a bug: run() raises once the caller's events channel is open."""

    def __init__(self, events: EventChannel) -> None:
        self.events = events
        self.closed = False

    def on_audio(self, pcm: np.ndarray) -> None: ...

    async def run(self) -> None:
        while not self.events.is_open:
            await asyncio.sleep(OPEN_POLL_S)
        raise RuntimeError("a bug in the mode")

    def describe(self) -> dict:
        return {"mode": "echo-test"}

    def close(self) -> None:
        self.closed = True


async def test_a_mode_that_fails_ends_the_call_and_tells_caller_and_operator(start_gateway, http, monkeypatch,
                                                                             caplog):
    modes: list[CrashingMode] = []

    def crashing_mode(config):
        def make(pacer, events, hang_up) -> CrashingMode:
            modes.append(CrashingMode(events))
            return modes[-1]
        return make

    monkeypatch.setattr(registry_module, "echo_test_mode", crashing_mode)
    caplog.set_level(logging.ERROR, logger="parley.call")
    gateway = await start_gateway()
    caller = Caller(gateway.url, np.zeros(RATE, np.float32))
    await caller.call(http)
    error = await caller.wait_for_event("error", DEADLINE_S)
    assert error["code"] == "call_failed"
    ended = await caller.wait_for_event("session.ended", DEADLINE_S)
    assert ended["reason"] == "error", "a final end: resuming would only fail again"
    samples = await wait_for_metrics(http, gateway.url, lambda s: s.get("parley_calls_total{outcome=error}") == 1)
    assert samples["parley_call_errors_total{code=call_failed}"] == 1
    assert samples["parley_active_sessions"] == 0 and modes[0].closed
    logged = [r for r in caplog.records if r.getMessage().startswith("call mode failed")]
    assert logged and logged[0].exc_info and logged[0].session_id == caller.response["session_id"]
    await caller.close()
