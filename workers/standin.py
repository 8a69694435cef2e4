"""TEST MODE: stand-in executors that sleep a level's profiled latency scaled down.

They exist to measure the router, queues and control loop without models (load tests, simulator
fidelity, fault tests of the transport). They return a small solid-colour PNG whose colour
depends on the seed (or, with ``[service] stand_in_image = "full"``, a PNG of the requested size
with the byte size of a real image, for memory soaks); ``timings`` carry ``stand_in = 1`` so
nothing mistakes them for real images. A streamed request gets a progress event per step and
solid-colour partial images.
``argusdiff serve --stand-in-workers SCALE`` and ``argusdiff worker --stand-in SCALE`` select them.

A cascade's light level may have a stand-in *judge* (``judge(item) -> confidence``, e.g. the
replay's per-prompt discriminator confidences): the stand-in then sleeps the discriminator's
latency too and hands a request whose confidence is below the plan's threshold back for the heavy
level, as :class:`workers.cascade.CascadeExecutor` does.
"""

from __future__ import annotations

import functools
import struct
import time
import zlib
from collections.abc import Callable, Sequence

from argusdiff.domain import ApproxLevel
from workers.cancel import Cancelled, CancelWatch, cancelled_result
from workers.messages import WorkItem, WorkResult, handoff_item

#: a stand-in batch at least this long sleeps step by step and stops when it is cancelled
CANCEL_STEPS_FROM_S = 0.05

__all__ = ["StandInExecutor", "solid_png"]


def _png(width: int, height: int, raw: bytes, level: int = 6) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(raw, level))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + idat + chunk(b"IEND", b"")


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid RGB PNG of one colour (no imaging library needed)."""
    return _png(width, height, (b"\x00" + bytes(rgb) * width) * height)


@functools.lru_cache(maxsize=4)
def _textured(width: int, height: int) -> bytes:
    """An RGB PNG whose pixels carry 4 random bits per channel: it compresses to ~1.5 bytes per
    pixel, as photographs and diffusion images do (1024² → ~1.5 MB)."""
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 16, (height, width, 3), dtype=np.uint8)
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, -1)], axis=1)
    return _png(width, height, rows.tobytes(), level=1)


def full_size_png(size: str) -> bytes:
    """A fresh copy of a real-size stand-in PNG of ``size`` (``WxH``), for memory soaks."""
    w, h = (int(x) for x in size.split("x"))
    return bytes(bytearray(_textured(w, h)))  # a new object per image, as a worker's would be


class StandInExecutor:
    """Sleeps ``level.latency(batch) × scale`` per batch (and ``load_s`` once, before the first
    batch: the scaled model load time when the worker's model changes); one stand-in PNG per item."""

    def __init__(
        self,
        level: ApproxLevel,
        scale: float,
        *,
        size: int = 8,
        load_s: float = 0.0,
        sleep=time.sleep,
        full_size: bool = False,
        judge: Callable[[WorkItem], float] | None = None,
        heavy: str | None = None,
        threshold: float = 0.0,
        judge_s: float = 0.0,
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
        self.full_size = full_size  # PNGs of the requested size with real-image entropy (memory soaks)
        self.judge = judge if heavy is not None else None  # cascade light level: confidence per item
        self.heavy = heavy
        self.threshold = threshold
        self.judge_s = judge_s

    def set_threshold(self, threshold: float) -> None:
        self.threshold = threshold

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
        try:
            self._steps(items, busy)
        except Cancelled as exc:
            return [cancelled_result(item, exc) for item in items]
        if self.judge is not None and self.judge_s > 0:
            self._sleep(self.judge_s * self.scale)
        self.batches += 1
        out = []
        for item in items:
            confidence = None if self.judge is None else float(self.judge(item))
            handoff = None
            if confidence is not None and confidence < self.threshold:
                handoff = handoff_item(item, str(self.heavy), confidence)
            rgb = self._colour(item)
            wait = max(0.0, start - item.enqueue_s) if item.enqueue_s else 0.0
            out.append(
                WorkResult(
                    request_id=item.request_id,
                    level=self.level_id,
                    image_png=full_size_png(item.meta["size"])
                    if self.full_size and item.meta.get("size")
                    else solid_png(self.size, self.size, rgb),
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
                    confidence=confidence,
                    handoff=handoff,
                )
            )
        return out

    @staticmethod
    def _colour(item: WorkItem, step: int | None = None) -> tuple[int, int, int]:
        seed = (item.seed or 0) + (0 if step is None else step + 1)
        lv = zlib.crc32(item.level.encode()) % 256  # the levels' images differ (drift-loop labelling)
        return (seed * 37 % 256, (seed * 101 + lv) % 256, (seed * 7 + len(item.prompt)) % 256)

    def _steps(self, items: Sequence[WorkItem], busy: float) -> None:
        """Sleep ``busy`` in the level's steps; streamed items get a progress event each step and
        stand-in partial images (solid colours) at the steps a model would decode them."""
        from workers.progress import current_sink, partial_steps, streamed

        sink = current_sink()
        streams = streamed(items) if sink is not None else []
        # a batch that may be cancelled sleeps step by step, as a model would check after each step
        # (not below 50 ms: load tests' tiny scales keep one sleep per batch)
        watch = CancelWatch(items) if busy >= CANCEL_STEPS_FROM_S else None
        if not streams and (watch is None or not watch.active):
            self._sleep(busy)
            return
        n = max(1, self.level.steps)
        start = self.level.skip if self.level.skip < n else 0
        for _, rid, _ in streams:
            sink(rid, {"type": "progress", "step": start, "steps": n, "level": self.level_id})
        for done in range(start + 1, n + 1):
            self._sleep(busy / (n - start))
            if watch is not None and watch.requested():
                raise Cancelled(f"cancelled after {done} of {n} steps", steps=done, unet_calls=done - start)
            for j, rid, partials in streams:
                sink(rid, {"type": "progress", "step": done, "steps": n, "level": self.level_id})
                at = partial_steps(start, n, partials)
                if done in at:
                    png = solid_png(self.size, self.size, self._colour(items[j], done))
                    sink(rid, {"type": "partial", "index": at.index(done), "step": done, "steps": n,
                               "level": self.level_id, "png": png})  # fmt: skip
