"""Event-loop lag: how late a timer wakes up, the first sign that one process carries too many calls.

Each probe also records how much CPU the loop's own thread used meanwhile, and (on Linux,
from /proc/thread-self/schedstat) how long it sat runnable on a run queue with no CPU. A long
stall with the thread on a CPU is code blocking the loop; one spent on a run queue is a
machine with more runnable threads than cores. On a virtual machine the host may take a
virtual CPU away (steal time, which is neither the thread's CPU time nor run-queue wait), so
each probe also reads the steal of the CPUs the thread was on (/proc/stat). What is left is
the thread asleep, waiting for the GIL that another thread holds, or for a lock."""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import time
from collections import deque
from typing import Deque, Optional

import numpy as np

from .background import BackgroundTask

PROBE_INTERVAL_S = 0.01  # sample lag 100 times a second: a stall shows in many samples
WINDOW = 6000  # one minute of samples
SUMMARY_MAX_AGE_S = 0.5  # summary() answers from a copy this recent
SCHEDSTAT = "/proc/thread-self/schedstat"  # "<ns on a CPU> <ns waiting on a run queue> <slices>"
STAT = "/proc/stat"  # a row per CPU, "cpuN user nice system idle iowait irq softirq steal ...", in clock ticks
STEAL_FIELD = 8
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


class LoopLagMonitor(BackgroundTask):
    def __init__(self) -> None:
        self._lags_ms: Deque[float] = deque(maxlen=WINDOW)
        self._busy_ms: Deque[float] = deque(maxlen=WINDOW)  # the loop thread's CPU time over each probe
        self._queued_ms: Deque[float] = deque(maxlen=WINDOW)  # its run-queue wait over each (nan: unknown)
        self._stolen_ms: Deque[float] = deque(maxlen=WINDOW)  # its CPU's steal over each (nan: unknown)
        self._ends: Deque[float] = deque(maxlen=WINDOW)  # when each probe woke (monotonic)
        self.probes = 0  # probes taken since start (lets a reader take only the new ones)
        self._summary: Optional[dict[str, float]] = None
        self._summary_at = 0.0

    async def _run(self) -> None:
        schedstat = _open_proc(SCHEDSTAT)  # opened on the loop's thread: it names that thread
        stat = _open_proc(STAT)
        stat_then, cpu_then = _read(stat), current_cpu()
        try:
            while True:
                start, cpu, queued = time.monotonic(), time.thread_time(), _queued_s(schedstat)
                await asyncio.sleep(PROBE_INTERVAL_S)
                end = time.monotonic()
                self._busy_ms.append((time.thread_time() - cpu) * 1000.0)
                self._queued_ms.append((_queued_s(schedstat) - queued) * 1000.0)
                stat_now, cpu_now = _read(stat), current_cpu()
                self._stolen_ms.append(stolen_s(stat_then, stat_now, {cpu_then, cpu_now}) * 1000.0)
                stat_then, cpu_then = stat_now, cpu_now
                self._ends.append(end)
                self._lags_ms.append(max(0.0, (end - start - PROBE_INTERVAL_S) * 1000.0))
                self.probes += 1
        finally:
            for fd in (schedstat, stat):
                if fd is not None:
                    os.close(fd)

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

    def latest_queued(self, count: int) -> list[float]:
        """The loop thread's run-queue wait in ms over each of the last `count` probes (nan where
        the kernel does not say)."""
        if count <= 0:
            return []
        return list(self._queued_ms)[-min(count, WINDOW):]

    def latest_stolen(self, count: int) -> list[float]:
        """The host's steal in ms, over each of the last `count` probes, of the virtual CPU the loop
        thread was on (nan where the kernel does not say; 10 ms steps, the kernel's tick)."""
        if count <= 0:
            return []
        return list(self._stolen_ms)[-min(count, WINDOW):]

    def summary(self) -> dict[str, float]:
        """p50, p99 and max lag over the window; worked out at most once per SUMMARY_MAX_AGE_S
        (every call's stats event asks each second: 8 calls made 8 percentiles of 6000 samples)."""
        now = time.monotonic()
        if self._summary is None or now - self._summary_at >= SUMMARY_MAX_AGE_S:
            self._summary, self._summary_at = self._summarize(), now
        return dict(self._summary)

    def _summarize(self) -> dict[str, float]:
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


def _open_proc(path: str) -> Optional[int]:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _read(fd: Optional[int]) -> bytes:
    """The file's first 8 KiB, read afresh (a pread of /proc/stat: ~2 us)."""
    if fd is None:
        return b""
    try:
        return os.pread(fd, 8192, 0)
    except OSError:
        return b""


try:
    _SCHED_GETCPU = ctypes.CDLL(None).sched_getcpu  # glibc's, through the vDSO: ~0.3 us
except (OSError, AttributeError):
    _SCHED_GETCPU = None


def current_cpu() -> int:
    """The CPU the calling thread is on now (-1 where the C library does not say)."""
    return _SCHED_GETCPU() if _SCHED_GETCPU is not None else -1


def stolen_s(then: bytes, now: bytes, cpus: set[int]) -> float:
    """The most steal any of `cpus` had between two reads of /proc/stat (the loop thread was
    on one of them, at the probe's start or its end); nan where it cannot be told."""
    stolen = [_steal_s(now, cpu) - _steal_s(then, cpu) for cpu in cpus if cpu >= 0]
    known = [s for s in stolen if not math.isnan(s)]
    return max(known) if known else math.nan


def _steal_s(stat: bytes, cpu: int) -> float:
    row = stat.find(b"\ncpu%d " % cpu)
    if row < 0:
        return math.nan
    fields = stat[row + 1:stat.find(b"\n", row + 1)].split()
    return int(fields[STEAL_FIELD]) * TICK_S if len(fields) > STEAL_FIELD else math.nan


def _queued_s(schedstat: Optional[int]) -> float:
    """Seconds the thread has waited on a run queue, all told (a pread: ~1 us)."""
    if schedstat is None:
        return math.nan
    try:
        return int(os.pread(schedstat, 128, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return math.nan
