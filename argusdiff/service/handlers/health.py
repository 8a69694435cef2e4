"""The open endpoints, for probes and scrapers (no API key): ``/healthz`` (the process answers),
``/readyz`` (503 with ``Retry-After`` until a plan has a serving worker and the queue answers),
``/metrics`` (Prometheus) and ``/openapi.json``."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.handlers.base import Api, dump
from argusdiff.service.metrics import CONTENT_TYPE_LATEST
from argusdiff.service.openapi import openapi_document

__all__ = ["routes"]


async def healthz(api: Api, request: Request) -> Response:
    return JSONResponse(dump(s.Health()))


async def readyz(api: Api, request: Request) -> Response:
    service, dispatch = api.service, api.dispatch
    ready, reason = service.readiness()
    plan = api.router.plan
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
        return JSONResponse(dump(body))
    return JSONResponse(dump(body), status_code=503, headers={"Retry-After": str(api.config.retry_after_s)})


async def metrics_endpoint(api: Api, request: Request) -> Response:
    metrics, dispatch = api.metrics, api.dispatch
    health = api.router.cache_health
    metrics.cache_hit_ratio.set(health.hit_ratio())
    metrics.result_memory.set(dispatch.results.bytes)
    metrics.results_evicted.set(dispatch.results.evicted)
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def openapi_endpoint(document: dict[str, Any], request: Request) -> Response:
    return JSONResponse(document)


def routes(api: Api) -> list[Route]:
    document = openapi_document(api.limits, auth=bool(api.keys))
    return [
        Route("/healthz", api.endpoint("healthz", partial(healthz, api)), methods=["GET"]),
        # the vLLM / TGI name of the same probe
        Route("/health", api.endpoint("health", partial(healthz, api)), methods=["GET"]),
        Route("/readyz", api.endpoint("readyz", partial(readyz, api)), methods=["GET"]),
        Route("/metrics", api.endpoint("metrics", partial(metrics_endpoint, api)), methods=["GET"]),
        Route("/openapi.json", api.endpoint("openapi", partial(openapi_endpoint, document)), methods=["GET"]),
    ]
