"""Pieces of the simulator's state its parts share: each request's status code and one batch on a
worker's queue."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BIG_QUEUE", "DROPPED", "INF", "PENDING", "SERVED"]

INF = math.inf

# request status
PENDING, SERVED, DROPPED = 0, 1, 2

BIG_QUEUE = 10**9


@dataclass(slots=True)
class _Batch:
    """One batch on a worker's queue, mutated in place as requests join it and earlier batches
    move. ``rank``: the best (lowest) tier rank of its members."""

    start: float
    finish: float
    size: int
    level: str  # the level id it runs
    members: list[int]  # request indices
    worker: int
    jit: float  # the log-normal multiplier on its service time
    extra: float  # seconds added to its latency (lookups, discriminator)
    rank: int
