"""The REST API's request and response models (pydantic): one source for validation and for
``/openapi.json`` (:mod:`argusdiff.service.openapi` renders these very models).

Request models are built per deployment (:func:`request_models`), because their bounds are the
deployment's: the accepted model names (``model_name``, the profile name and the aliases), the
served sizes and the common sizes mapped onto them, the level ids, ``max_n``, the prompt length
and the largest SLO. Validation turns every rejection into an
:class:`~argusdiff.service.errors.ApiError` 400 that names the field in ``param``; nothing here
raises anything else on any JSON value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    create_model,
)
from pydantic_core import PydanticCustomError

from argusdiff.domain import Tier
from argusdiff.service.errors import ApiError

__all__ = [
    "OPENAI_SIZES",
    "ErrorResponse",
    "GenerationAccepted",
    "GenerationCancelled",
    "GenerationSpec",
    "Image",
    "ImageEditRequest",
    "ImagesResponse",
    "Limits",
    "NativeGeneration",
    "NativeImage",
    "edit_model",
    "parse_edit",
    "parse_native",
    "parse_openai",
    "prompt_problem",
    "request_models",
    "size_table",
]

MAX_SEED = 2**32 - 1
#: The sizes OpenAI's Images API and SDKs use (DALL-E 2/3 and GPT image models).
OPENAI_SIZES = ("256x256", "512x512", "1024x1024", "1792x1024", "1024x1792", "1536x1024", "1024x1536")
#: OpenAI ``service_tier`` values and the argusdiff tier each means by default ([service] service_tiers)
DEFAULT_SERVICE_TIERS = {
    "auto": Tier.STANDARD.value,
    "default": Tier.STANDARD.value,
    "flex": Tier.BATCH.value,
    "priority": Tier.INTERACTIVE.value,
    "scale": Tier.INTERACTIVE.value,
}
#: ``quality`` values that ask for the best level (no approximation).
BEST_QUALITIES = ("hd", "high")

Quality = Literal["auto", "standard", "hd", "low", "medium", "high"]
OutputFormat = Literal["png", "jpeg", "webp"]
Background = Literal["transparent", "opaque", "auto"]


# -- what the deployment accepts ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What this deployment accepts."""

    models: tuple[str, ...]  # accepted `model` values (model_name, profile name, aliases)
    levels: tuple[str, ...]  # level ids, best first
    sizes: tuple[str, ...]  # served sizes (WxH), the native one first
    max_n: int
    max_prompt_chars: int
    max_slo_s: float
    size_map: tuple[tuple[str, str], ...] = ()  # (requested, served): common sizes mapped onto served ones
    # OpenAI ``service_tier`` values -> argusdiff tiers ([service] service_tiers)
    service_tiers: tuple[tuple[str, str], ...] = tuple(DEFAULT_SERVICE_TIERS.items())
    moderation: bool = False  # a safety checker runs on the workers ([safety] checker): `moderation` is honoured
    # LoRA adapters the profile declares: (name, least scale, largest scale) over its models
    adapters: tuple[tuple[str, float, float], ...] = ()

    @classmethod
    def of(
        cls,
        config: Any,
        model: str,
        levels: tuple[str, ...],
        sizes: tuple[str, ...],
        *,
        moderation: bool = False,
        adapters: Any = (),
    ) -> Limits:
        """A deployment's limits from its ``[service]`` settings, profile name, level ids and sizes."""
        return cls(
            models=tuple(dict.fromkeys((config.model_name, model, *config.model_aliases))),
            levels=levels,
            sizes=sizes,
            max_n=config.max_n,
            max_prompt_chars=config.max_prompt_chars,
            max_slo_s=config.max_slo_s,
            size_map=size_table(sizes, map_sizes=config.map_sizes),
            service_tiers=tuple(sorted(dict(getattr(config, "service_tiers", DEFAULT_SERVICE_TIERS)).items())),
            moderation=moderation,
            adapters=adapter_ranges(adapters),
        )

    def adapter(self, ref: Any) -> tuple[str, float | None] | None:
        """A request's ``lora`` (a name, or ``{"name", "scale"}``) checked against the profile's
        adapters: (name, scale or None for each model's default); 400 naming ``lora`` otherwise."""
        if ref is None:
            return None
        name, scale = (ref, None) if isinstance(ref, str) else (ref.name, ref.scale)
        known = {n: (lo, hi) for n, lo, hi in self.adapters}
        if name not in known:
            shown = repr(name[:80]).replace("{", "(").replace("}", ")")
            offered = ", ".join(sorted(known)) or "none (the profile declares no [[adapters]])"
            raise ApiError(400, f"'lora': adapter {shown} is not served here; adapters: {offered}", param="lora",
                           code="adapter_not_found")  # fmt: skip
        lo, hi = known[name]
        if scale is not None and not lo <= scale <= hi:
            raise ApiError(400, f"'lora': scale {scale:g} of adapter {name!r} is outside [{lo:g}, {hi:g}]",
                           param="lora", code="invalid_value")  # fmt: skip
        return name, scale

    def tier(self, value: str, param: str) -> Tier:
        """An argusdiff tier name, or an OpenAI ``service_tier`` value mapped to one (400 naming
        ``param`` otherwise)."""
        mapped = dict(self.service_tiers).get(value, value)
        if mapped in Tier._value2member_map_:
            return Tier(mapped)
        names = ", ".join(sorted({*(t.value for t in Tier), *dict(self.service_tiers)}))
        shown = repr(value[:40]).replace("{", "(").replace("}", ")")
        raise ApiError(400, f"'{param}': {shown} is not a tier here; use one of {names}", param=param,
                       code="invalid_value")  # fmt: skip

    @property
    def accepted_sizes(self) -> tuple[str, ...]:
        return ("auto", *self.sizes, *(s for s, _ in self.size_map if s not in self.sizes))

    def served_size(self, size: str | None) -> str:
        if size is None or size == "auto":
            return self.sizes[0]
        return size if size in self.sizes else dict(self.size_map)[size]


def adapter_ranges(adapters: Any) -> tuple[tuple[str, float, float], ...]:
    """(name, least scale, largest scale) per adapter name: the scales every model of it accepts."""
    ranges: dict[str, tuple[float, float]] = {}
    for a in adapters:
        lo, hi = ranges.get(a.name, (a.scale_min, a.scale_max))
        ranges[a.name] = (max(lo, a.scale_min), min(hi, a.scale_max))
    return tuple((n, lo, hi) for n, (lo, hi) in sorted(ranges.items()))


def _orientation(size: str) -> int:
    w, h = (int(x) for x in size.split("x"))
    return (w > h) - (w < h)


def size_table(served: tuple[str, ...], *, map_sizes: bool = True) -> tuple[tuple[str, str], ...]:
    """Each of OpenAI's sizes that is not served → the first served size of the same orientation
    (square, landscape, portrait); none when ``map_sizes`` is off or no served size matches."""
    if not map_sizes:
        return ()
    out = []
    for size in OPENAI_SIZES:
        same = [s for s in served if _orientation(s) == _orientation(size)]
        if size not in served and same:
            out.append((size, same[0]))
    return tuple(out)


# -- field types ---------------------------------------------------------------------------------


def _integral(value: Any) -> Any:
    """JSON numbers like ``2.0`` are integers; booleans are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _seconds(value: Any) -> Any:
    """A finite number of seconds; an integer too large for a float is out of range, not a crash."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value  # the strict float check reports the type
    try:
        return float(value)
    except OverflowError:
        raise PydanticCustomError("invalid_value", "the number is too large") from None


def prompt_problem(value: str, max_chars: int | None = None) -> tuple[str, str] | None:
    """What is wrong with a prompt, as ``(code, message)``, or None: the one rule of the API and the
    CLI (``argusdiff generate``): not empty or blank, no NUL, valid Unicode (no lone surrogate), at
    most ``max_chars`` characters."""
    if not value.strip():
        return "empty_prompt", "must not be empty or blank"
    if "\x00" in value:
        return "invalid_value", "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid_value", "is not valid Unicode text (it holds a lone surrogate)"
    if max_chars is not None and len(value) > max_chars:
        return "string_above_max_length", f"is too long: at most {max_chars} characters"
    return None


def _prompt(value: str) -> str:
    problem = prompt_problem(value)
    if problem is not None:
        raise PydanticCustomError(*problem)
    return value


def _int(lo: int, hi: int) -> Any:
    return Annotated[int, Ge(lo), Le(hi), BeforeValidator(_integral)]


def _seconds_up_to(hi: float | None) -> Any:
    bounds = (Gt(0),) if hi is None else (Gt(0), Le(hi))
    return Annotated[float, *bounds, BeforeValidator(_seconds)]


Text = Annotated[str, StringConstraints(max_length=256)]


def _choice(names: tuple[str, ...], code: str, what: str):
    def check(value: str) -> str:
        if value not in names:
            shown = repr(value[:80]).replace("{", "(").replace("}", ")")
            raise PydanticCustomError(code, f"{what} {shown} is not served here; use one of {', '.join(names)}")
        return value

    return Annotated[str, AfterValidator(check), WithJsonSchema({"type": "string", "enum": list(names)})]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class LoraRef(_Request):
    """A LoRA adapter of the profile (``[[adapters]]``) and, optionally, its scale."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    scale: Annotated[float, BeforeValidator(_seconds)] | None = None


Lora = Annotated[str, StringConstraints(min_length=1, max_length=128)] | LoraRef


class _Common(_Request):
    prompt: str
    model: str | None = None
    n: _int(1, 64) | None = 1  # type: ignore[valid-type]
    size: str | None = None
    response_format: Literal["url", "b64_json"] | None = None
    output_format: OutputFormat | None = Field(None, description="png (default), jpeg or webp")
    output_compression: _int(0, 100) | None = Field(None, description="0-100, for jpeg and webp (default 100)")
    user: Text | None = None
    lora: Lora | None = Field(None, description="a LoRA adapter of the profile: its name, or {name, scale}")


class OpenAIImageRequest(_Common):
    """``POST /v1/images/generations``: OpenAI's Images API fields (DALL-E 2/3 and GPT image)."""

    quality: Quality | None = Field(None, description="hd/high: the best level (no approximation)")
    style: Literal["vivid", "natural"] | None = Field(None, description="accepted, not applied (reported)")
    background: Background | None = Field(None, description="images are opaque; transparent is reported as opaque")
    moderation: Literal["low", "auto"] | None = Field(
        None, description="with a safety checker ([safety]): auto, or low (less restrictive); else reported unhonoured"
    )
    safety_identifier: Text | None = None
    stream: bool | None = Field(None, description="answer with server-sent events (one image: n = 1)")
    partial_images: _int(0, 3) | None = Field(
        None, description="partial images decoded from the intermediate latents while streaming"
    )
    service_tier: Text | None = Field(
        None, description="auto, default, flex, priority, scale ([service] service_tiers) or an argusdiff tier"
    )


class ImageEditRequest(_Common):
    """``POST /v1/images/edits`` (multipart form): OpenAI's edit fields besides the files ``image``
    and ``mask``; form values are text, numbers are read from it. ``strength`` is argusdiff's."""

    quality: Quality | None = Field(None, description="hd/high: the best level (no approximation)")
    background: Background | None = Field(None, description="images are opaque; transparent is reported as opaque")
    moderation: Literal["low", "auto"] | None = Field(
        None, description="with a safety checker ([safety]): auto, or low (less restrictive); else reported unhonoured"
    )
    input_fidelity: Literal["low", "high"] | None = Field(None, description="accepted, not applied (reported)")
    service_tier: Text | None = Field(None, description="as for generations")
    strength: Annotated[float, Gt(0), Le(1)] | None = Field(
        None, description="how much of the image is redone: 0.75 without a mask, 1 inside one"
    )


class NativeRequest(_Common):
    """``POST /v1/argusdiff/generations``: adds seed, SLO, tier, minimum quality level and ``wait``."""

    seed: _int(0, MAX_SEED) | None = None
    slo_s: _seconds_up_to(None) | None = None
    tier: Literal[tuple(t.value for t in Tier)] | None = None  # type: ignore[valid-type]
    min_quality_level: str | None = None
    wait: bool | None = True
    moderation: Literal["low", "auto"] | None = None


@cache
def request_models(limits: Limits) -> tuple[type[OpenAIImageRequest], type[NativeRequest]]:
    """The two request models with this deployment's bounds (cached per :class:`Limits`)."""
    common = _common_fields(limits)
    openai = create_model("ImageGenerationRequest", __base__=OpenAIImageRequest, **common)
    native = create_model(
        "GenerationRequest",
        __base__=NativeRequest,
        **common,
        slo_s=(_seconds_up_to(limits.max_slo_s) | None, None),
        min_quality_level=(_choice(limits.levels, "invalid_value", "the level") | None, None),
    )
    openai.__doc__ = OpenAIImageRequest.__doc__
    native.__doc__ = NativeRequest.__doc__
    return openai, native


def _common_fields(limits: Limits) -> dict[str, Any]:
    """The fields whose bounds are the deployment's: prompt, model, n, size."""
    prompt = (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=limits.max_prompt_chars),
            AfterValidator(_prompt),
            WithJsonSchema({"type": "string", "minLength": 1, "maxLength": limits.max_prompt_chars, "pattern": r"\S"}),
        ],
        ...,
    )
    return {
        "prompt": prompt,
        "model": (_choice(limits.models, "model_not_found", "the model") | None, None),
        "n": (_int(1, limits.max_n) | None, 1),
        "size": (_choice(limits.accepted_sizes, "invalid_value", "the size") | None, None),
    }


@cache
def edit_model(limits: Limits) -> type[ImageEditRequest]:
    """The edit form's text fields with this deployment's bounds (cached per :class:`Limits`)."""
    model = create_model("ImageEditRequest", __base__=ImageEditRequest, **_common_fields(limits))
    model.__doc__ = ImageEditRequest.__doc__
    return model


# -- the validated request -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """A validated generation request (one or more images of one prompt)."""

    prompt: str
    n: int = 1
    size: str = "512x512"  # the served size
    response_format: str = "url"
    user: str | None = None
    tier: Tier = Tier.STANDARD
    slo_s: float | None = None
    min_quality_level: str | None = None
    seed: int | None = None
    wait: bool = True
    output_format: str = "png"
    output_compression: int | None = None
    quality: str = "auto"  # as requested
    background: str = "auto"  # as requested
    stream: bool = False
    partial_images: int = 0
    unhonoured: tuple[str, ...] = ()  # "field=value" accepted but not applied
    moderation: str | None = None  # the safety checker's strictness (auto, low); None: no checker
    edit_image: str | None = None  # an edit: the input image (base64 PNG at the served size)
    edit_mask: str | None = None  # ... and where to repaint (base64 PNG, white = repaint)
    edit_strength: float | None = None
    lora: str | None = None  # a LoRA adapter of the profile
    lora_scale: float | None = None  # None: the adapter's own scale on each model
    owner: str | None = None  # who may read it: a hash of the caller's API key (None without keys)

    def item_meta(self) -> dict[str, str]:
        """What the workers need to know beyond the prompt: streaming and its partial images, the
        safety checker's strictness, and the format a worker stores the image in (Redis mode: the
        claim check, :mod:`argusdiff.service.images`)."""
        meta = {"moderation": self.moderation} if self.moderation is not None else {}
        if self.lora is not None:
            meta["lora"] = self.lora
            if self.lora_scale is not None:
                meta["lora_scale"] = f"{self.lora_scale:g}"
        if self.edit_image is not None:
            meta.update(edit_image=self.edit_image, edit_strength=f"{self.edit_strength or 0.75:g}")
            if self.edit_mask is not None:
                meta["edit_mask"] = self.edit_mask
        if self.stream:
            meta.update(stream="1", partial_images=str(self.partial_images))
        if self.output_format != "png":
            meta["output_format"] = self.output_format
            if self.output_compression is not None:
                meta["output_compression"] = str(int(self.output_compression))
        return meta

    def record_fields(self) -> dict[str, Any]:
        """What the router keeps with the request's record to deliver its images later."""
        fields = {"output_format": self.output_format, "output_compression": self.output_compression, "size": self.size}
        if self.owner is not None:
            fields["owner"] = self.owner
        return fields


def shown_key(key: str) -> str:
    """A JSON key as an error message can show it: a key holding a lone surrogate (``"\\ud800"``
    in the body) cannot be written as UTF-8, so it is shown with that character escaped."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key


def _message(err: dict[str, Any], model: type[BaseModel]) -> tuple[str | None, str, str]:
    """(param, message, code) of one pydantic error."""
    loc = err.get("loc") or ()
    param = shown_key(str(loc[0])) if loc else None
    kind = err.get("type", "")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return None, "the request body must be a JSON object", "invalid_body"
    if kind == "extra_forbidden":
        accepted = ", ".join(model.model_fields)
        return param, f"unrecognized request argument supplied: {param} (accepted: {accepted})", "unknown_parameter"
    if kind == "missing":
        return param, f"'{param}' is required", "missing_required_parameter"
    if kind == "string_unicode" and not loc and isinstance(err.get("input"), str):  # a key, not a value
        key = shown_key(err["input"])
        message = f"the request body has a key that is not valid Unicode text (it holds a lone surrogate): {key}"
        return key, message, "invalid_value"
    if kind == "string_unicode":
        return param, f"'{param}' is not valid Unicode text (it holds a lone surrogate)", "invalid_value"
    if kind == "string_too_long":
        limit = (err.get("ctx") or {}).get("max_length")
        return param, f"'{param}' is too long: at most {limit} characters", "string_above_max_length"
    if kind == "string_too_short":
        return param, f"'{param}' must not be empty", "empty_prompt"
    msg = str(err.get("msg", "invalid value"))
    if kind in ("model_not_found", "empty_prompt", "invalid_value"):  # ours: the message says it all
        return param, f"'{param}': {msg}", kind
    value = err.get("input")
    try:
        shown = repr(value)
    except ValueError:  # an integer too long to print
        shown = "a very long number"
    if len(shown) > 80:
        shown = shown[:77] + "..."
    code = "invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else "invalid_value"
    return param, f"'{param}': {msg[:1].lower()}{msg[1:]}; got {shown}", code


def _validate(model: type[BaseModel], body: Any) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        param, message, code = _message(errors[0], model)
        raise ApiError(400, message, param=param, code=code) from None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _lora(req: _Common, limits: Limits) -> dict[str, Any]:
    got = limits.adapter(req.lora)
    return {} if got is None else {"lora": got[0], "lora_scale": got[1]}


def _output(req: _Common) -> dict[str, Any]:
    fmt = req.output_format or "png"
    if req.output_compression is not None and fmt == "png":
        raise _bad("'output_compression' applies to jpeg and webp output only", "output_compression")
    return {"output_format": fmt, "output_compression": req.output_compression}


def parse_openai(body: Any, limits: Limits, header_tier: Tier | None = None) -> GenerationSpec:
    """``POST /v1/images/generations``: OpenAI's fields. ``quality`` hd/high asks for the best
    level; ``background`` transparent, ``style`` and ``moderation`` are accepted and reported
    (``unhonoured``); ``stream`` answers with server-sent events."""
    req: Any = _validate(request_models(limits)[0], body)
    stream = bool(req.stream)
    if stream and (req.n or 1) != 1:
        raise _bad("a streamed generation returns one image: 'n' must be 1", "n")
    if stream and req.response_format == "url":
        raise _bad("a stream carries the images as b64_json events; 'response_format' url cannot stream",
                   "response_format")  # fmt: skip
    quality = req.quality or "auto"
    unhonoured = []
    if req.background == "transparent":
        unhonoured.append("background=transparent")
    if req.style is not None:
        unhonoured.append(f"style={req.style}")
    if req.moderation is not None and not limits.moderation:
        unhonoured.append(f"moderation={req.moderation}")
    if req.partial_images and not stream:
        unhonoured.append(f"partial_images={req.partial_images}")
    tier = limits.tier(req.service_tier, "service_tier") if req.service_tier is not None else header_tier
    return GenerationSpec(
        **_lora(req, limits),
        prompt=req.prompt,
        n=req.n or 1,
        size=limits.served_size(req.size),
        response_format=req.response_format or ("b64_json" if stream else "url"),
        user=req.safety_identifier or req.user,
        tier=tier or Tier.STANDARD,
        min_quality_level=limits.levels[0] if quality in BEST_QUALITIES else None,
        quality=quality,
        background=req.background or "auto",
        stream=stream,
        partial_images=(req.partial_images or 0) if stream else 0,
        unhonoured=tuple(unhonoured),
        moderation=(req.moderation or "auto") if limits.moderation else None,
        **_output(req),
    )


#: edit form fields read as numbers (form values are text)
_FORM_INTS = ("n", "output_compression")
_FORM_FLOATS = ("strength",)


def _form_value(name: str, value: str) -> Any:
    """A form field's text as the JSON value it stands for (numbers), else unchanged (the model
    then names the field when it is of the wrong kind)."""
    text = value.strip()
    try:
        if name in _FORM_INTS and text.lstrip("-").isdigit():
            return int(text)
        if name in _FORM_FLOATS:
            number = float(text)
            if number == number and abs(number) != float("inf"):
                return number
    except ValueError:
        pass
    return value


def parse_edit(
    fields: dict[str, str], image: bytes, mask: bytes | None, limits: Limits, header_tier: Tier | None = None
) -> GenerationSpec:
    """``POST /v1/images/edits``: the form's text ``fields`` (validated like a generation's) and
    its files (:func:`argusdiff.service.edits.prepare_edit`)."""
    from argusdiff.service.edits import prepare_edit

    body = {k: _form_value(k, v) for k, v in fields.items()}
    req: Any = _validate(edit_model(limits), body)
    quality = req.quality or "auto"
    size = limits.served_size(req.size)
    ready = prepare_edit(image, mask, size)
    unhonoured = []
    if req.background == "transparent":
        unhonoured.append("background=transparent")
    if req.input_fidelity is not None:
        unhonoured.append(f"input_fidelity={req.input_fidelity}")
    if req.moderation is not None and not limits.moderation:
        unhonoured.append(f"moderation={req.moderation}")
    tier = limits.tier(req.service_tier, "service_tier") if req.service_tier is not None else header_tier
    strength = req.strength if req.strength is not None else (1.0 if ready.mask_b64 is not None else 0.75)
    return GenerationSpec(
        **_lora(req, limits),
        prompt=req.prompt,
        n=req.n or 1,
        size=size,
        response_format=req.response_format or "url",
        user=req.user,
        tier=tier or Tier.STANDARD,
        min_quality_level=limits.levels[0] if quality in BEST_QUALITIES else None,
        quality=quality,
        background=req.background or "auto",
        unhonoured=tuple(unhonoured),
        moderation=(req.moderation or "auto") if limits.moderation else None,
        edit_image=ready.image_b64,
        edit_mask=ready.mask_b64,
        edit_strength=strength,
        **_output(req),
    )


def parse_native(body: Any, limits: Limits, header_tier: Tier | None = None) -> GenerationSpec:
    """``POST /v1/argusdiff/generations``: adds seed, SLO, tier, minimum quality level and ``wait``."""
    req: Any = _validate(request_models(limits)[1], body)
    tier = Tier(req.tier) if req.tier is not None else header_tier
    return GenerationSpec(
        **_lora(req, limits),
        prompt=req.prompt,
        n=req.n or 1,
        size=limits.served_size(req.size),
        response_format=req.response_format or "b64_json",
        user=req.user,
        tier=tier or Tier.STANDARD,
        slo_s=req.slo_s,
        min_quality_level=req.min_quality_level,
        seed=req.seed,
        wait=True if req.wait is None else req.wait,
        moderation=(req.moderation or "auto") if limits.moderation else None,
        unhonoured=(f"moderation={req.moderation}",) if req.moderation is not None and not limits.moderation else (),
        **_output(req),
    )


# -- responses --------------------------------------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(_Response):
    """One image of an OpenAI response: inline (``b64_json``) or a link (``url``)."""

    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImagesResponse(_Response):
    """``POST /v1/images/generations`` → 200. ``size``, ``quality``, ``output_format`` and
    ``background`` report what was served (a mapped size, the level's quality band, opaque)."""

    created: int
    data: list[Image]
    size: str | None = None
    quality: Literal["low", "medium", "high"] | None = None
    output_format: OutputFormat | None = None
    background: Literal["transparent", "opaque"] | None = None


class NativeImage(Image):
    """One image of a native response, with how it was served."""

    level: str
    requested_level: str | None = None
    optimal_level: str | None = None
    why: str | None = None
    worker: str | None = None
    seed: int | None = None
    cache_hit: bool = False
    k_used: int = 0
    deferred: bool = False
    latency_s: float | None = None
    slo_met: bool | None = None
    timings: dict[str, float] = Field(default_factory=dict)


class NativeGeneration(_Response):
    """``POST /v1/argusdiff/generations`` and ``GET .../{id}`` → 200: every image is finished."""

    id: str
    created: int
    status: Literal["completed"] = "completed"
    size: str | None = None
    output_format: OutputFormat | None = None
    data: list[NativeImage]


class GenerationAccepted(_Response):
    """202: accepted and still queued or running; poll ``Location``."""

    id: str
    created: int
    status: Literal["in_progress"] = "in_progress"
    done: int
    n: int
    levels: list[str]


class GenerationCancelled(_Response):
    """``DELETE /v1/argusdiff/generations/{id}`` → 200, and ``GET`` of a cancelled generation: its
    images not finished when it was cancelled were taken out of the queue or stopped where they
    ran (``done``: images that had finished before)."""

    id: str
    created: int
    status: Literal["cancelled"] = "cancelled"
    done: int
    n: int
    cancelled_at: float


class _ImageEvent(_Response):
    b64_json: str
    created_at: int
    size: str
    quality: str
    background: str
    output_format: OutputFormat


class ImagePartialEvent(_ImageEvent):
    """Server-sent event ``image_generation.partial_image``: an image decoded from the
    intermediate latents (``partial_image_index`` counts from 0)."""

    type: Literal["image_generation.partial_image"] = "image_generation.partial_image"
    partial_image_index: int


class ImageCompletedEvent(_ImageEvent):
    """Server-sent event ``image_generation.completed``: the final image (the stream ends after it)."""

    type: Literal["image_generation.completed"] = "image_generation.completed"


class ProgressEvent(_Response):
    """Server-sent event ``argusdiff.progress``, once per denoising step: ``step`` of ``steps``
    done at ``level`` (a cache hit starts at its skipped K)."""

    type: Literal["argusdiff.progress"] = "argusdiff.progress"
    created_at: int
    step: int
    steps: int
    level: str | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape; a stream that fails after it started sends one as an
    ``error`` event."""

    error: ErrorDetail


class ModelEntry(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "argusdiff"


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class Readiness(_Response):
    """``GET /readyz``: ready only while at least one worker serves a level."""

    ready: bool
    reason: str | None = None
    plan_version: int | None = None
    workers_up: int
    workers_serving: int
    queue: str
    queue_healthy: bool


class Health(_Response):
    status: Literal["ok"] = "ok"
