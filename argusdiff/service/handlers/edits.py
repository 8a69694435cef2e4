"""``POST /v1/images/edits``: OpenAI's image edit, a multipart form (``image``, optional ``mask``,
``prompt``, ``n``, ``size``, ``response_format`` and the other generation fields), validated as
strictly as a generation and served as img2img or inpainting on the level the router picks
(:mod:`argusdiff.service.edits`, :mod:`workers.edits`)."""

from __future__ import annotations

from functools import partial

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from argusdiff.service import schemas as s
from argusdiff.service.errors import ApiError
from argusdiff.service.handlers.base import Api, check_content_type
from argusdiff.service.handlers.generations import openai_images
from argusdiff.service.handlers.work import submit

__all__ = ["routes"]

FILES = ("image", "mask")
MAX_FIELDS = 32


async def read_form(api: Api, request: Request) -> tuple[dict[str, str], dict[str, bytes]]:
    """The form's text fields and files (each name once: 400 naming a repeated one)."""
    from python_multipart.exceptions import MultipartParseError
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    check_content_type(request, ("multipart/form-data",))
    cfg = api.config
    limit = 2 * cfg.max_image_bytes + cfg.max_body_bytes
    request._body = await api.read_within(request, limit)
    try:
        form = await request.form(max_files=len(FILES), max_fields=MAX_FIELDS, max_part_size=cfg.max_body_bytes)
    except (MultiPartException, MultipartParseError, ValueError, HTTPException) as exc:
        why = getattr(exc, "detail", None) or getattr(exc, "message", None) or str(exc)
        raise ApiError(400, f"the request body is not a valid multipart form: {why}", code="invalid_body") from None
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for name, value in form.multi_items():
        key = "image" if name == "image[]" else name
        if key in fields or key in files:
            what = "one image: this deployment edits a single image" if key == "image" else "once"
            raise ApiError(400, f"'{key}' is given more than once; send {what}", param=key, code="invalid_value")
        if isinstance(value, UploadFile):
            if key not in FILES:
                raise ApiError(400, f"'{key}' is a file; only {', '.join(FILES)} are", param=key, code="invalid_value")
            data = await value.read()
            if len(data) > cfg.max_image_bytes:
                raise ApiError(413, f"'{key}' is larger than {cfg.max_image_bytes} bytes", param=key,
                               code="body_too_large")  # fmt: skip
            files[key] = data
        elif key in FILES:
            raise ApiError(400, f"'{key}' must be a file (multipart part with a filename)", param=key,
                           code="invalid_value")  # fmt: skip
        else:
            fields[key] = value
    if "image" not in files:
        raise ApiError(400, "'image' is required: the image file to edit", param="image",
                       code="missing_required_parameter")  # fmt: skip
    return fields, files


async def openai_edit(api: Api, request: Request) -> Response:
    key = api.check_auth(request)
    fields, files = await read_form(api, request)
    spec = s.parse_edit(fields, files["image"], files.get("mask"), api.limits, api.header_tier(request))
    sub = await submit(api, request, spec, "edits", key)
    return await openai_images(api, request, sub, spec)


def routes(api: Api) -> list[Route]:
    return [Route("/v1/images/edits", api.endpoint("images_edits", partial(openai_edit, api)), methods=["POST"])]
