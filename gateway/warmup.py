"""Warm-up readiness: /readyz stays 503 `warming_up` until the mode's warm-up has succeeded.

A warm-up is any `async def warm_up() -> None` that raises on failure. Echo-test's
(gateway/echo_test.py) round-trips Opus frames through libopus; an engine mode plugs in its
own (load weights, run a recognize + synthesize on its device) the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Optional

log = logging.getLogger("parley.warmup")

WarmUpFn = Callable[[], Awaitable[None]]


class WarmUp:
    """Runs one warm-up in the background and remembers how it went."""

    def __init__(self, warm_up: WarmUpFn) -> None:
        self._warm_up = warm_up
        self.done = asyncio.Event()  # set when the warm-up finished, successfully or not
        self.error: Optional[str] = None
        self.duration_s: Optional[float] = None
        self._task: Optional[asyncio.Task] = None

    @property
    def ready(self) -> bool:
        return self.done.is_set() and self.error is None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        started = time.monotonic()
        try:
            await self._warm_up()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("warm-up failed; /readyz stays 503")
        else:
            self.duration_s = round(time.monotonic() - started, 3)
            log.info("warm-up done", extra={"duration_s": self.duration_s})
        self.done.set()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
