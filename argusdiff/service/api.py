"""The REST API (Starlette): OpenAI-compatible image generation (with server-sent events), a
native endpoint, health, readiness, metrics, the plan and the OpenAPI document.

Every error is a JSON body in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
4xx for anything the client can fix (the field is named in ``param``), 429/503 with
``Retry-After`` when the service is busy, not ready or its queue is unreachable (nothing was
accepted), and a bare 500 ``internal_error`` (logged with its trace, never sent) for bugs.

The request lifecycle: the body must arrive within ``body_timeout_s`` (408); a client that goes
away (mid-body, while waiting, while streaming) is counted as 499 and its work is cancelled where
no worker has started it, else its result is dropped; waits end with the result, at
``request_timeout_s``, when the work is known lost, or at the end of a shutdown's drain.
``url`` responses are built from ``[service] public_url`` or the address the server is bound to,
never from the request's ``Host`` header.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.cluster import service_status
from argusdiff.service.errors import ApiError, ShuttingDown, WorkLost, error_body
from argusdiff.service.idempotency import IdempotentSubmit
from argusdiff.service.images import CONTENT_TYPES, ImageStoreUnavailable, check_image_id, encode, read_image
from argusdiff.service.metrics import CONTENT_TYPE_LATEST
from argusdiff.service.openapi import openapi_document
from argusdiff.service.plans import plan_to_dict
from workers.messages import WorkResult

__all__ = ["create_app", "make_server"]

log = logging.getLogger("argusdiff.api")

Handler = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's "client closed request": counted, never sent


class ClientGone(Exception):
    """The client disconnected (mid-body, while waiting or streaming)."""


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _dump(model: Any, **kw: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", **kw)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (call once the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class EventStream(Response):
    """``text/event-stream`` of one streamed generation; it watches the connection itself, so a
    client that goes away cancels the work at once, and it counts its own final status."""

    media_type = "text/event-stream"

    def __init__(
        self,
        run: Callable[[Callable[[str, dict], Awaitable[None]], asyncio.Event], Awaitable[int]],
        on_close: Callable[[int], None] | None = None,
    ) -> None:
        self.status_code = 200
        self.on_close = on_close
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self.run = run
        self.final_status = 200

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def emit(name: str, data: dict) -> None:
            if gone.is_set():
                raise ClientGone
            chunk = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError:
                gone.set()
                raise ClientGone from None

        watcher = asyncio.create_task(watch())
        try:
            self.final_status = await self.run(emit, gone)
            if not gone.is_set():
                try:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    self.final_status = CLIENT_CLOSED
        except BaseException:
            self.final_status = 500 if not gone.is_set() else CLIENT_CLOSED
            raise
        finally:
            watcher.cancel()
            if self.on_close is not None:
                self.on_close(self.final_status)


def create_app(service: Any, *, manage_lifecycle: bool = True) -> Starlette:
    """The ASGI app of ``service`` (an :class:`~argusdiff.service.app.Service`). With
    ``manage_lifecycle`` the app's lifespan starts and stops the service."""
    cfg = service.config
    router = service.router
    metrics = service.metrics
    dispatch = service.dispatch
    keys = tuple(k.encode() for k in cfg.api_keys)
    limits: s.Limits = router.limits
    openapi = openapi_document(limits, auth=bool(keys))
    levels = tuple(router.profile.ids)
    idem = IdempotentSubmit(service)  # Idempotency-Key: a retry through any router gets the original result

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

    async def read_body(request: Request) -> bytes:
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
        return b"".join(chunks)

    async def read_json(request: Request) -> Any:
        try:
            async with asyncio.timeout(cfg.body_timeout_s):
                raw = await read_body(request)
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {cfg.body_timeout_s:g} s",
                code="body_timeout",
                headers={"Connection": "close"},
            ) from None
        except ClientDisconnect:
            raise ClientGone from None
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
            except ClientGone:
                log.info("%s: the client went away (499)", name)
                metrics.http.labels(name, str(CLIENT_CLOSED)).inc()
                return Response(status_code=CLIENT_CLOSED)
            except Exception:
                log.exception("unhandled error in %s", name)
                response = JSONResponse(
                    error_body("internal error; the incident was logged", type="server_error", code="internal_error"),
                    status_code=500,
                )
            if isinstance(response, EventStream):  # counted when the stream ends
                response.on_close = lambda status: metrics.http.labels(name, str(status)).inc()
                return response
            metrics.http.labels(name, str(response.status_code)).inc()
            return response

        return wrapped

    def base_url(request: Request) -> str:
        """``public_url``, else the address this connection reached (the socket's, not ``Host``)."""
        if cfg.public_url:
            return cfg.public_url.rstrip("/")
        host, port = request.scope.get("server") or (cfg.host, cfg.port)
        if ":" in str(host):
            host = f"[{host}]"
        scheme = request.scope.get("scheme", "http")
        default = {"http": 80, "https": 443}.get(scheme)
        return f"{scheme}://{host}" + ("" if port == default else f":{port}")

    # -- waiting ---------------------------------------------------------------------------

    def busy(message: str, code: str) -> ApiError:
        """A 503 to retry (``Retry-After``)."""
        return ApiError(503, message, type="server_busy", code=code, headers={"Retry-After": str(cfg.retry_after_s)})

    def check_serving() -> None:
        """Fast 503 while no worker serves a level (instead of a wait to request_timeout_s)."""
        if router.closing or router.plan is None or service.serving:
            return  # the router's own checks answer the first two
        raise busy(f"no worker is ready: {service.not_serving_reason()}; retry later", "no_worker_ready")

    async def submit(request: Request, spec: s.GenerationSpec, endpoint: str) -> Any:
        check_serving()
        return await idem.submit(request, spec, endpoint)  # router.submit unless an Idempotency-Key came

    async def cancel(sub: Any) -> None:
        if idem.keyed(sub):  # sent with an Idempotency-Key: its retry will come for the result
            dispatch.detach(list(sub.request_ids))
            return
        removed = await dispatch.cancel(list(sub.request_ids))
        log.info("generation %s: client gone; %d of %d images taken out of the queue, the rest dropped",
                 sub.id, len(removed), len(sub.request_ids))  # fmt: skip

    async def wait_for(request: Request, sub: Any) -> list[WorkResult]:
        """The results, or ClientGone (the work is cancelled); TimeoutError, WorkLost, ShuttingDown."""
        waiter = asyncio.ensure_future(idem.wait(sub, cfg.request_timeout_s))
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        await cancel(sub)
        raise ClientGone

    def lost(sub_id: str, exc: Exception) -> ApiError:
        if isinstance(exc, WorkLost):
            return busy(f"generation {sub_id}: {exc}", "work_lost")
        if dispatch.mode == "redis":
            what = f"it stays queued: poll GET /v1/argusdiff/generations/{sub_id} on another instance"
        else:
            what = "it ran in this process only: retry against another instance"
        return busy(f"the service is shutting down before generation {sub_id} finished; {what}", "shutting_down")

    def check_results(sub_id: str, results: list[WorkResult]) -> None:
        for i, res in enumerate(results):
            if not res.ok:
                kind = res.error_type or "error"
                if kind == "Dropped":  # the policy dropped it after the light stage (cascade)
                    raise ApiError(
                        429,
                        f"generation {sub_id}: image {i} was dropped: {res.error}; retry later",
                        type="server_busy",
                        code="overloaded",
                        headers={"Retry-After": str(cfg.retry_after_s)},
                    )
                raise ApiError(
                    500,
                    f"generation {sub_id}: image {i} failed at level {res.level} ({kind})",
                    type="server_error",
                    code="generation_failed",
                )

    # -- images ----------------------------------------------------------------------------

    async def image_bytes(res: WorkResult, fmt: str, compression: int | None) -> bytes:
        if res.image_png is not None:
            return await asyncio.to_thread(encode, res.image_png, fmt, compression)
        data = None
        if res.image_ref and dispatch.images is not None:
            try:
                data = await asyncio.to_thread(read_image, dispatch.images, res.image_ref)
            except ImageStoreUnavailable as exc:
                raise busy(f"the image store is unavailable: {exc}", "image_store_unavailable") from None
        if data is None:
            raise ApiError(410, f"the image of {res.request_id} is no longer kept (it was delivered, or it expired)",
                           code="image_gone")  # fmt: skip
        return data

    async def image_entry(res: WorkResult, record: dict, request: Request) -> dict[str, Any]:
        fmt = str(record.get("output_format") or "png")
        if record.get("response_format") == "url":
            if res.image_ref and dispatch.images is not None:
                url = await asyncio.to_thread(dispatch.images.url, res.image_ref, base_url(request), cfg.result_ttl_s)
            else:  # the image store failed: served from router memory while it lasts
                url = f"{base_url(request)}/v1/images/{res.request_id}.{fmt}"
            return {"url": url}
        data = await image_bytes(res, fmt, record.get("output_compression"))
        return {"b64_json": base64.b64encode(data).decode("ascii")}

    def served_quality(results: list[WorkResult]) -> str:
        served = {r.level for r in results}
        if served <= {levels[0]}:
            return "high"
        return "low" if levels[-1] in served else "medium"

    async def native_body(gid: str, record: dict, results: list[WorkResult], request: Request) -> dict[str, Any]:
        data = []
        created = record.get("arrival_s", record.get("created"))
        deadline = record.get("deadline_s")
        for i, res in enumerate(results):
            entry = await image_entry(res, record, request)
            optimal = (record.get("optimal_levels") or [None] * (i + 1))[i]
            latency = max(0.0, res.finished_s - float(created)) if res.finished_s and created is not None else None
            slo_met = res.finished_s <= float(deadline) if res.finished_s and deadline is not None else None
            data.append(
                s.NativeImage(
                    **entry,
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
        return _dump(body)

    # -- generation ------------------------------------------------------------------------

    async def openai_generate(request: Request) -> Response:
        check_auth(request)
        spec = s.parse_openai(await read_json(request), limits)
        sub = await submit(request, spec, "images")
        if spec.stream:
            await idem.prime_stream(sub)  # a retried stream: the result it already has comes at once
            return EventStream(stream_run(sub, spec))
        try:
            results = await wait_for(request, sub)
        except TimeoutError:
            raise ApiError(
                504,
                f"generation {sub.id} did not finish within {cfg.request_timeout_s:g} s; it stays queued: "
                f"GET /v1/argusdiff/generations/{sub.id}",
                type="timeout",
                code="timeout",
            ) from None
        except (WorkLost, ShuttingDown) as exc:
            raise lost(sub.id, exc) from None
        check_results(sub.id, results)
        record = sub.record()
        body = s.ImagesResponse(
            created=sub.created,
            data=[s.Image(**await image_entry(r, record, request)) for r in results],
            size=spec.size,
            quality=served_quality(results),
            output_format=spec.output_format,
            background="opaque",
        )
        headers = {"Argusdiff-Unhonoured": ", ".join(spec.unhonoured)} if spec.unhonoured else None
        return JSONResponse(_dump(body, exclude_none=True), headers=headers)

    def stream_run(sub: Any, spec: s.GenerationSpec):
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

        async def error(emit: Callable, exc: ApiError) -> int:
            await emit("error", exc.body())
            return exc.status

        async def run(emit: Callable[[str, dict], Awaitable[None]], gone: asyncio.Event) -> int:
            deadline = time.monotonic() + cfg.request_timeout_s
            partials = 0
            watch = asyncio.ensure_future(gone.wait())
            try:
                while True:
                    nxt = asyncio.ensure_future(events.get())
                    await asyncio.wait({nxt, watch}, timeout=deadline - time.monotonic(),
                                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                    if not nxt.done():
                        nxt.cancel()
                        if gone.is_set():
                            raise ClientGone
                        dispatch.detach([rid])
                        return await error(
                            emit,
                            ApiError(
                                504,
                                f"generation {sub.id} did not finish within {cfg.request_timeout_s:g} s; it stays "
                                f"queued: GET /v1/argusdiff/generations/{sub.id}",
                                type="timeout",
                                code="timeout",
                            ),
                        )
                    kind, payload = nxt.result()
                    if kind == "event" and payload.get("type") == "progress":
                        await emit("argusdiff.progress", _dump(s.ProgressEvent(
                            created_at=int(time.time()), step=int(payload["step"]), steps=int(payload["steps"]),
                            level=payload.get("level"))))  # fmt: skip
                    elif kind == "event" and payload.get("type") == "partial" and payload.get("png"):
                        # numbered here: a deferred cascade's heavy level starts its own count again
                        if partials < spec.partial_images:
                            await emit(
                                "image_generation.partial_image",
                                _dump(
                                    s.ImagePartialEvent(
                                        b64_json=await b64(payload["png"]), partial_image_index=partials, **common()
                                    )
                                ),
                            )
                            partials += 1
                    elif kind == "result":
                        res: WorkResult = payload
                        if not res.ok or res.image_png is None:
                            return await error(
                                emit,
                                ApiError(
                                    500,
                                    f"generation {sub.id}: the image failed at level {res.level} "
                                    f"({res.error_type or 'error'})",
                                    type="server_error",
                                    code="generation_failed",
                                ),
                            )
                        await emit(
                            "image_generation.completed",
                            _dump(s.ImageCompletedEvent(b64_json=await b64(res.image_png), **common())),
                        )
                        return 200
                    elif kind == "error":
                        return await error(emit, lost(sub.id, payload))
            except ClientGone:
                await cancel(sub)
                return CLIENT_CLOSED
            finally:
                watch.cancel()

        return run

    async def native_generate(request: Request) -> Response:
        check_auth(request)
        spec = s.parse_native(await read_json(request), limits)
        sub = await submit(request, spec, "native")
        record = sub.record()
        if not spec.wait:
            return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
        try:
            results = await wait_for(request, sub)
        except TimeoutError:
            return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
        except (WorkLost, ShuttingDown) as exc:
            raise lost(sub.id, exc) from None
        check_results(sub.id, results)
        return JSONResponse(await native_body(sub.id, record, results, request))

    def accepted(gid: str, created: int, done: int, n: int, levels: list[str]) -> JSONResponse:
        body = s.GenerationAccepted(id=gid, created=created, done=done, n=n, levels=levels)
        return JSONResponse(
            _dump(body),
            status_code=202,
            headers={"Location": f"/v1/argusdiff/generations/{gid}", "Retry-After": "1"},
        )

    async def get_generation(request: Request) -> Response:
        check_auth(request)
        gid = request.path_params["id"]
        record = await dispatch.get_record(gid) if len(gid) <= 64 else None
        if record is None:
            raise ApiError(404, f"no generation {gid!r} (unknown or expired)", param="id", code="not_found")
        rids = list(record["request_ids"])
        results = await dispatch.fetch_results(rids, record)
        if len(results) < len(rids):
            return accepted(gid, int(record["created"]), len(results), len(rids), list(record.get("levels", [])))
        ordered = [results[r] for r in rids]
        check_results(gid, ordered)
        return JSONResponse(await native_body(gid, record, ordered, request))

    async def get_image(request: Request) -> Response:
        key = request.path_params["image_id"]
        try:
            check_image_id(key)
        except ValueError:
            key = ""
        fmt = key.rsplit(".", 1)[-1] if key else ""
        if key and dispatch.images is not None:
            if dispatch.images.presigned:
                return RedirectResponse(
                    await asyncio.to_thread(dispatch.images.url, key, base_url(request), cfg.result_ttl_s),
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

    # -- operations ------------------------------------------------------------------------

    async def models(request: Request) -> Response:
        check_auth(request)
        return JSONResponse(_dump(s.ModelList(data=[s.ModelEntry(id=m) for m in limits.models])))

    async def healthz(request: Request) -> Response:
        return JSONResponse(_dump(s.Health()))

    async def readyz(request: Request) -> Response:
        ready, reason = service.readiness()
        plan = router.plan
        body = s.Readiness(
            ready=ready,
            reason=reason,
            plan_version=None if plan is None else plan.version,
            workers_up=len(service.control.alive),
            workers_serving=len(service.serving),
            queue=dispatch.mode,
            queue_healthy=dispatch.healthy,
        )
        if ready:
            return JSONResponse(_dump(body))
        return JSONResponse(_dump(body), status_code=503, headers={"Retry-After": str(cfg.retry_after_s)})

    async def metrics_endpoint(request: Request) -> Response:
        health = router.cache_health
        metrics.cache_hit_ratio.set(health.hit_ratio())
        metrics.result_memory.set(dispatch.results.bytes)
        metrics.results_evicted.set(dispatch.results.evicted)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def plan_endpoint(request: Request) -> Response:
        check_auth(request)
        plan = router.plan
        if plan is None:
            raise busy("no plan yet: the control loop has not run", "not_ready")
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
        body["classifier"] = service.classifier_status()
        body["control"] = {
            "period_s": service.control.period_s,
            "ticks": service.control.ticks,
            "requeued": service.control.requeued,
            "migrated": service.control.migrated,
            "last_error": service.control.last_error,
        }
        return JSONResponse(body)

    async def cluster_endpoint(request: Request) -> Response:
        check_auth(request)
        return JSONResponse(await asyncio.to_thread(service_status, service))

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
        Route("/v1/cluster", endpoint("cluster", cluster_endpoint), methods=["GET"]),
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


def make_server(service: Any, *, host: str, port: int, log_level: str = "info", **options: Any) -> Any:
    """A uvicorn server for ``service`` whose shutdown is bounded by ``[service] drain_timeout_s``:
    SIGTERM/SIGINT stops new requests and starts the service's drain at once (waiting clients get
    their images or a 503 when the drain ends), and uvicorn's graceful-shutdown timeout is the
    drain plus a margin."""
    import uvicorn

    cfg = service.config

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            loop = self.loop
            if loop is not None and not loop.is_closed() and service.started:
                loop.call_soon_threadsafe(service.begin_shutdown)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        create_app(service),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=int(cfg.drain_timeout_s) + 5,
        **options,
    )
    return Server(config)
