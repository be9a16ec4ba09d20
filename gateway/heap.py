"""Give the heap's freed memory back to the system, once a minute.

A node's calls come and go all day, and each leaves freed blocks scattered through glibc's
heaps (aiortc's packets, libav's frames, the engine's readings and renders). glibc returns a
heap's memory to the system only from its top, so a single block still in use high up holds
everything below it: an 8-caller soak's RSS grew 2-3 MB a minute for 30 minutes with no
session, task or descriptor left over. `malloc_trim(0)` releases the free pages anywhere in
every heap (madvise), whatever still lives above them. It runs on a worker thread: it holds
the heaps' locks for a few milliseconds, which other threads' allocations wait out, but the
event loop does not.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from functools import lru_cache
from typing import Callable, Optional

log = logging.getLogger("parley.heap")

TRIM_EVERY_S = 60.0


@lru_cache(maxsize=1)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Release free heap pages to the system now; False where that cannot be done here."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def trim_heap_forever(every_s: float = TRIM_EVERY_S, trim: Callable[[], bool] = trim_heap) -> None:
    """trim() every `every_s` seconds on a worker thread, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        try:
            if not await loop.run_in_executor(None, trim):
                return  # no malloc_trim in this C library: nothing to do, ever
        except Exception:  # noqa: BLE001 - a failed trim must not end the node
            log.exception("heap trim failed")
