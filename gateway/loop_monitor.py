"""Event-loop lag: how late a timer wakes up, the first sign that one process carries too many calls.

Each probe also records how much CPU the loop's own thread used meanwhile. A long stall
with the thread busy is code blocking the loop; one with the thread idle is the process
waiting for a CPU (a machine busy with other work) or for the GIL (the engine's threads)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Deque

import numpy as np

from .background import BackgroundTask

PROBE_INTERVAL_S = 0.01  # sample lag 100 times a second: a stall shows in many samples
WINDOW = 6000  # one minute of samples


class LoopLagMonitor(BackgroundTask):
    def __init__(self) -> None:
        self._lags_ms: Deque[float] = deque(maxlen=WINDOW)
        self._busy_ms: Deque[float] = deque(maxlen=WINDOW)  # the loop thread's CPU time over each probe
        self._ends: Deque[float] = deque(maxlen=WINDOW)  # when each probe woke (monotonic)
        self.probes = 0  # probes taken since start (lets a reader take only the new ones)

    async def _run(self) -> None:
        while True:
            start, cpu = time.monotonic(), time.thread_time()
            await asyncio.sleep(PROBE_INTERVAL_S)
            end = time.monotonic()
            self._busy_ms.append((time.thread_time() - cpu) * 1000.0)
            self._ends.append(end)
            self._lags_ms.append(max(0.0, (end - start - PROBE_INTERVAL_S) * 1000.0))
            self.probes += 1

    def recent(self, seconds: float) -> list[float]:
        """The lag samples of probes that woke within the last `seconds` (fewer fit when the
        loop lags; a stall that began earlier counts when its probe woke in the window)."""
        since = time.monotonic() - seconds
        lags = self.latest(max(1, round(seconds / PROBE_INTERVAL_S)))
        ends = list(self._ends)[-len(lags):]
        return [lag for lag, end in zip(lags, ends) if end >= since]

    def latest(self, count: int) -> list[float]:
        """The last `count` lag samples (at most the one-minute window)."""
        if count <= 0:
            return []
        return list(self._lags_ms)[-min(count, WINDOW):]

    def latest_busy(self, count: int) -> list[float]:
        """The loop thread's CPU ms over each of the last `count` probes (matching latest())."""
        if count <= 0:
            return []
        return list(self._busy_ms)[-min(count, WINDOW):]

    def summary(self) -> dict[str, float]:
        if not self._lags_ms:
            return {"lag_ms_p50": 0.0, "lag_ms_p99": 0.0, "lag_ms_max": 0.0}
        lags = np.fromiter(self._lags_ms, dtype=np.float64)
        return {"lag_ms_p50": round(float(np.percentile(lags, 50)), 2),
                "lag_ms_p99": round(float(np.percentile(lags, 99)), 2),
                "lag_ms_max": round(float(lags.max()), 2)}


def percentiles(values: list[float]) -> dict[str, float]:
    """{samples, p50, p99, max} of raw timings in ms (for GET /debug/timing)."""
    if not values:
        return {"samples": 0}
    array = np.asarray(values, dtype=np.float64)
    p50, p99 = np.percentile(array, [50, 99])
    return {"samples": len(values), "p50": round(float(p50), 2), "p99": round(float(p99), 2),
            "max": round(float(array.max()), 2)}
