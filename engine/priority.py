"""The engine's threads give way to the event loop's.

The gateway paces every call's audio on its event loop thread, which needs a little CPU every
20 ms and needs it on time. The engine's threads (its ticks, Whisper's readings, the voice's
renders, and the threads their libraries start) need far more, but each keeps slack of its
own: replies are rendered ahead of playout, readings queue. On a node with fewer cores than
busy threads the kernel shares a core evenly among them, so the loop waited behind them for
up to hundreds of ms. At a lower priority (a higher nice value) they still get every cycle
the loop leaves, and the loop runs as soon as it is ready.

Linux sets a nice value per thread, and a thread starts with its creator's: so threads the
engine's threads start later (torch's, onnxruntime's) inherit it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

log = logging.getLogger(__name__)

ENGINE_NICE = 5  # added to the process's nice value: a nice-0 thread gets ~3 x the CPU of a nice-5 one
_TASKS = "/proc/self/task"


def native_threads() -> set[int]:
    """This process's threads (kernel ids); empty where /proc is not Linux's."""
    try:
        return {int(tid) for tid in os.listdir(_TASKS)}
    except OSError:
        return set()


def thread_nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)  # (on Linux, a thread id names that thread alone)


@contextlib.contextmanager
def lower_priority_of_new_threads(nice: int = ENGINE_NICE) -> Iterator[None]:
    """Threads started inside the block (the caller's own excepted) run `nice` lower."""
    before = native_threads()
    try:
        yield
    finally:
        for tid in native_threads() - before:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, thread_nice(tid) + nice))
            except OSError as exc:  # (it ended meanwhile, or the system forbids it)
                log.debug("thread %d keeps its priority: %s", tid, exc)
