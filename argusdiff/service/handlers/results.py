"""A generation's results as response bodies (images inline or as URLs, the native body with each
image's routing facts), and the endpoints that fetch them later:
``GET /v1/argusdiff/generations/{id}`` and ``GET /v1/images/{image_id}``."""

from __future__ import annotations

import asyncio
import base64
import time
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.errors import ApiError
from argusdiff.service.handlers.base import IMAGE_POST_ROUTES, Api, dump
from argusdiff.service.handlers.work import cancel_images, check_results
from argusdiff.service.images import CONTENT_TYPES, ImageStoreUnavailable, check_image_id, encode, read_image
from workers.messages import WorkResult

__all__ = ["accepted", "cancelled_body", "image_entry", "native_body", "routes", "served_quality"]


async def image_bytes(api: Api, res: WorkResult, fmt: str, compression: int | None) -> bytes:
    dispatch = api.dispatch
    if res.image_png is not None:
        return await asyncio.to_thread(encode, res.image_png, fmt, compression)
    data = None
    if res.image_ref and dispatch.images is not None:
        try:
            data = await asyncio.to_thread(read_image, dispatch.images, res.image_ref)
        except ImageStoreUnavailable as exc:
            raise api.busy(f"the image store is unavailable: {exc}", "image_store_unavailable") from None
    if data is None:
        raise ApiError(410, f"the image of {res.request_id} is no longer kept (it was delivered, or it expired)",
                       code="image_gone")  # fmt: skip
    return data


async def image_entry(api: Api, res: WorkResult, record: dict, request: Request) -> dict[str, Any]:
    dispatch = api.dispatch
    fmt = str(record.get("output_format") or "png")
    if record.get("response_format") == "url":
        if res.image_ref and dispatch.images is not None:
            url = await asyncio.to_thread(
                dispatch.images.url, res.image_ref, api.base_url(request), api.config.result_ttl_s
            )
        else:  # the image store failed: served from router memory while it lasts
            url = f"{api.base_url(request)}/v1/images/{res.request_id}.{fmt}"
        return {"url": url}
    data = await image_bytes(api, res, fmt, record.get("output_compression"))
    return {"b64_json": base64.b64encode(data).decode("ascii")}


def served_quality(api: Api, results: list[WorkResult]) -> str:
    levels = api.levels
    served = {r.level for r in results}
    if served <= {levels[0]}:
        return "high"
    return "low" if levels[-1] in served else "medium"


async def native_body(api: Api, gid: str, record: dict, results: list[WorkResult], request: Request) -> dict[str, Any]:
    data = []
    created = record.get("arrival_s", record.get("created"))
    deadline = record.get("deadline_s")
    for i, res in enumerate(results):
        entry = await image_entry(api, res, record, request)
        optimal = (record.get("optimal_levels") or [None] * (i + 1))[i]
        why = (record.get("why") or [None] * (i + 1))[i]
        latency = max(0.0, res.finished_s - float(created)) if res.finished_s and created is not None else None
        slo_met = res.finished_s <= float(deadline) if res.finished_s and deadline is not None else None
        data.append(
            s.NativeImage(
                **entry,
                level=res.level,
                requested_level=res.requested_level,
                optimal_level=optimal,
                why=why,
                worker=res.worker_id,
                seed=res.seed,
                cache_hit=res.cache_hit,
                k_used=res.k_used,
                deferred=res.deferred,
                latency_s=latency,
                slo_met=slo_met,
                timings={k: float(v) for k, v in (res.timings or {}).items()},
            )
        )
    body = s.NativeGeneration(
        id=gid,
        created=int(record["created"]),
        size=record.get("size"),
        output_format=record.get("output_format") or "png",
        data=data,
    )
    return dump(body)


def accepted(gid: str, created: int, done: int, n: int, levels: list[str]) -> JSONResponse:
    body = s.GenerationAccepted(id=gid, created=created, done=done, n=n, levels=levels)
    return JSONResponse(
        dump(body),
        status_code=202,
        headers={"Location": f"/v1/argusdiff/generations/{gid}", "Retry-After": "1"},
    )


async def get_generation(api: Api, request: Request) -> Response:
    dispatch = api.dispatch
    gid = request.path_params["id"]
    record = await api.owned_record(request, gid)
    rids = list(record["request_ids"])
    results = await dispatch.fetch_results(rids, record)
    if record.get("status") == "cancelled":
        return cancelled_body(gid, record, results)
    if len(results) < len(rids):
        return accepted(gid, int(record["created"]), len(results), len(rids), list(record.get("levels", [])))
    ordered = [results[r] for r in rids]
    check_results(api, gid, ordered)
    return JSONResponse(await native_body(api, gid, record, ordered, request))


def cancelled_body(gid: str, record: dict, results: dict[str, WorkResult]) -> JSONResponse:
    done = sum(1 for r in results.values() if r.ok)
    body = s.GenerationCancelled(
        id=gid,
        created=int(record["created"]),
        done=done,
        n=len(record["request_ids"]),
        cancelled_at=float(record.get("cancelled_at") or 0.0),
    )
    return JSONResponse(dump(body))


async def delete_generation(api: Api, request: Request) -> Response:
    """Cancel a generation: its queued images leave the queue, its running ones stop at their next
    denoising step (on whichever worker runs them), and the generation's status becomes
    ``cancelled``. Cancelling a cancelled one answers the same; a finished one is 409."""
    dispatch = api.dispatch
    gid = request.path_params["id"]
    record = await api.owned_record(request, gid)
    rids = list(record["request_ids"])
    results = await dispatch.fetch_results(rids, record)
    if record.get("status") != "cancelled":
        pending = [r for r in rids if r not in results]
        if not pending:
            raise ApiError(409, f"generation {gid} has already finished: GET it", param="id",
                           code="generation_finished")  # fmt: skip
        marked = await dispatch.mark_record(gid, {"status": "cancelled", "cancelled_at": time.time()})
        if marked is None:
            raise ApiError(404, f"no generation {gid!r} (unknown or expired)", param="id", code="not_found")
        record = marked
        await cancel_images(api, pending, "delete")
    return cancelled_body(gid, record, results)


async def get_image(api: Api, request: Request) -> Response:
    dispatch = api.dispatch
    key = request.path_params["image_id"]
    if key in IMAGE_POST_ROUTES:  # GET /v1/images/generations: the route exists, for POST only
        raise ApiError(
            405,
            f"method GET not allowed on {request.url.path}: POST it",
            code="method_not_allowed",
            headers={"Allow": "POST"},
        )
    try:
        check_image_id(key)
    except ValueError:
        key = ""
    fmt = key.rsplit(".", 1)[-1] if key else ""
    if key and dispatch.images is not None:
        if dispatch.images.presigned:
            return RedirectResponse(
                await asyncio.to_thread(dispatch.images.url, key, api.base_url(request), api.config.result_ttl_s),
                status_code=307,
            )
        try:
            data = await asyncio.to_thread(read_image, dispatch.images, key)
        except ImageStoreUnavailable:
            data = None
        if data is not None:
            return Response(data, media_type=CONTENT_TYPES[fmt], headers={"Cache-Control": "private, max-age=3600"})
    if key:  # the image store failed when it finished: router memory, while it lasts
        res = (await dispatch.fetch_results([key.rsplit(".", 1)[0]])).get(key.rsplit(".", 1)[0])
        if res is not None and res.image_png is not None:
            data = await asyncio.to_thread(encode, res.image_png, fmt)
            return Response(data, media_type=CONTENT_TYPES[fmt], headers={"Cache-Control": "private, max-age=3600"})
    raise ApiError(404, "no such image (unknown id, or it expired)", param="image_id", code="not_found")


def routes(api: Api) -> list[Route]:
    return [
        Route(
            "/v1/argusdiff/generations/{id}", api.endpoint("generation", partial(get_generation, api)), methods=["GET"]
        ),
        Route(
            "/v1/argusdiff/generations/{id}",
            api.endpoint("generation_cancel", partial(delete_generation, api)),
            methods=["DELETE"],
        ),
        Route("/v1/images/{image_id}", api.endpoint("image", partial(get_image, api)), methods=["GET"]),
    ]
