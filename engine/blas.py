"""numpy's BLAS held to one thread in a serving process.

numpy's bundled OpenBLAS starts a thread per core, and after each matrix product its threads
spin for about a tenth of a second waiting for the next one before they sleep. A voice node
calls small products many times a second (Whisper's mel filters, the echo suppressor's bands,
resampling), so those threads never sleep: on the 2-core node with 8 calls, numpy's second
thread took 40 % as much CPU as the event loop itself, doing nothing. The products are too
small to gain from a second thread; the engine's parallelism is across streams, on threads
of its own.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
from typing import Callable, Optional

log = logging.getLogger(__name__)

# Where numpy wheels put their OpenBLAS, and what it calls its setter (the scipy-openblas
# builds that numpy >= 2 bundles, then plain OpenBLAS builds)
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


@functools.cache
def _numpy_openblas(names: tuple[str, ...]) -> Optional[Callable[..., int]]:
    """The first of these functions in numpy's bundled OpenBLAS, or None."""
    import numpy

    folder = os.path.dirname(os.path.dirname(numpy.__file__))
    for path in sorted(glob.glob(os.path.join(folder, "numpy.libs", "lib*openblas*.so*"))):
        lib = ctypes.CDLL(path)  # (already loaded by numpy: the same library)
        for name in names:
            if hasattr(lib, name):
                return getattr(lib, name)
    return None


def blas_threads() -> int | None:
    """numpy's OpenBLAS threads now, or None where numpy's BLAS is not one this can see."""
    getter = _numpy_openblas(_GETTERS)
    return None if getter is None else int(getter())


def single_threaded_blas() -> bool:
    """Hold numpy's OpenBLAS to one thread (see above); False where it could not be found
    (another BLAS: then OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment decide)."""
    setter = _numpy_openblas(_SETTERS)
    if setter is None:
        log.info("numpy's BLAS is not a bundled OpenBLAS: its threads are left as they are")
        return False
    setter(ctypes.c_int64(1))  # (int or 64-bit int by build: 1 reads the same in both)
    return True
