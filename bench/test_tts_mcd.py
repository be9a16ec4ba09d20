"""The student's MCD is taken along a DTW alignment: check the alignment is the cheapest one."""

from __future__ import annotations

import itertools

import numpy as np

from bench.tts_vocoder_ceiling import dtw_path


def cheapest_by_recursion(cost: np.ndarray) -> float:
    total = np.full(cost.shape, np.inf)
    for i, j in itertools.product(range(cost.shape[0]), range(cost.shape[1])):
        before = [total[a, b] for a, b in ((i - 1, j), (i, j - 1), (i - 1, j - 1)) if a >= 0 and b >= 0]
        total[i, j] = cost[i, j] + (min(before) if before else 0.0)
    return float(total[-1, -1])


def test_dtw_path_is_monotonic_complete_and_cheapest():
    rng = np.random.default_rng(0)
    for n, m in ((1, 1), (1, 5), (6, 1), (7, 9), (12, 8)):
        cost = rng.random((n, m))
        path = dtw_path(cost)
        assert path[0] == (0, 0) and path[-1] == (n - 1, m - 1)
        assert all(0 <= a2 - a1 <= 1 and 0 <= b2 - b1 <= 1 and (a2, b2) != (a1, b1)
                   for (a1, b1), (a2, b2) in zip(path, path[1:]))
        assert np.isclose(sum(cost[i, j] for i, j in path), cheapest_by_recursion(cost))


def test_a_time_stretched_copy_aligns_onto_the_original():
    signal = np.sin(np.linspace(0, 6, 40))[:, None]
    stretched = np.repeat(signal, 2, axis=0)  # the same sequence, twice as slow
    cost = np.abs(signal - stretched.T)
    assert sum(cost[i, j] for i, j in dtw_path(cost)) < 1e-9
