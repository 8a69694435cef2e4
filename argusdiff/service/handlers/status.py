"""What the service runs, for authenticated clients: ``GET /v1/models`` (the levels' model ids, in
OpenAI's shape), ``GET /v1/plan`` (the live plan, workers, cache health, load in flight, classifier
and control loop) and ``GET /v1/cluster`` (every router and worker of the deployment)."""

from __future__ import annotations

import asyncio
from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.cluster import service_status
from argusdiff.service.handlers.base import Api, dump
from argusdiff.service.plans import plan_to_dict

__all__ = ["routes"]


async def models(api: Api, request: Request) -> Response:
    api.check_auth(request)
    return JSONResponse(dump(s.ModelList(data=[s.ModelEntry(id=m) for m in api.limits.models])))


async def plan_endpoint(api: Api, request: Request) -> Response:
    api.check_auth(request)
    router, service = api.router, api.service
    plan = router.plan
    if plan is None:
        raise api.busy("no plan yet: the control loop has not run", "not_ready")
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
    body["affinity"] = _affinity(service.policy, plan.levels)
    # profiled and measured seconds per image by level (argusdiff.latency); the plan's
    # ``latency_scale`` is what it was made with
    body["latencies"] = router.latencies()
    body["classifier"] = service.classifier_status()
    body["control"] = {
        "period_s": service.control.period_s,
        "ticks": service.control.ticks,
        "requeued": service.control.requeued,
        "migrated": service.control.migrated,
        "last_error": service.control.last_error,
    }
    return JSONResponse(body)


def _affinity(policy: object, levels: tuple[str, ...]) -> dict[str, float] | None:
    """H: the shares of recent prompts by optimal level, from the policy's affinity histogram over
    the plan's levels (None for a policy that keeps none)."""
    for hist in getattr(policy, "histograms", {}).values():
        if tuple(hist.level_ids) == tuple(levels):
            return dict(zip(levels, hist.shares(), strict=True))
    return None


async def cluster_endpoint(api: Api, request: Request) -> Response:
    api.check_auth(request)
    return JSONResponse(await asyncio.to_thread(service_status, api.service))


def routes(api: Api) -> list[Route]:
    return [
        Route("/v1/models", api.endpoint("models", partial(models, api)), methods=["GET"]),
        Route("/v1/plan", api.endpoint("plan", partial(plan_endpoint, api)), methods=["GET"]),
        Route("/v1/cluster", api.endpoint("cluster", partial(cluster_endpoint, api)), methods=["GET"]),
    ]
