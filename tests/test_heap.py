import asyncio
import gc
import threading
import time
import weakref

from engine import malloc
from gateway import heap


def test_tune_leaves_full_collections_to_the_schedule_and_starts_one_trimmer():
    before = gc.get_threshold()
    try:
        heap.tune()
        heap.tune()
        assert gc.get_threshold() == heap.GC_THRESHOLDS
        assert heap.GC_THRESHOLDS[2] >= 1000, "CPython's own full passes: a safety net only"
        trimmers = [t for t in threading.enumerate() if t.name == "heap-trim"]
        assert len(trimmers) == 1 and trimmers[0].daemon
    finally:
        gc.set_threshold(*before)


def test_the_glibc_it_finds_trims_without_error():
    libc = malloc._glibc()
    if libc is not None:  # glibc (Debian): malloc_trim returns 1 or 0, never raises
        assert libc.malloc_trim(0) in (0, 1)


class _Node:
    next: "_Node"


def _cycle() -> weakref.ref:
    node = _Node()
    node.next = node  # only a collector pass frees it
    return weakref.ref(node)


async def _until_freed(cycle: weakref.ref, within_s: float = 5.0) -> None:
    for _ in range(int(within_s / heap.FULL_PASS_EVERY_S)):
        if cycle() is None:
            return
        await asyncio.sleep(heap.FULL_PASS_EVERY_S)


async def test_the_scheduled_collection_frees_cycles_and_every_pass_is_timed():
    gc.collect()
    pauses = heap.watch_collector()
    assert heap.watch_collector() is pauses and gc.callbacks.count(pauses) == 1
    full_passes, collected = sum(pauses.counts[2]), pauses.collected[2]
    before = gc.get_threshold()
    gc.set_threshold(*heap.GC_THRESHOLDS)  # as served: CPython's own full passes out of the way
    gc.freeze()  # what the test process holds: out of the passes, as the engine does at start
    collection = heap.ScheduledCollection()
    try:
        cycle = _cycle()
        collection.start()
        await _until_freed(cycle)
        assert cycle() is None, "no scheduled pass freed the cycle"
    finally:
        await collection.stop()
        gc.unfreeze()
        gc.set_threshold(*before)
    assert sum(pauses.counts[2]) > full_passes and pauses.collected[2] > collected
    assert 0 < pauses.longest_s[2] <= pauses.seconds[2]


async def test_the_scheduled_collection_waits_for_the_warm_up():
    gc.disable()  # CPython's own passes would free the young cycle too (a gen-0 pass), warm or not
    gc.freeze()
    warm = asyncio.Event()
    collection = heap.ScheduledCollection(warm=warm)
    try:
        cycle = _cycle()
        collection.start()
        await asyncio.sleep(2.5 * heap.FULL_PASS_EVERY_S)  # two passes' time: none may come
        assert cycle() is not None, "a pass ran before the engine was warm"
        warm.set()
        await _until_freed(cycle)
        assert cycle() is None, "no pass once warm"
    finally:
        await collection.stop()
        gc.unfreeze()
        gc.enable()


async def test_once_warm_the_heap_so_far_is_frozen_out_of_the_passes():
    """A full pass a second over the gateway's own modules (the engine in a process of its own)
    stalled the loop: what is loaded by the warm-up's end is frozen, later garbage still freed."""
    warm = asyncio.Event()
    warm.set()
    long_lived = [[] for _ in range(5000)]  # tracked by the collector, alive for good
    frozen_before = gc.get_freeze_count()
    collection = heap.ScheduledCollection(warm=warm)
    try:
        collection.start()
        deadline = time.monotonic() + 10 * heap.FULL_PASS_EVERY_S
        while gc.get_freeze_count() < frozen_before + len(long_lived) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert gc.get_freeze_count() >= frozen_before + len(long_lived), "the warm heap was not frozen"
        cycle = _cycle()
        await _until_freed(cycle)
        assert cycle() is None, "garbage made after the freeze was never freed"
    finally:
        await collection.stop()
        gc.unfreeze()
    del long_lived


def test_collector_passes_reach_metrics():
    from gateway.metrics import Metrics

    metrics = Metrics()  # watches the collector from here on
    gc.collect(1)
    exposition = metrics.exposition().decode()
    for name in ('parley_gc_pause_seconds_count{generation="1"}', 'parley_gc_pause_seconds_bucket{generation="2",le="+Inf"}',
                 'parley_gc_pause_longest_seconds{generation="0"}', 'parley_gc_collected_objects{generation="2"}'):
        assert name in exposition
    count = next(line for line in exposition.splitlines() if line.startswith('parley_gc_pause_seconds_count{generation="1"}'))
    assert float(count.split()[-1]) >= 1
