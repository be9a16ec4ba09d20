"""numpy's BLAS in a serving process: one thread, so none spins between small products."""

import subprocess
import sys

# Small matrix products with short sleeps between them, as a voice node does them; prints
# the CPU seconds the process spent outside the calling thread. Run in a fresh interpreter:
# threads that other tests left behind would count too.
MEASURE = """
import time
import numpy as np
from engine.blas import blas_threads, single_threaded_blas
assert single_threaded_blas(), "numpy's bundled OpenBLAS was not found"
assert blas_threads() == 1, blas_threads()
a, b = np.random.rand(64, 257).astype(np.float32), np.random.rand(257, 64).astype(np.float32)
process, thread = time.process_time(), time.thread_time()
for _ in range(100):
    a @ b
    time.sleep(0.004)
print((time.process_time() - process) - (time.thread_time() - thread))
"""


def test_numpys_blas_threads_do_not_spin_between_products():
    done = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Left at a thread per core, OpenBLAS's spare threads spin ~0.1 s after each product: ~0.4 s here
    assert float(done.stdout) < 0.1
