"""Event-loop lag: how late a timer wakes up, the first sign that one process carries too many calls."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Deque, Optional

import numpy as np

PROBE_INTERVAL_S = 0.05  # sample lag 20 times a second
WINDOW = 1200  # one minute of samples


class LoopLagMonitor:
    def __init__(self) -> None:
        self._lags_ms: Deque[float] = deque(maxlen=WINDOW)
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(PROBE_INTERVAL_S)
            self._lags_ms.append(max(0.0, (time.monotonic() - start - PROBE_INTERVAL_S) * 1000.0))

    def summary(self) -> dict[str, float]:
        if not self._lags_ms:
            return {"lag_ms_p50": 0.0, "lag_ms_p99": 0.0, "lag_ms_max": 0.0}
        lags = np.fromiter(self._lags_ms, dtype=np.float64)
        return {"lag_ms_p50": round(float(np.percentile(lags, 50)), 2),
                "lag_ms_p99": round(float(np.percentile(lags, 99)), 2),
                "lag_ms_max": round(float(lags.max()), 2)}
