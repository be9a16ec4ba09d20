"""glibc's malloc in a long-running process with busy threads: a bounded set of arenas, and
free pages handed back.

glibc gives each thread that allocates while another holds an arena an arena of its own (up to
8 per core), and each keeps the pages it once used. A gateway starts a thread or two a call
(aiortc's decoder), the engine has its tick, Whisper's readers and Piper's renderers: arenas
fragment and RSS creeps. bound_and_trim() caps them at MALLOC_ARENAS and hands free pages back
every TRIM_EVERY_S, from a thread of its own. The gateway calls it as `serve` starts
(gateway/heap.py), the engine's own process as it starts (engine/process.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from typing import Optional

log = logging.getLogger(__name__)

MALLOC_ARENAS = 2
TRIM_EVERY_S = 30.0
M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)

_trimmer: Optional[threading.Thread] = None


def bound_and_trim() -> None:
    """Cap the arenas and start the trimmer (once per process; call it before the process's
    threads start). Where the C library is not glibc, malloc is left as it is."""
    global _trimmer
    libc = _glibc()
    if libc is None:
        log.info("not glibc: malloc arenas and trimming left as they are")
        return
    libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    if _trimmer is None:
        _trimmer = threading.Thread(target=_trim_forever, args=(libc,), name="heap-trim", daemon=True)
        _trimmer.start()


def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def _trim_forever(libc: ctypes.CDLL) -> None:
    # ctypes releases the GIL for the call: trimming (a few ms) never holds up an event loop.
    while True:
        time.sleep(TRIM_EVERY_S)
        libc.malloc_trim(0)
