"""The node gives freed heap memory back to the system (gateway/heap.py)."""

import asyncio
import subprocess
import sys

import pytest

from gateway.heap import trim_heap_forever

FRAGMENTED = """
import gc, os, sys
from gateway.heap import trim_heap
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
blocks = [bytearray(4000) for _ in range(50_000)]  # ~200 MB through malloc (above pymalloc's sizes)
kept = blocks[::200]  # one block in 200 lives on, all through the heap: it cannot shrink from its top
del blocks
gc.collect()
before = rss_mib()
trimmed = trim_heap()
print(trimmed, before, rss_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap, /proc")
def test_freed_memory_under_live_blocks_goes_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    trimmed, before, after = done.stdout.split()
    if trimmed != "True":
        pytest.skip("this C library has no malloc_trim")
    assert float(before) - float(after) > 150, f"RSS {before} MiB -> {after} MiB"


async def test_the_node_trims_again_and_again_until_it_cannot():
    calls = []

    def trim() -> bool:
        calls.append(1)
        return len(calls) < 3  # the third says "no malloc_trim here": the task ends

    await asyncio.wait_for(trim_heap_forever(every_s=0.01, trim=trim), timeout=30)
    assert len(calls) == 3


async def test_a_failed_trim_does_not_end_the_trimming():
    calls = []

    def trim() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("boom")
        return False

    await asyncio.wait_for(trim_heap_forever(every_s=0.01, trim=trim), timeout=30)
    assert len(calls) == 2

