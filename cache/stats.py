"""Cache health counters: hit ratio, repairs, errors, and lookup/fetch/store latency percentiles.

Thread-safe, in-process, bounded memory (the last ``window`` samples of each latency). The service
exports :meth:`CacheStats.snapshot` as metrics; the router's health monitor reads the same values.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable

import numpy as np

__all__ = ["CacheStats", "percentiles"]

_LATENCIES = ("lookup_s", "fetch_s", "store_s")


def percentiles(samples: Iterable[float], qs: Iterable[float] = (50, 90, 99)) -> dict[str, float | None]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` of ``samples`` (None when there are none)."""
    arr = np.fromiter(samples, dtype=np.float64)
    qs = tuple(qs)
    if arr.size == 0:
        return {f"p{q:g}": None for q in qs}
    return {f"p{q:g}": float(v) for q, v in zip(qs, np.percentile(arr, qs), strict=True)}


class CacheStats:
    """Counters and recent latencies of one :class:`~cache.latent_cache.LatentCache`."""

    COUNTERS = ("lookups", "hits", "misses", "errors", "repairs", "stores", "store_errors", "evictions")

    def __init__(self, window: int = 10_000) -> None:
        self._lock = threading.Lock()
        self.window = int(window)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._counts: Counter[str] = Counter({c: 0 for c in self.COUNTERS})
            self._hits_by_k: Counter[int] = Counter()
            self._lat = {name: deque(maxlen=self.window) for name in _LATENCIES}

    def count(self, name: str, n: int = 1) -> None:
        if name not in self.COUNTERS:
            raise KeyError(f"unknown cache counter {name!r}")
        with self._lock:
            self._counts[name] += n

    def hit(self, k: int) -> None:
        with self._lock:
            self._counts["hits"] += 1
            self._hits_by_k[int(k)] += 1

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self._lat[name].append(float(seconds))

    @property
    def hit_ratio(self) -> float | None:
        with self._lock:
            n = self._counts["lookups"]
            return None if n == 0 else self._counts["hits"] / n

    def latencies(self, name: str) -> list[float]:
        with self._lock:
            return list(self._lat[name])

    def snapshot(self) -> dict:
        """Counters, hit ratio, hits per K and p50/p90/p99 of each latency (seconds)."""
        with self._lock:
            counts = dict(self._counts)
            by_k = dict(sorted(self._hits_by_k.items()))
            lats = {name: list(d) for name, d in self._lat.items()}
        n = counts["lookups"]
        return {
            **counts,
            "hit_ratio": None if n == 0 else counts["hits"] / n,
            "error_ratio": None if n == 0 else counts["errors"] / n,
            "hits_by_k": by_k,
            **{name: {"n": len(v), **percentiles(v)} for name, v in lats.items()},
        }
