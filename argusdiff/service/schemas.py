"""Validation of request bodies: OpenAI's Images API and the native generation endpoint.

Every rejection is an :class:`~argusdiff.service.errors.ApiError` with status 400 that names the
offending field in ``param``; nothing here can raise anything else on any JSON value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from argusdiff.domain import Tier
from argusdiff.service.errors import ApiError

__all__ = ["GenerationSpec", "Limits", "parse_native", "parse_openai"]

OPENAI_FIELDS = ("prompt", "model", "n", "size", "quality", "response_format", "user", "style")
NATIVE_FIELDS = (
    "prompt",
    "model",
    "n",
    "size",
    "response_format",
    "user",
    "seed",
    "slo_s",
    "tier",
    "min_quality_level",
    "wait",
)
QUALITIES = ("auto", "standard", "hd", "low", "medium", "high")
BEST_QUALITIES = ("hd", "high")
STYLES = ("vivid", "natural")
RESPONSE_FORMATS = ("url", "b64_json")
MAX_SEED = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Limits:
    """What this deployment accepts."""

    models: tuple[str, ...]  # accepted `model` values
    levels: tuple[str, ...]  # level ids, best first
    sizes: tuple[str, ...]
    max_n: int
    max_prompt_chars: int
    max_slo_s: float


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """A validated generation request (one or more images of one prompt)."""

    prompt: str
    n: int = 1
    size: str = "512x512"
    response_format: str = "url"
    user: str | None = None
    tier: Tier = Tier.STANDARD
    slo_s: float | None = None
    min_quality_level: str | None = None
    seed: int | None = None
    wait: bool = True


def _bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _object(body: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_body")
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise _bad(
            f"unrecognized request argument supplied: {unknown[0]} (accepted: {', '.join(allowed)})",
            unknown[0],
            "unknown_parameter",
        )
    return body


def _str(body: dict, name: str, *, required: bool = False, max_len: int = 256) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise _bad(f"'{name}' is required", name, "missing_required_parameter")
        return None
    if not isinstance(value, str):
        raise _bad(f"'{name}' must be a string, got {type(value).__name__}", name, "invalid_type")
    if len(value) > max_len:
        raise _bad(f"'{name}' is too long: {len(value)} characters, at most {max_len}", name, "string_above_max_length")
    return value


def _choice(body: dict, name: str, choices: tuple[str, ...], default: str | None) -> str | None:
    value = _str(body, name)
    if value is None:
        return default
    if value not in choices:
        raise _bad(f"'{name}' must be one of {', '.join(choices)}; got {value!r}", name)
    return value


def _int(body: dict, name: str, lo: int, hi: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {type(value).__name__}", name, "invalid_type")
    if not lo <= value <= hi:
        raise _bad(f"'{name}' must be between {lo} and {hi}; got {value}", name)
    return value


def _common(body: dict, limits: Limits, default_format: str) -> dict:
    prompt = _str(body, "prompt", required=True, max_len=limits.max_prompt_chars)
    assert prompt is not None
    if not prompt.strip():
        raise _bad("'prompt' must not be empty", "prompt", "empty_prompt")
    if "\x00" in prompt:
        raise _bad("'prompt' must not contain NUL characters", "prompt")
    model = _str(body, "model")
    if model is not None and model not in limits.models:
        raise _bad(
            f"the model {model!r} does not exist on this deployment; use one of {', '.join(limits.models)}",
            "model",
            "model_not_found",
        )
    n = _int(body, "n", 1, limits.max_n, 1)
    size = _str(body, "size") or "auto"
    if size == "auto":
        size = limits.sizes[0]
    elif size not in limits.sizes:
        raise _bad(f"'size' must be one of {', '.join(('auto', *limits.sizes))}; got {size!r}", "size")
    fmt = _choice(body, "response_format", RESPONSE_FORMATS, default_format)
    user = _str(body, "user", max_len=256)
    return {"prompt": prompt, "n": n, "size": size, "response_format": fmt, "user": user}


def parse_openai(body: Any, limits: Limits) -> GenerationSpec:
    """``POST /v1/images/generations``: OpenAI's fields; ``quality`` hd/high asks for the best level."""
    body = _object(body, OPENAI_FIELDS)
    common = _common(body, limits, "url")
    quality = _choice(body, "quality", QUALITIES, "auto")
    _choice(body, "style", STYLES, None)
    min_level = limits.levels[0] if quality in BEST_QUALITIES else None
    return GenerationSpec(**common, min_quality_level=min_level)


def parse_native(body: Any, limits: Limits) -> GenerationSpec:
    """``POST /v1/argusdiff/generations``: adds seed, SLO, tier, minimum quality level and ``wait``."""
    body = _object(body, NATIVE_FIELDS)
    common = _common(body, limits, "b64_json")
    seed = _int(body, "seed", 0, MAX_SEED, None)
    slo = body.get("slo_s")
    if slo is not None:
        if isinstance(slo, bool) or not isinstance(slo, int | float):
            raise _bad(f"'slo_s' must be a number of seconds, got {type(slo).__name__}", "slo_s", "invalid_type")
        if not math.isfinite(slo) or not 0 < slo <= limits.max_slo_s:
            raise _bad(f"'slo_s' must be > 0 and <= {limits.max_slo_s:g} seconds; got {slo!r}", "slo_s")
        slo = float(slo)
    tier = _choice(body, "tier", tuple(t.value for t in Tier), Tier.STANDARD.value)
    level = _str(body, "min_quality_level")
    if level is not None and level not in limits.levels:
        raise _bad(
            f"'min_quality_level' must be a level of this deployment ({', '.join(limits.levels)}); got {level!r}",
            "min_quality_level",
        )
    wait = body.get("wait", True)
    if not isinstance(wait, bool):
        raise _bad(f"'wait' must be true or false, got {type(wait).__name__}", "wait", "invalid_type")
    return GenerationSpec(**common, tier=Tier(tier), slo_s=slo, min_quality_level=level, seed=seed, wait=wait)
