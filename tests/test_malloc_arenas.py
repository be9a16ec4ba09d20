"""The serving process caps glibc's malloc arenas, so its many short-lived threads share a
couple of heaps instead of each leaving its own half-used one behind."""

import subprocess
import sys

import pytest

PROBE = """
import ctypes, os, sys, tempfile, threading
from gateway.cli import limit_malloc_arenas
if sys.argv[1] == "capped":
    assert limit_malloc_arenas(2)
together = threading.Barrier(8)
def allocate():  # eight threads alive at once, each allocating (above pymalloc's sizes: glibc's malloc)
    kept = [bytearray(4096) for _ in range(200)]
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = os.path.join(tempfile.mkdtemp(), "malloc.xml")
out = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fclose(ctypes.c_void_p(out))
print(open(path).read().count("<heap nr="))
"""


def heaps(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_threads_share_two_heaps_once_the_arenas_are_capped():
    try:
        uncapped = heaps("free")
    except AssertionError as exc:
        pytest.skip(f"no glibc malloc_info here: {exc}")
    assert uncapped > 2, "without the cap, each thread gets its own arena"
    assert heaps("capped") <= 2
