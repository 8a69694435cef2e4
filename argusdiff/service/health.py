"""Cache health as the router sees it (ARGUS §4.6): recent lookup latencies and failures.

Samples come from finished requests (their ``cache_lookup_s`` + ``latent_fetch_s`` timings, or a
cache error) and from the control loop's background probes. The cache is degraded when the median
latency of the window exceeds the limit or the share of failures exceeds the error limit.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

__all__ = ["CacheHealth"]


class CacheHealth:
    def __init__(self, window: int = 50, *, latency_limit_s: float = 0.25, error_limit: float = 0.2) -> None:
        self._samples: deque[tuple[float, bool]] = deque(maxlen=window)
        self._lock = threading.Lock()
        self.latency_limit_s = latency_limit_s
        self.error_limit = error_limit
        self.hits = 0
        self.lookups = 0
        self.errors = 0

    def record(self, latency_s: float | None, *, error: bool = False, hit: bool | None = None) -> None:
        with self._lock:
            self._samples.append((0.0 if latency_s is None else float(latency_s), bool(error)))
            if error:
                self.errors += 1
            elif hit is not None:
                self.lookups += 1
                self.hits += int(hit)

    def reset(self) -> None:
        """Forget the window (background probes found the cache healthy again)."""
        with self._lock:
            self._samples.clear()

    def median_latency_s(self) -> float | None:
        with self._lock:
            lat = [t for t, err in self._samples if not err]
        return statistics.median(lat) if lat else None

    def error_rate(self) -> float:
        with self._lock:
            if not self._samples:
                return 0.0
            return sum(1 for _, err in self._samples if err) / len(self._samples)

    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def healthy(self) -> bool:
        if self.error_rate() > self.error_limit:
            return False
        med = self.median_latency_s()
        return med is None or med <= self.latency_limit_s

    @property
    def samples(self) -> int:
        with self._lock:
            return len(self._samples)
