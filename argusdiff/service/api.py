"""The REST API (Starlette): OpenAI-compatible image generation, a native endpoint, health,
readiness, metrics, the plan and the OpenAPI document.

Every error is a JSON body in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
4xx for anything the client can fix (the field is named in ``param``), 429/503 with
``Retry-After`` when the service is busy or its queue is unreachable (nothing was accepted),
and a bare 500 ``internal_error`` (logged with its trace, never sent) for bugs.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from argusdiff.domain import Tier
from argusdiff.service.errors import ApiError, error_body
from argusdiff.service.metrics import CONTENT_TYPE_LATEST
from argusdiff.service.openapi import openapi_document
from argusdiff.service.plans import plan_to_dict
from argusdiff.service.schemas import parse_native, parse_openai
from workers.executor import WorkResult

__all__ = ["create_app"]

log = logging.getLogger("argusdiff.api")

Handler = Callable[[Request], Awaitable[Response]]


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def create_app(service: Any, *, manage_lifecycle: bool = True) -> Starlette:
    """The ASGI app of ``service`` (an :class:`~argusdiff.service.app.Service`). With
    ``manage_lifecycle`` the app's lifespan starts and stops the service."""
    cfg = service.config
    router = service.router
    metrics = service.metrics
    keys = tuple(k.encode() for k in cfg.api_keys)
    openapi = openapi_document(router.limits, auth=bool(keys), tiers=tuple(t.value for t in Tier))

    def check_auth(request: Request) -> None:
        if not keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                param=None,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        supplied = token.strip().encode()
        if not any(hmac.compare_digest(supplied, k) for k in keys):
            raise ApiError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> Any:
        limit = cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                too_big = int(declared) > limit
            except ValueError:
                raise ApiError(400, "invalid Content-Length header", code="invalid_header") from None
            if too_big:
                raise ApiError(413, f"request body larger than {limit} bytes", code="body_too_large")
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body larger than {limit} bytes", code="body_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise ApiError(400, "the request body is empty: send a JSON object", code="invalid_body")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None

    def endpoint(name: str, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                response = await handler(request)
            except ApiError as exc:
                response = _error_response(exc)
            except Exception:
                log.exception("unhandled error in %s", name)
                response = JSONResponse(
                    error_body("internal error; the incident was logged", type="server_error", code="internal_error"),
                    status_code=500,
                )
            metrics.http.labels(name, str(response.status_code)).inc()
            return response

        return wrapped

    def base_url(request: Request) -> str:
        if cfg.public_url:
            return cfg.public_url.rstrip("/")
        return f"{request.url.scheme}://{request.url.netloc}"

    def check_results(sub_id: str, results: list[WorkResult]) -> None:
        for i, res in enumerate(results):
            if not res.ok:
                kind = res.error_type or "error"
                raise ApiError(
                    500,
                    f"generation {sub_id}: image {i} failed at level {res.level} ({kind})",
                    type="server_error",
                    code="generation_failed",
                )

    def image_entry(res: WorkResult, fmt: str, request: Request) -> dict[str, Any]:
        if fmt == "url":
            return {"url": f"{base_url(request)}/v1/images/{res.request_id}"}
        return {"b64_json": base64.b64encode(res.image_png or b"").decode("ascii")}

    def native_entry(res: WorkResult, fmt: str, request: Request, record: dict[str, Any], i: int) -> dict[str, Any]:
        entry = image_entry(res, fmt, request)
        timings = {k: float(v) for k, v in (res.timings or {}).items()}
        optimal = record.get("optimal_levels", [None] * (i + 1))[i]
        deadline = record.get("deadline_s")
        latency = None
        slo_met = None
        if res.finished_s and record.get("created") is not None:
            latency = max(0.0, res.finished_s - float(record.get("arrival_s", record["created"])))
        if res.finished_s and deadline is not None:
            slo_met = res.finished_s <= float(deadline)
        entry.update(
            level=res.level,
            requested_level=res.requested_level,
            optimal_level=optimal,
            worker=res.worker_id,
            seed=res.seed,
            cache_hit=res.cache_hit,
            k_used=res.k_used,
            deferred=res.deferred,
            latency_s=latency,
            slo_met=slo_met,
            timings=timings,
        )
        return entry

    # -- generation ------------------------------------------------------------------------

    async def openai_generate(request: Request) -> Response:
        check_auth(request)
        spec = parse_openai(await read_json(request), router.limits)
        sub = await router.submit(spec)
        try:
            results = await router.wait(sub, cfg.request_timeout_s)
        except TimeoutError:
            raise ApiError(
                504,
                f"generation {sub.id} did not finish within {cfg.request_timeout_s:g} s; it stays queued: "
                f"GET /v1/argusdiff/generations/{sub.id}",
                type="timeout",
                code="timeout",
            ) from None
        check_results(sub.id, results)
        return JSONResponse(
            {"created": sub.created, "data": [image_entry(r, spec.response_format, request) for r in results]}
        )

    async def native_generate(request: Request) -> Response:
        check_auth(request)
        spec = parse_native(await read_json(request), router.limits)
        sub = await router.submit(spec)
        record = sub.record()
        if not spec.wait:
            return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
        try:
            results = await router.wait(sub, cfg.request_timeout_s)
        except TimeoutError:
            return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
        check_results(sub.id, results)
        return JSONResponse(
            {
                "id": sub.id,
                "created": sub.created,
                "status": "completed",
                "data": [native_entry(r, spec.response_format, request, record, i) for i, r in enumerate(results)],
            }
        )

    def accepted(gid: str, created: int, done: int, n: int, levels: list[str]) -> JSONResponse:
        return JSONResponse(
            {"id": gid, "created": created, "status": "in_progress", "done": done, "n": n, "levels": levels},
            status_code=202,
            headers={"Location": f"/v1/argusdiff/generations/{gid}", "Retry-After": "1"},
        )

    async def get_generation(request: Request) -> Response:
        check_auth(request)
        gid = request.path_params["id"]
        record = await service.dispatch.get_record(gid) if len(gid) <= 64 else None
        if record is None:
            raise ApiError(404, f"no generation {gid!r} (unknown or expired)", param="id", code="not_found")
        rids = list(record["request_ids"])
        results = await service.dispatch.fetch_results(rids)
        if len(results) < len(rids):
            return accepted(gid, int(record["created"]), len(results), len(rids), list(record.get("levels", [])))
        ordered = [results[r] for r in rids]
        check_results(gid, ordered)
        fmt = record.get("response_format", "b64_json")
        return JSONResponse(
            {
                "id": gid,
                "created": record["created"],
                "status": "completed",
                "data": [native_entry(r, fmt, request, record, i) for i, r in enumerate(ordered)],
            }
        )

    async def get_image(request: Request) -> Response:
        image_id = request.path_params["image_id"]
        res = None
        if len(image_id) <= 80:
            res = (await service.dispatch.fetch_results([image_id])).get(image_id)
        if res is None or not res.ok:
            raise ApiError(404, "no such image (unknown id, or it expired)", param="image_id", code="not_found")
        return Response(res.image_png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    # -- operations ------------------------------------------------------------------------

    async def models(request: Request) -> Response:
        check_auth(request)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "argusdiff"} for m in router.limits.models]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        plan = router.plan
        body = {
            "ready": service.ready(),
            "plan_version": None if plan is None else plan.version,
            "workers_up": len(service.control.alive),
            "queue": service.dispatch.mode,
            "queue_healthy": service.dispatch.healthy,
        }
        if body["ready"]:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(cfg.retry_after_s)})

    async def metrics_endpoint(request: Request) -> Response:
        health = router.cache_health
        metrics.cache_hit_ratio.set(health.hit_ratio())
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def plan_endpoint(request: Request) -> Response:
        check_auth(request)
        plan = router.plan
        if plan is None:
            raise ApiError(
                503,
                "no plan yet: the control loop has not run",
                type="server_busy",
                code="not_ready",
                headers={"Retry-After": str(cfg.retry_after_s)},
            )
        health = router.cache_health
        body = plan_to_dict(plan)
        body["workers"] = {w: dict(info) for w, info in sorted(service.control.alive.items())}
        body["cache"] = {
            "healthy": health.healthy,
            "median_latency_s": health.median_latency_s(),
            "error_rate": health.error_rate(),
            "hit_ratio": health.hit_ratio(),
        }
        body["in_flight"] = dict(router.level_load)
        body["control"] = {
            "period_s": service.control.period_s,
            "ticks": service.control.ticks,
            "requeued": service.control.requeued,
            "migrated": service.control.migrated,
            "last_error": service.control.last_error,
        }
        return JSONResponse(body)

    async def openapi_endpoint(request: Request) -> Response:
        return JSONResponse(openapi)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        if status == 404:
            body = error_body(f"no route {request.url.path}", type="invalid_request_error", code="not_found")
        elif status == 405:
            body = error_body(
                f"method {request.method} not allowed on {request.url.path}",
                type="invalid_request_error",
                code="method_not_allowed",
            )
        else:
            body = error_body(str(getattr(exc, "detail", "")) or "error", type="invalid_request_error")
        metrics.http.labels("unrouted", str(status)).inc()
        headers = getattr(exc, "headers", None)
        return JSONResponse(body, status_code=status, headers=headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error: %r", exc)
        return JSONResponse(error_body("internal error", type="server_error", code="internal_error"), status_code=500)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await asyncio.shield(service.stop())

    routes = [
        Route("/v1/images/generations", endpoint("images_generations", openai_generate), methods=["POST"]),
        Route("/v1/argusdiff/generations", endpoint("generations", native_generate), methods=["POST"]),
        Route("/v1/argusdiff/generations/{id}", endpoint("generation", get_generation), methods=["GET"]),
        Route("/v1/images/{image_id}", endpoint("image", get_image), methods=["GET"]),
        Route("/v1/models", endpoint("models", models), methods=["GET"]),
        Route("/v1/plan", endpoint("plan", plan_endpoint), methods=["GET"]),
        Route("/healthz", endpoint("healthz", healthz), methods=["GET"]),
        Route("/readyz", endpoint("readyz", readyz), methods=["GET"]),
        Route("/metrics", endpoint("metrics", metrics_endpoint), methods=["GET"]),
        Route("/openapi.json", endpoint("openapi", openapi_endpoint), methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
