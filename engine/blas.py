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
import glob
import logging
import os

log = logging.getLogger(__name__)

# Where numpy wheels put their OpenBLAS, and what it calls its setter (the scipy-openblas
# builds that numpy >= 2 bundles, then plain OpenBLAS builds)
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


def _numpy_openblas() -> list[ctypes.CDLL]:
    import numpy

    folder = os.path.dirname(os.path.dirname(numpy.__file__))
    paths = sorted(glob.glob(os.path.join(folder, "numpy.libs", "lib*openblas*.so*")))
    return [ctypes.CDLL(path) for path in paths]  # (already loaded by numpy: the same library)


def blas_threads() -> int | None:
    """numpy's OpenBLAS threads now, or None where numpy's BLAS is not one this can see."""
    for lib in _numpy_openblas():
        for name in _GETTERS:
            getter = getattr(lib, name, None)
            if getter is not None:
                return int(getter())
    return None


def single_threaded_blas() -> bool:
    """Hold numpy's OpenBLAS to one thread (see above); False where it could not be found
    (another BLAS: then OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment decide)."""
    for lib in _numpy_openblas():
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int64(1))  # (int or 64-bit int by build: 1 reads the same in both)
                return True
    log.info("numpy's BLAS is not a bundled OpenBLAS: its threads are left as they are")
    return False
