"""A generation's work, as the handlers see it: submit it (after a fast readiness check), wait for
its results while watching the connection, cancel it when the client goes away, and the errors its
results or its wait end in."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

from starlette.requests import Request

from argusdiff.service import schemas as s
from argusdiff.service.errors import ApiError, WorkLost
from argusdiff.service.handlers.base import Api, ClientGone, disconnected, owner_of
from argusdiff.service.router import Submission
from workers.cancel import CANCELLED
from workers.messages import WorkResult
from workers.safety import FILTERED

__all__ = [
    "cancel",
    "cancel_images",
    "cancelled",
    "check_results",
    "filtered",
    "lost",
    "submit",
    "timed_out",
    "wait_for",
]

log = logging.getLogger("argusdiff.api")


def check_serving(api: Api) -> None:
    """Fast 503 while no worker serves a level (instead of a wait to request_timeout_s)."""
    router, service = api.router, api.service
    if router.closing or router.plan is None or service.serving:
        return  # the router's own checks answer the first two
    raise api.busy(f"no worker is ready: {service.not_serving_reason()}; retry later", "no_worker_ready")


async def submit(api: Api, request: Request, spec: s.GenerationSpec, endpoint: str, key: str | None) -> Submission:
    """Route ``spec`` for the caller with API key ``key``: its quotas first (429 over a limit),
    then the router (through the Idempotency-Key layer). The generation holds the caller's
    concurrent slot until every image of it is done."""
    check_serving(api)
    spec = dataclasses.replace(spec, owner=owner_of(key))
    lease = await api.quotas.admit(key, spec.n, uuid.uuid4().hex)
    try:
        sub = await api.idem.submit(request, spec, endpoint)  # router.submit unless an Idempotency-Key came
    except BaseException:
        await asyncio.shield(lease.release())
        raise
    api.router.hold(sub, lease)
    return sub


async def cancel(api: Api, sub: Submission) -> None:
    """The client went away: its images are cancelled (taken out of the queue, or stopped where
    they run), unless it sent an Idempotency-Key (its retry will come for the result)."""
    if api.idem.keyed(sub):
        api.dispatch.detach(list(sub.request_ids))
        return
    removed, stopped = await cancel_images(api, list(sub.request_ids), "disconnect")
    log.info("generation %s: client gone; %d of %d images taken out of the queue, %d stopped where they run",
             sub.id, len(removed), len(sub.request_ids), len(stopped))  # fmt: skip


async def cancel_images(api: Api, request_ids: list[str], how: str) -> tuple[list[str], list[str]]:
    """Cancel images (``how``: ``delete`` or ``disconnect``), counted in ``argusdiff_cancels``."""
    removed, stopped = await api.dispatch.cancel(request_ids)
    if removed:
        api.metrics.cancels.labels(how, "queued").inc(len(removed))
    if stopped:
        api.metrics.cancels.labels(how, "running").inc(len(stopped))
    return removed, stopped


async def wait_for(api: Api, request: Request, sub: Submission) -> list[WorkResult]:
    """The results, or ClientGone (the work is cancelled); TimeoutError, WorkLost, ShuttingDown."""
    waiter = asyncio.ensure_future(api.idem.wait(sub, api.config.request_timeout_s))
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if waiter.done():
        return waiter.result()
    waiter.cancel()
    await cancel(api, sub)
    raise ClientGone


def filtered(sub_id: str, index: int) -> ApiError:
    """The 400 of an image the safety checker flagged (it is never returned)."""
    return ApiError(
        400,
        f"generation {sub_id}: image {index} was flagged by the safety checker and is not returned; "
        "change the prompt (or ask for moderation 'low')",
        code="content_policy_violation",
    )


def cancelled(sub_id: str) -> ApiError:
    """The 409 of a wait whose generation was cancelled (``DELETE``) meanwhile."""
    return ApiError(409, f"generation {sub_id} was cancelled", param="id", code="generation_cancelled")


def timed_out(api: Api, sub_id: str) -> ApiError:
    """The 504 of a wait that reached ``request_timeout_s`` (the work stays queued)."""
    return ApiError(
        504,
        f"generation {sub_id} did not finish within {api.config.request_timeout_s:g} s; it stays queued: "
        f"GET /v1/argusdiff/generations/{sub_id}",
        type="timeout",
        code="timeout",
    )


def lost(api: Api, sub_id: str, exc: Exception) -> ApiError:
    if isinstance(exc, WorkLost):
        return api.busy(f"generation {sub_id}: {exc}", "work_lost")
    if api.dispatch.mode == "redis":
        what = f"it stays queued: poll GET /v1/argusdiff/generations/{sub_id} on another instance"
    else:
        what = "it ran in this process only: retry against another instance"
    return api.busy(f"the service is shutting down before generation {sub_id} finished; {what}", "shutting_down")


def check_results(api: Api, sub_id: str, results: list[WorkResult]) -> None:
    for i, res in enumerate(results):
        if not res.ok:
            kind = res.error_type or "error"
            if kind == CANCELLED:  # DELETE of the generation while this client waited for it
                raise cancelled(sub_id)
            if kind == FILTERED:
                raise filtered(sub_id, i)
            if kind == "Dropped":  # the policy dropped it after the light stage (cascade)
                raise ApiError(
                    429,
                    f"generation {sub_id}: image {i} was dropped: {res.error}; retry later",
                    type="server_busy",
                    code="overloaded",
                    headers={"Retry-After": str(api.config.retry_after_s)},
                )
            raise ApiError(
                500,
                f"generation {sub_id}: image {i} failed at level {res.level} ({kind})",
                type="server_error",
                code="generation_failed",
            )
