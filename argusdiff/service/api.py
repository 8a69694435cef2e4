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

The handlers live in :mod:`argusdiff.service.handlers`, one module per group of endpoints;
this module assembles their routes, the fallback error handlers and the lifespan.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from argusdiff import tracing
from argusdiff.service.app import Service
from argusdiff.service.errors import error_body
from argusdiff.service.handlers import edits, generations, health, results, status, ui
from argusdiff.service.handlers.base import Api

__all__ = ["create_app", "make_server"]

log = logging.getLogger("argusdiff.api")


def create_app(service: Service, *, manage_lifecycle: bool = True) -> Starlette:
    """The ASGI app of ``service``. With ``manage_lifecycle`` the app's lifespan starts and stops
    the service."""
    api = Api.of(service)
    metrics = api.metrics

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

    # the order of the routes is the order of the OpenAPI document's operations
    routes = [
        *generations.routes(api),
        *edits.routes(api),
        *results.routes(api),
        *status.routes(api),
        *health.routes(api),
        *ui.routes(api),
    ]
    return _App(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )


class _App(Starlette):
    """The app, with each HTTP request's ``X-Request-Id`` (the client's, or a new one) answered on
    every response, errors and streams included, and held in :data:`argusdiff.tracing.REQUEST_ID`
    while the request is handled; with tracing on, the request's span (continuing the client's
    ``traceparent``)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        rid = tracing.request_id_from(headers.get(b"x-request-id", b"").decode("latin-1"))
        raw_id = rid.encode("latin-1")

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", raw_id)]}
            await send(message)

        token = tracing.REQUEST_ID.set(rid)
        try:
            if tracing.enabled():
                parent = headers.get(b"traceparent", b"").decode("latin-1") or None
                name = f"{scope.get('method', 'GET')} {scope.get('path', '')}"
                with tracing.server_span(parent, name, **{"http.request_id": rid}):
                    await super().__call__(scope, receive, send_with_id)
            else:
                await super().__call__(scope, receive, send_with_id)
        finally:
            tracing.REQUEST_ID.reset(token)


def make_server(service: Service, *, host: str, port: int, log_level: str = "info", **options: Any) -> Any:
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

    trusted = ",".join(cfg.trusted_proxies)
    config = uvicorn.Config(
        create_app(service),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=int(cfg.drain_timeout_s) + 5,
        http=header_timeout_protocol(cfg.header_timeout_s),
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
        **options,
    )
    return Server(config)


def header_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's h11 protocol that closes a connection whose request headers are not complete
    ``timeout_s`` after it opened or after its previous response (uvicorn waits forever for them,
    so half-open connections pile up: slowloris)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._arm()
            super().data_received(data)
            if not self._between_requests() or self.conn.our_state is h11.MUST_CLOSE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # the keep-alive timeout takes over until the next request's first byte

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
