"""What every endpoint shares: :class:`Api` (the service's parts the handlers use, passed to each
handler module explicitly), authentication, reading a JSON body within its limits, the wrapper that
turns errors into OpenAI-shaped bodies and counts every response, and :class:`EventStream`, the
server-sent-events response of a streamed generation."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from argusdiff.config import ServiceConfig
from argusdiff.domain import Tier
from argusdiff.service import schemas as s
from argusdiff.service.app import Service
from argusdiff.service.dispatch import Dispatch
from argusdiff.service.errors import ApiError, QueueUnavailable, error_body
from argusdiff.service.idempotency import IdempotentSubmit
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.quotas import Quotas
from argusdiff.service.router import Router

__all__ = [
    "CLIENT_CLOSED",
    "IMAGE_POST_ROUTES",
    "JSON_TYPES",
    "TIER_HEADER",
    "Api",
    "ClientGone",
    "EventStream",
    "Handler",
    "check_content_type",
    "disconnected",
    "dump",
]

log = logging.getLogger("argusdiff.api")

Handler = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's "client closed request": counted, never sent


class ClientGone(Exception):
    """The client disconnected (mid-body, while waiting or streaming)."""


#: the request header that names a request's tier (an argusdiff tier or an OpenAI ``service_tier``)
TIER_HEADER = "Argusdiff-Tier"
#: media types of a JSON body (``application/json``, or any ``+json`` type)
JSON_TYPES = ("application/json",)
#: the POST-only routes under ``/v1/images/``: a GET of one answers 405, not "no such image"
IMAGE_POST_ROUTES = ("generations", "edits")


def check_content_type(request: Request, accepted: tuple[str, ...]) -> str:
    """The body's media type when it is one of ``accepted`` (a ``+json`` type counts as
    ``application/json``); none sent counts as the first. Else 415 naming the header."""
    header = request.headers.get("content-type")
    if header is None or not header.strip():
        return accepted[0]
    media = header.split(";", 1)[0].strip().lower()
    if media in accepted or ("application/json" in accepted and media.endswith("+json")):
        return media
    shown = media[:80].encode("ascii", "backslashreplace").decode("ascii")
    raise ApiError(
        415,
        f"Content-Type {shown!r} is not accepted here: send {' or '.join(accepted)}",
        param="Content-Type",
        code="unsupported_media_type",
    )


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def dump(model: Any, **kw: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", **kw)


async def disconnected(request: Request) -> None:
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

    @staticmethod
    async def ping(emit: Callable[[str, dict], Awaitable[None]]) -> None:
        """An SSE comment line (``: ping``): keeps proxies (nginx's read timeout) from cutting a
        stream that waits in the queue; clients ignore it."""
        await emit("", {})

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
            if not name:  # a comment (EventStream.ping)
                chunk = b": ping\n\n"
            else:
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


def owner_of(key: str | None) -> str | None:
    """How a generation's record names the API key that created it (a hash: records live in Redis);
    None without authentication."""
    if key is None:
        return None
    return hashlib.sha256(b"argusdiff-owner\0" + key.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Api:
    """The parts of a :class:`~argusdiff.service.app.Service` the handlers use."""

    service: Service
    config: ServiceConfig
    router: Router
    dispatch: Dispatch
    metrics: ServiceMetrics
    limits: s.Limits
    levels: tuple[str, ...]  # the profile's level ids, best quality first
    keys: tuple[bytes, ...]  # API keys; empty: no authentication
    idem: IdempotentSubmit  # Idempotency-Key: a retry through any router gets the original result
    quotas: Quotas  # per-API-key rate limits and concurrent quotas ([quotas])

    @classmethod
    def of(cls, service: Service) -> Api:
        cfg = service.config
        router = service.router
        return cls(
            service=service,
            config=cfg,
            router=router,
            dispatch=service.dispatch,
            metrics=service.metrics,
            limits=router.limits,
            levels=tuple(router.profile.ids),
            keys=tuple(k.encode() for k in cfg.api_keys),
            idem=IdempotentSubmit(service),
            quotas=service.quotas,
        )

    async def owned_record(self, request: Request, gid: str) -> dict:
        """The record of generation ``gid`` when the caller's API key created it; 404 otherwise
        (unknown, expired, or another key's: the answer does not tell them apart)."""
        key = self.check_auth(request)
        record = await self.dispatch.get_record(gid) if len(gid) <= 64 else None
        if record is None or record.get("owner") != owner_of(key):
            raise ApiError(404, f"no generation {gid!r} (unknown or expired)", param="id", code="not_found")
        return record

    def check_auth(self, request: Request) -> str | None:
        """The caller's API key (401 when keys are set and it sent none or a wrong one); None
        without authentication."""
        if not self.keys:
            return None
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
        matched = [k for k in self.keys if hmac.compare_digest(supplied, k)]
        if not matched:
            raise ApiError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return matched[0].decode()

    def header_tier(self, request: Request) -> Tier | None:
        """The ``Argusdiff-Tier`` header: an argusdiff tier or an OpenAI ``service_tier`` value."""
        raw = request.headers.get(TIER_HEADER.lower())
        return None if raw is None else self.limits.tier(raw.strip(), TIER_HEADER)

    async def read_body(self, request: Request, limit: int | None = None) -> bytes:
        limit = self.config.max_body_bytes if limit is None else limit
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

    async def read_json(self, request: Request) -> Any:
        check_content_type(request, JSON_TYPES)
        raw = await self.read_within(request)
        if not raw.strip():
            raise ApiError(400, "the request body is empty: send a JSON object", code="invalid_body")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None

    async def read_within(self, request: Request, limit: int | None = None) -> bytes:
        """The body, within ``body_timeout_s`` (408) and ``limit`` bytes (413; default
        ``max_body_bytes``); ClientGone when the client leaves meanwhile."""
        cfg = self.config
        try:
            async with asyncio.timeout(cfg.body_timeout_s):
                return await self.read_body(request, limit)
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {cfg.body_timeout_s:g} s",
                code="body_timeout",
                headers={"Connection": "close"},
            ) from None
        except ClientDisconnect:
            raise ClientGone from None

    def endpoint(self, name: str, handler: Handler) -> Handler:
        """``handler`` with its errors as JSON bodies and every response counted under ``name``. A
        :class:`QueueUnavailable` that reaches here (a read of a record or a result while Redis is
        down; an enqueue's is answered by the router) is the 503 of a queue that is down."""
        metrics = self.metrics

        async def wrapped(request: Request) -> Response:
            try:
                response = await handler(request)
            except ApiError as exc:
                response = error_response(exc)
            except QueueUnavailable as exc:  # a read Redis did not answer: nothing accepted or lost here
                log.warning("%s: the work queue is unavailable: %s", name, exc)
                busy = self.busy("the work queue (redis) is unavailable; retry shortly", "queue_unavailable")
                response = error_response(busy)
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

    def base_url(self, request: Request) -> str:
        """``public_url``, else the address this connection reached (the socket's, not ``Host``)."""
        cfg = self.config
        if cfg.public_url:
            return cfg.public_url.rstrip("/")
        host, port = request.scope.get("server") or (cfg.host, cfg.port)
        if ":" in str(host):
            host = f"[{host}]"
        scheme = request.scope.get("scheme", "http")
        default = {"http": 80, "https": 443}.get(scheme)
        return f"{scheme}://{host}" + ("" if port == default else f":{port}")

    def busy(self, message: str, code: str) -> ApiError:
        """A 503 to retry (``Retry-After``)."""
        return ApiError(
            503, message, type="server_busy", code=code, headers={"Retry-After": str(self.config.retry_after_s)}
        )
