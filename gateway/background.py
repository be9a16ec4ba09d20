"""A component that owns one long-running asyncio task (the playout clock, the lag probe)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Optional


class BackgroundTask(ABC):
    """Subclasses implement `_run()`; `start()` runs it once, `stop()` cancels and waits."""

    _task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    @abstractmethod
    async def _run(self) -> None:
        """The task's body; runs until cancelled."""
