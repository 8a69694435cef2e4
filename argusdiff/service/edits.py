"""The input images of ``POST /v1/images/edits``: decoded, checked and made ready for a worker.

OpenAI's rules, as strictly as generations' fields: ``image`` is one PNG, JPEG or WebP file of at
most ``[service] max_image_bytes``, at most :data:`MAX_SIDE` pixels a side; ``mask`` (optional) a
PNG with an alpha channel and the image's dimensions, whose fully transparent pixels (alpha 0) are
where the image is edited. Without a mask, an image with fully transparent pixels is its own mask
(DALL-E 2's convention); one without any is edited whole (img2img). The image is resized to the
size the request is served at and sent to the worker as PNG, the mask as a PNG that is white where
the image is repainted. Every rejection is a 400 naming the field. Pillow only (no torch).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from argusdiff.service.errors import ApiError

__all__ = ["MAX_SIDE", "EditInput", "prepare_edit"]

#: the longest side of an input image (pixels); larger ones are refused before they are decoded
MAX_SIDE = 4096


@dataclass(frozen=True, slots=True)
class EditInput:
    """What a worker needs: the image and mask as base64 PNG at the served size."""

    image_b64: str
    mask_b64: str | None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _open(data: bytes, param: str, formats: tuple[str, ...]):
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise _bad(f"'{param}' is empty: send an image file", param)
    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError):
        raise _bad(f"'{param}' is not an image file ({', '.join(formats)})", param) from None
    if img.format not in formats:
        raise _bad(f"'{param}' is a {img.format} image; send {', '.join(formats)}", param)
    w, h = img.size
    if w < 1 or h < 1 or max(w, h) > MAX_SIDE:
        raise _bad(f"'{param}' is {w}x{h} pixels; at most {MAX_SIDE} a side", param)
    try:
        img.load()
    except (OSError, ValueError, Image.DecompressionBombError):
        raise _bad(f"'{param}' cannot be decoded (a truncated or corrupt file)", param) from None
    return img


def _png(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _alpha(img):
    """The image's alpha channel (None: it has none)."""
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        return img.convert("RGBA").getchannel("A")
    return None


def prepare_edit(image: bytes, mask: bytes | None, size: str) -> EditInput:
    """The checked ``image`` and ``mask`` (file bytes) for a request served at ``size`` (``WxH``)."""
    from PIL import Image

    img = _open(image, "image", ("PNG", "JPEG", "WEBP"))
    w, h = (int(x) for x in size.split("x"))
    alpha = None
    if mask is not None:
        m = _open(mask, "mask", ("PNG",))
        if m.size != img.size:
            raise _bad(f"'mask' is {m.size[0]}x{m.size[1]}; it must have the image's dimensions "
                       f"{img.size[0]}x{img.size[1]}", "mask")  # fmt: skip
        alpha = _alpha(m)
        if alpha is None:
            raise _bad("'mask' has no alpha channel: its fully transparent pixels mark where to edit", "mask")
        if alpha.getextrema()[0] != 0:
            raise _bad("'mask' has no fully transparent pixel: nothing to edit", "mask")
    else:
        own = _alpha(img)
        if own is not None and own.getextrema()[0] == 0:
            alpha = own  # DALL-E 2: the image's transparent area is its mask
    rgb = img.convert("RGB").resize((w, h), Image.Resampling.LANCZOS)
    if alpha is None:
        return EditInput(_png(rgb), None)
    repaint = alpha.point(lambda a: 255 if a == 0 else 0).resize((w, h), Image.Resampling.NEAREST)
    return EditInput(_png(rgb), _png(repaint))
