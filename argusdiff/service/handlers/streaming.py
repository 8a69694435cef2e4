"""One streamed generation (``"stream": true``): the worker's progress and partial images, then the
image or an error, as server-sent events on an :class:`~argusdiff.service.handlers.base.EventStream`.
A client that goes away cancels the work; a stream that reaches ``request_timeout_s`` leaves it
queued."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

from argusdiff.service import schemas as s
from argusdiff.service.errors import ApiError
from argusdiff.service.handlers.base import CLIENT_CLOSED, Api, ClientGone, EventStream, dump
from argusdiff.service.handlers.results import image_bytes
from argusdiff.service.handlers.work import cancel, cancelled, filtered, lost, timed_out
from argusdiff.service.images import encode, read_image
from argusdiff.service.router import Submission
from workers.cancel import CANCELLED
from workers.messages import WorkResult
from workers.safety import FILTERED

__all__ = ["Emit", "stream_run"]

Emit = Callable[[str, dict], Awaitable[None]]


async def _error(emit: Emit, exc: ApiError) -> int:
    """The stream's error event; the request's final status."""
    await emit("error", exc.body())
    return exc.status


async def _completed(
    api: Api, sub: Submission, spec: s.GenerationSpec, res: WorkResult, emit: Emit, common: dict
) -> int:
    """The stream's last event for the image's result: the completed image, or the error of a
    cancelled, filtered or failed one (or one the image store lost); the request's final status."""
    if res.error_type == CANCELLED:
        return await _error(emit, cancelled(sub.id))
    if res.error_type == FILTERED:
        return await _error(emit, filtered(sub.id, 0))
    if not res.ok or (res.image_png is None and not res.image_ref):
        return await _error(
            emit,
            ApiError(
                500,
                f"generation {sub.id}: the image failed at level {res.level} ({res.error_type or 'error'})",
                type="server_error",
                code="generation_failed",
            ),
        )
    # the worker's PNG (embedded), or the image it stored in the requested format
    try:
        data = await image_bytes(api, res, spec.output_format, spec.output_compression)
    except ApiError as exc:  # the image store failed or lost it
        return await _error(emit, exc)
    await emit(
        "image_generation.completed",
        dump(s.ImageCompletedEvent(b64_json=base64.b64encode(data).decode("ascii"), **common)),
    )
    return 200


def stream_run(api: Api, sub: Submission, spec: s.GenerationSpec) -> Callable[[Emit, asyncio.Event], Awaitable[int]]:
    """The body of ``sub``'s event stream: ``run(emit, gone)`` returns the final status."""
    dispatch = api.dispatch
    rid = sub.request_ids[0]
    events = dispatch.events(rid)

    def common() -> dict[str, Any]:
        return {
            "created_at": int(time.time()),
            "size": spec.size,
            "quality": spec.quality,
            "background": "opaque",
            "output_format": spec.output_format,
        }

    async def b64(png: bytes) -> str:
        data = await asyncio.to_thread(encode, png, spec.output_format, spec.output_compression)
        return base64.b64encode(data).decode("ascii")

    async def partial_png(event: dict) -> bytes | None:
        """A partial image: its PNG (embedded), or read from the image store by its key (Redis
        mode); None when it cannot be read (a partial image is best effort)."""
        if event.get("png"):
            return event["png"]
        ref = event.get("ref")
        if not ref or dispatch.images is None:
            return None
        try:
            return await asyncio.to_thread(read_image, dispatch.images, str(ref))
        except Exception:
            return None

    async def run(emit: Emit, gone: asyncio.Event) -> int:
        deadline = time.monotonic() + api.config.request_timeout_s
        ping_s = api.config.sse_ping_s
        partials = 0
        watch = asyncio.ensure_future(gone.wait())
        nxt: asyncio.Future | None = None
        try:
            while True:
                if nxt is None:
                    nxt = asyncio.ensure_future(events.get())
                left = deadline - time.monotonic()
                await asyncio.wait({nxt, watch}, timeout=max(0.0, min(left, ping_s)),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if not nxt.done():
                    if gone.is_set():
                        raise ClientGone
                    if time.monotonic() < deadline:  # silent for ping_s (queued, or a long step)
                        await EventStream.ping(emit)
                        continue
                    dispatch.detach([rid])
                    return await _error(emit, timed_out(api, sub.id))
                kind, payload = nxt.result()
                nxt = None
                if kind == "event" and payload.get("type") == "progress":
                    await emit("argusdiff.progress", dump(s.ProgressEvent(
                        created_at=int(time.time()), step=int(payload["step"]), steps=int(payload["steps"]),
                        level=payload.get("level"))))  # fmt: skip
                elif kind == "event" and payload.get("type") == "partial":
                    # numbered here: a deferred cascade's heavy level starts its own count again
                    png = await partial_png(payload)
                    if png is not None and partials < spec.partial_images:
                        await emit(
                            "image_generation.partial_image",
                            dump(
                                s.ImagePartialEvent(b64_json=await b64(png), partial_image_index=partials, **common())
                            ),
                        )
                        partials += 1
                elif kind == "result":
                    return await _completed(api, sub, spec, payload, emit, common())
                elif kind == "error":
                    return await _error(emit, lost(api, sub.id, payload))
        except ClientGone:
            await cancel(api, sub)
            return CLIENT_CLOSED
        finally:
            watch.cancel()
            if nxt is not None:
                nxt.cancel()

    return run
