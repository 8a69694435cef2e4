"""TEST MODE: stand-in executors that sleep a level's profiled latency scaled down.

They exist to measure the router, queues and control loop without models (load tests, simulator
fidelity, fault tests of the transport). They return a small solid-colour PNG whose colour
depends on the seed; ``timings`` carry ``stand_in = 1`` so nothing mistakes them for real images.
``argusdiff serve --stand-in-workers SCALE`` and ``argusdiff worker --stand-in SCALE`` select them.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Sequence

from argusdiff.domain import ApproxLevel
from workers.executor import WorkItem, WorkResult

__all__ = ["StandInExecutor", "solid_png"]


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid RGB PNG of one colour (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    raw = row * height
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


class StandInExecutor:
    """Sleeps ``level.latency(batch) × scale`` per batch (and ``load_s`` once, before the first
    batch: the scaled model load time when the worker's model changes); one stand-in PNG per item."""

    def __init__(
        self, level: ApproxLevel, scale: float, *, size: int = 8, load_s: float = 0.0, sleep=time.sleep
    ) -> None:
        if scale <= 0:
            raise ValueError("stand-in scale must be > 0")
        self.level = level
        self.level_id = level.id
        self.model = f"stand-in:{level.model}"
        self.scale = scale
        self.size = size
        self._sleep = sleep
        self.batches = 0
        self._load_s = load_s
        self._loaded = False

    @property
    def loaded(self) -> bool:
        """Pays the (scaled) model load time once, as a worker switching to this level would."""
        if not self._loaded:
            self._sleep(self._load_s)
            self._loaded = True
        return True

    def run(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        _ = self.loaded
        start = time.time()
        busy = self.level.latency(len(items)) * self.scale
        self._sleep(busy)
        self.batches += 1
        out = []
        for item in items:
            seed = item.seed or 0
            rgb = (seed * 37 % 256, seed * 101 % 256, (seed * 7 + len(item.prompt)) % 256)
            wait = max(0.0, start - item.enqueue_s) if item.enqueue_s else 0.0
            out.append(
                WorkResult(
                    request_id=item.request_id,
                    level=self.level_id,
                    image_png=solid_png(self.size, self.size, rgb),
                    timings={
                        "queue_wait_s": wait,
                        "cache_lookup_s": 0.0,
                        "latent_fetch_s": 0.0,
                        "denoise_s": busy,
                        "decode_s": 0.0,
                        "stand_in": 1.0,
                    },
                    requested_level=item.level,
                    seed=item.seed,
                    finished_s=time.time(),
                )
            )
        return out
