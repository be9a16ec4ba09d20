"""How a serving node keeps its heap: a bounded set of malloc arenas, free pages handed back,
and the cyclic garbage collector's full passes made small and frequent, on the event loop.

Each ended call leaves its object graph (aiortc's peer connection, its packets, Parley's call
and conversation: ~900 objects) in reference cycles that only a full collector pass frees, and a
pass holds the GIL throughout, whichever thread runs it. At CPython's default thresholds a full
pass came every ~80 s and freed ~65k objects at once, holding the GIL for 100-160 ms (bench/soak.py,
8 redialling callers): the soak's longest loop stalls. FULL_PASS_EVERY_S below is what replaced
that; GC_THRESHOLDS keeps CPython's own full passes as a safety net only.
aiortc starts a decoder thread per call, and glibc gives busy threads arenas of their own (up
to 8 per core), which fragment: tune() bounds them and hands free pages back (engine/malloc.py).
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import time
from typing import Any

from engine import bound_and_trim

from .background import BackgroundTask

# gen0 allocations, gen0 passes per gen1, gen1 passes per full pass: CPython's defaults but the
# last, so that its own full passes (garbage of minutes, at once) wait on the scheduled ones
GC_THRESHOLDS = (700, 10, 10_000)
FULL_PASS_EVERY_S = 1.0  # a call or so of garbage a pass at a node's capacity

GC_PAUSE_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)

class CollectorPauses:
    """Every pass of the cyclic garbage collector in this process, by generation (0, 1, 2: 2 is
    a full pass). A pass holds the GIL from start to end on whichever thread ran it, so the
    event loop cannot run meanwhile: a long one is a loop stall of the GIL kind
    (gateway/loop_monitor.py). Read by /metrics as parley_gc_pause_seconds."""

    def __init__(self) -> None:
        slots = len(GC_PAUSE_BUCKETS_S) + 1  # the last slot: longer than every bound (+Inf)
        self.counts = [[0] * slots for _ in range(3)]  # per generation, per bucket (not cumulative)
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_s = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]  # objects freed
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # CPython runs one collection at a time (a second waits for none: it is skipped), and
        # only this callback writes here: one start time suffices and nothing races.
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        pause, generation = now - self._started, info["generation"]
        self.counts[generation][bisect.bisect_left(GC_PAUSE_BUCKETS_S, pause)] += 1
        self.seconds[generation] += pause
        self.longest_s[generation] = max(self.longest_s[generation], pause)
        self.collected[generation] += info["collected"]


PAUSES = CollectorPauses()


def watch_collector() -> CollectorPauses:
    """Time every collector pass from now on (once per process; a few microseconds a pass)."""
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)
    return PAUSES


class ScheduledCollection(BackgroundTask):
    """Full collector passes every FULL_PASS_EVERY_S, from the event loop: each frees the few
    calls ended since the last, in milliseconds, where one of CPython's own would free minutes'
    worth at once. Run it where tune() has moved CPython's own full passes out of the way.

    Passes begin once `warm` is set, and the heap then built is frozen first (gc.freeze: never
    scanned again): modules, the app, an in-process engine's weights all live as long as the
    process. With the engine in a process of its own (which freezes its own heap), the
    gateway's modules alone are ~85k objects: a pass over them took 36 ms on an idle core, and
    a soak unfrozen stalled the loop 80-150 ms every few seconds. While an in-process engine
    loaded, a pass a second took 52-116 ms each."""

    def __init__(self, warm: asyncio.Event | None = None) -> None:
        super().__init__()
        self.warm = warm

    async def _run(self) -> None:
        if self.warm is not None:
            await self.warm.wait()
        gc.collect()
        gc.freeze()
        while True:
            await asyncio.sleep(FULL_PASS_EVERY_S)
            gc.collect()


def tune() -> None:
    """Call early in a serving process (before the engine's threads start), and start a
    ScheduledCollection on its loop; again is a no-op for the trimmer, which runs once per
    process."""
    gc.set_threshold(*GC_THRESHOLDS)
    bound_and_trim()
