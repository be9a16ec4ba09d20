"""Per-key rate limits (a call token, a client IP): token buckets refilled evenly over a minute."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

MAX_TRACKED_KEYS = 10_000  # beyond this, keys whose buckets are full again are forgotten
SECONDS_PER_MINUTE = 60.0


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """At most `per_minute` requests per key in any minute, up to `per_minute` of them at once
    (a page that reconnects a few times in a row is not punished). 0 turns the limit off."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> float:
        """0.0 when the request may go ahead (and is counted); otherwise the seconds until it may."""
        if self.per_minute <= 0:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            self._forget_idle(now)
            bucket = self._buckets[key] = _Bucket(float(self.per_minute), now)
        rate = self.per_minute / SECONDS_PER_MINUTE
        bucket.tokens = min(float(self.per_minute), bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate

    def _forget_idle(self, now: float) -> None:
        if len(self._buckets) < MAX_TRACKED_KEYS:
            return
        full_after = SECONDS_PER_MINUTE  # an untouched bucket is full again within a minute
        self._buckets = {key: b for key, b in self._buckets.items() if now - b.updated < full_after}
