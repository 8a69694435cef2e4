"""The REST API's pydantic models: one source for validation and /openapi.json; OpenAI's
gpt-image fields, model aliases and size mapping; hostile values that once gave a 5xx."""

from __future__ import annotations

import pytest

from argusdiff.config import ServiceConfig
from argusdiff.service.errors import ApiError
from argusdiff.service.openapi import OPERATIONS, openapi_document
from argusdiff.service.schemas import Limits, parse_native, parse_openai, request_models, size_table

LIMITS = Limits.of(ServiceConfig(max_prompt_chars=50, max_slo_s=60), "demo-cpu", ("a", "b", "c"), ("64x64",))


def _reject(parse, body) -> ApiError:
    with pytest.raises(ApiError) as exc:
        parse(body, LIMITS)
    assert exc.value.status == 400
    return exc.value


def test_a_400_digit_slo_is_a_400_naming_the_field():
    err = _reject(parse_native, {"prompt": "a", "slo_s": int("1" + "0" * 399)})
    assert err.param == "slo_s" and "too large" in err.message


@pytest.mark.parametrize("parse", [parse_openai, parse_native])
def test_a_lone_surrogate_in_the_prompt_is_a_400_naming_the_field(parse):
    err = _reject(parse, {"prompt": "a\ud800b"})
    assert err.param == "prompt" and "surrogate" in err.message
    assert _reject(parse, {"prompt": "a", "user": "\udfff"}).param == "user"


def test_model_aliases_and_common_sizes_map_to_the_deployment():
    spec = parse_openai({"prompt": "a", "model": "dall-e-3", "size": "1024x1024", "output_format": "jpeg"}, LIMITS)
    assert (spec.size, spec.output_format, spec.response_format) == ("64x64", "jpeg", "url")
    for model in ("dall-e-2", "gpt-image-1", "argusdiff", "demo-cpu"):
        assert parse_openai({"prompt": "a", "model": model}, LIMITS).size == "64x64"
    err = _reject(parse_openai, {"prompt": "a", "model": "dall-e-9"})
    assert (err.param, err.code) == ("model", "model_not_found") and "dall-e-3" in err.message
    err = _reject(parse_openai, {"prompt": "a", "size": "1792x1024"})  # no landscape size is served
    assert err.param == "size" and "64x64" in err.message


def test_size_table_keeps_the_orientation():
    assert dict(size_table(("768x768", "1024x576"))) == {
        "256x256": "768x768",
        "512x512": "768x768",
        "1024x1024": "768x768",
        "1792x1024": "1024x576",
        "1536x1024": "1024x576",
    }
    assert size_table(("64x64",), map_sizes=False) == ()


def test_gpt_image_fields_are_honoured_or_reported():
    spec = parse_openai(
        {"prompt": "a", "output_format": "webp", "output_compression": 40, "background": "transparent",
         "moderation": "low", "quality": "high", "style": "vivid"},
        LIMITS,
    )  # fmt: skip
    assert (spec.output_format, spec.output_compression, spec.min_quality_level) == ("webp", 40, "a")
    assert spec.unhonoured == ("background=transparent", "style=vivid", "moderation=low")
    assert parse_openai({"prompt": "a", "background": "opaque", "quality": "low"}, LIMITS).unhonoured == ()
    assert _reject(parse_openai, {"prompt": "a", "output_compression": 50}).param == "output_compression"
    assert _reject(parse_openai, {"prompt": "a", "output_format": "gif"}).param == "output_format"
    assert _reject(parse_openai, {"prompt": "a", "output_compression": 101, "output_format": "jpeg"}).param == (
        "output_compression"
    )


def test_streaming_fields():
    spec = parse_openai({"prompt": "a", "stream": True, "partial_images": 3}, LIMITS)
    assert (spec.stream, spec.partial_images, spec.response_format) == (True, 3, "b64_json")
    assert spec.item_meta() == {"stream": "1", "partial_images": "3"}
    assert parse_openai({"prompt": "a"}, LIMITS).item_meta() == {}
    assert _reject(parse_openai, {"prompt": "a", "stream": True, "partial_images": 4}).param == "partial_images"
    assert _reject(parse_openai, {"prompt": "a", "stream": True, "n": 2}).param == "n"
    assert _reject(parse_openai, {"prompt": "a", "stream": True, "response_format": "url"}).param == "response_format"
    assert _reject(parse_openai, {"prompt": "a", "stream": "yes"}).param == "stream"
    assert parse_openai({"prompt": "a", "partial_images": 2}, LIMITS).unhonoured == ("partial_images=2",)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"prompt": "a", "n": 1.5}, "n", "invalid_type"),
        ({"prompt": "a", "n": True}, "n", "invalid_type"),
        ({"prompt": "a", "n": 5}, "n", "invalid_value"),
        ({"prompt": "a\x00b"}, "prompt", "invalid_value"),
        ({"prompt": "  "}, "prompt", "empty_prompt"),
        ({"prompt": "x" * 51}, "prompt", "string_above_max_length"),
        ({}, "prompt", "missing_required_parameter"),
        ({"prompt": "a", "user": "u" * 300}, "user", "string_above_max_length"),
        ({"prompt": "a", "slo_s": float("nan")}, "slo_s", "invalid_value"),
        ({"prompt": "a", "slo_s": True}, "slo_s", "invalid_type"),
        ({"prompt": "a", "slo_s": 61}, "slo_s", "invalid_value"),
        ({"prompt": "a", "size": 64}, "size", "invalid_type"),
        ({"prompt": "a", "tier": "gold"}, "tier", "invalid_value"),
        ({"prompt": "a", "min_quality_level": "z"}, "min_quality_level", "invalid_value"),
        ({"prompt": "a", "wait": "yes"}, "wait", "invalid_type"),
        ({"prompt": "a", "stream": True}, "stream", "unknown_parameter"),
        ([1, 2], None, "invalid_body"),
    ],
)
def test_native_rejections_name_the_field(body, param, code):
    err = _reject(parse_native, body)
    assert (err.param, err.code) == (param, code), err.message


def test_openapi_is_rendered_from_the_validating_models():
    openai_model, native_model = request_models(LIMITS)
    doc = openapi_document(LIMITS, auth=True)
    schemas = doc["components"]["schemas"]
    own = openai_model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in own.pop("$defs", {}).items():  # nested models (LoraRef) are components of their own
        assert schemas[name] == sub, name
    assert schemas["ImageGenerationRequest"] == own
    assert set(schemas["ImageGenerationRequest"]["properties"]) == set(openai_model.model_fields)
    assert set(schemas["GenerationRequest"]["properties"]) == set(native_model.model_fields)
    n = schemas["GenerationRequest"]["properties"]["n"]["anyOf"][0]
    assert (n["minimum"], n["maximum"]) == (1, LIMITS.max_n)
    size = schemas["ImageGenerationRequest"]["properties"]["size"]["anyOf"][0]["enum"]
    assert size == list(LIMITS.accepted_sizes) and "1024x1024" in size
    ops = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert ops == {(op.path, op.method) for op in OPERATIONS}
    create = doc["paths"]["/v1/images/generations"]["post"]
    assert set(create["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    events = create["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    assert {e["$ref"].rsplit("/", 1)[1] for e in events} >= {"ImagePartialEvent", "ImageCompletedEvent"}
    assert create["security"] == [{"bearer": []}] and "securitySchemes" in doc["components"]
    assert "security" not in openapi_document(LIMITS, auth=False)["paths"]["/v1/images/generations"]["post"]
