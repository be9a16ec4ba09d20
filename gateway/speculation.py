"""Speculation: a responder run started on the caller's words before their turn has ended.

Once a partial transcript has been stable for a while (the conversation's `speculate_after_s`),
the responder starts on it and its deltas are held back here. If the turn then ends with the
same words, the held deltas are replayed into the reply at once (the responder's latency
hides behind the end-of-turn decision); if the caller says more, the run is cancelled unheard.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Optional


class Speculation:
    """A responder run started on a stable partial transcript; its deltas are held back."""

    def __init__(self, text: str, deltas: AsyncIterator[Any]) -> None:
        self.text = text
        self.items: list[Any] = []
        self.done = False
        self.error: Optional[BaseException] = None
        self._changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._collect(deltas))

    async def _collect(self, deltas: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(deltas):
                async for item in deltas:
                    self.items.append(item)
                    self._changed.set()
        except Exception as exc:  # replayed to the reply, which apologises
            self.error = exc
        finally:
            self.done = True
            self._changed.set()

    async def replay(self) -> AsyncIterator[Any]:
        """What was held back, then the rest as it comes."""
        sent = 0
        while True:
            while sent < len(self.items):
                sent += 1
                yield self.items[sent - 1]
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            self._changed.clear()
            await self._changed.wait()

    def cancel(self) -> None:
        self.task.cancel()


def same_words(a: str, b: str) -> bool:
    return a.lower().split() == b.lower().split()
