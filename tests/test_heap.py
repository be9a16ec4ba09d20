import gc
import threading

from gateway import heap


def test_tune_makes_full_collections_frequent_and_starts_one_trimmer():
    before = gc.get_threshold()
    try:
        heap.tune()
        heap.tune()
        assert gc.get_threshold() == heap.GC_THRESHOLDS
        assert heap.GC_THRESHOLDS[2] < before[2] or before == heap.GC_THRESHOLDS
        trimmers = [t for t in threading.enumerate() if t.name == "heap-trim"]
        assert len(trimmers) == 1 and trimmers[0].daemon
    finally:
        gc.set_threshold(*before)


def test_the_glibc_it_finds_trims_without_error():
    libc = heap._glibc()
    if libc is not None:  # glibc (Debian): malloc_trim returns 1 or 0, never raises
        assert libc.malloc_trim(0) in (0, 1)
