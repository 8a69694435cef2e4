"""Image generation: ``POST /v1/images/generations`` (OpenAI's Images API, streamed with
``"stream": true``) and ``POST /v1/argusdiff/generations`` (the native body with each image's
routing facts; ``"wait": false`` answers 202 at once)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.errors import ShuttingDown, WorkLost
from argusdiff.service.handlers.base import Api, EventStream, dump
from argusdiff.service.handlers.results import accepted, image_entry, native_body, served_quality
from argusdiff.service.handlers.streaming import stream_run
from argusdiff.service.handlers.work import check_results, lost, submit, timed_out, wait_for
from argusdiff.service.router import Submission

__all__ = ["openai_images", "routes"]


async def openai_generate(api: Api, request: Request) -> Response:
    key = api.check_auth(request)
    spec = s.parse_openai(await api.read_json(request), api.limits, api.header_tier(request))
    sub = await submit(api, request, spec, "images", key)
    if spec.stream:
        await api.idem.prime_stream(sub)  # a retried stream: the result it already has comes at once
        return EventStream(stream_run(api, sub, spec))
    return await openai_images(api, request, sub, spec)


async def openai_images(api: Api, request: Request, sub: Submission, spec: s.GenerationSpec) -> Response:
    """The OpenAI images response of ``sub`` (generations and edits): wait, then the images."""
    try:
        results = await wait_for(api, request, sub)
    except TimeoutError:
        raise timed_out(api, sub.id) from None
    except (WorkLost, ShuttingDown) as exc:
        raise lost(api, sub.id, exc) from None
    check_results(api, sub.id, results)
    record = sub.record()
    body = s.ImagesResponse(
        created=sub.created,
        data=[s.Image(**await image_entry(api, r, record, request)) for r in results],
        size=spec.size,
        quality=served_quality(api, results),
        output_format=spec.output_format,
        background="opaque",
    )
    headers = {"Argusdiff-Unhonoured": ", ".join(spec.unhonoured)} if spec.unhonoured else None
    return JSONResponse(dump(body, exclude_none=True), headers=headers)


async def native_generate(api: Api, request: Request) -> Response:
    key = api.check_auth(request)
    spec = s.parse_native(await api.read_json(request), api.limits, api.header_tier(request))
    sub = await submit(api, request, spec, "native", key)
    record = sub.record()
    if not spec.wait:
        return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
    try:
        results = await wait_for(api, request, sub)
    except TimeoutError:
        return accepted(sub.id, sub.created, 0, spec.n, list(sub.levels))
    except (WorkLost, ShuttingDown) as exc:
        raise lost(api, sub.id, exc) from None
    check_results(api, sub.id, results)
    headers = {"Argusdiff-Unhonoured": ", ".join(spec.unhonoured)} if spec.unhonoured else None
    return JSONResponse(await native_body(api, sub.id, record, results, request), headers=headers)


def routes(api: Api) -> list[Route]:
    return [
        Route(
            "/v1/images/generations",
            api.endpoint("images_generations", partial(openai_generate, api)),
            methods=["POST"],
        ),
        Route(
            "/v1/argusdiff/generations", api.endpoint("generations", partial(native_generate, api)), methods=["POST"]
        ),
    ]
