"""The OpenAPI 3.1 document of the REST API, generated from what this deployment accepts
(level ids, sizes, limits), so ``/openapi.json`` matches the validation exactly."""

from __future__ import annotations

from typing import Any

from argusdiff import __version__
from argusdiff.service.schemas import MAX_SEED, QUALITIES, RESPONSE_FORMATS, STYLES, Limits

__all__ = ["openapi_document"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def openapi_document(limits: Limits, *, auth: bool, tiers: tuple[str, ...]) -> dict[str, Any]:
    prompt = {"type": "string", "minLength": 1, "maxLength": limits.max_prompt_chars, "pattern": r"\S"}
    common = {
        "prompt": prompt,
        "model": {"type": "string", "enum": list(limits.models)},
        "n": {"type": "integer", "minimum": 1, "maximum": limits.max_n, "default": 1},
        "size": {"type": "string", "enum": ["auto", *limits.sizes]},
        "user": {"type": "string", "maxLength": 256},
    }
    openai_req = {
        "type": "object",
        "required": ["prompt"],
        "additionalProperties": False,
        "properties": {
            **common,
            "quality": {"type": "string", "enum": list(QUALITIES)},
            "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS), "default": "url"},
            "style": {"type": "string", "enum": list(STYLES)},
        },
    }
    native_req = {
        "type": "object",
        "required": ["prompt"],
        "additionalProperties": False,
        "properties": {
            **common,
            "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS), "default": "b64_json"},
            "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
            "slo_s": {"type": "number", "exclusiveMinimum": 0, "maximum": limits.max_slo_s},
            "tier": {"type": "string", "enum": list(tiers)},
            "min_quality_level": {"type": "string", "enum": list(limits.levels)},
            "wait": {"type": "boolean", "default": True},
        },
    }
    image = {
        "type": "object",
        "properties": {"b64_json": {"type": "string"}, "url": {"type": "string"}, "revised_prompt": {"type": "string"}},
    }
    native_image = {
        "type": "object",
        "properties": {
            "b64_json": {"type": "string"},
            "url": {"type": "string"},
            "level": {"type": "string"},
            "requested_level": {"type": ["string", "null"]},
            "optimal_level": {"type": ["string", "null"]},
            "worker": {"type": ["string", "null"]},
            "seed": {"type": ["integer", "null"]},
            "cache_hit": {"type": "boolean"},
            "k_used": {"type": "integer"},
            "deferred": {"type": "boolean"},
            "latency_s": {"type": ["number", "null"]},
            "slo_met": {"type": ["boolean", "null"]},
            "timings": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }
    busy = {**_error("overloaded or no capacity at the requested quality; see Retry-After")}
    unavailable = _error("not ready or the work queue is unavailable; nothing was accepted; see Retry-After")
    gen_responses = {
        "400": _error("invalid request; `param` names the field"),
        "401": _error("missing or invalid API key"),
        "413": _error("request body too large"),
        "429": busy,
        "503": unavailable,
    }
    secured = [{"bearer": []}] if auth else []
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "argusdiff",
            "version": __version__,
            "description": "Quality-aware text-to-image serving. OpenAI-compatible Images API plus a native endpoint.",
        },
        "paths": {
            "/v1/images/generations": {
                "post": {
                    "operationId": "createImage",
                    "summary": "Generate images (OpenAI Images API)",
                    "security": secured,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": openai_req}}},
                    "responses": {
                        "200": {
                            "description": "generated images",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["created", "data"],
                                        "properties": {
                                            "created": {"type": "integer"},
                                            "data": {"type": "array", "items": image},
                                        },
                                    }
                                }
                            },
                        },
                        **gen_responses,
                    },
                }
            },
            "/v1/argusdiff/generations": {
                "post": {
                    "operationId": "createGeneration",
                    "summary": "Generate images with an SLO, tier, minimum quality level and seed",
                    "security": secured,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": native_req}}},
                    "responses": {
                        "200": {
                            "description": "generated images with the serving level, timings and cache use",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "id": {"type": "string"},
                                            "created": {"type": "integer"},
                                            "status": {"type": "string"},
                                            "data": {"type": "array", "items": native_image},
                                        },
                                    }
                                }
                            },
                        },
                        "202": {"description": "accepted (wait = false, or still running); poll the id"},
                        **gen_responses,
                    },
                }
            },
            "/v1/argusdiff/generations/{id}": {
                "get": {
                    "operationId": "getGeneration",
                    "summary": "Status or result of an accepted generation",
                    "security": secured,
                    "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "completed"},
                        "202": {"description": "still queued or running"},
                        "401": _error("missing or invalid API key"),
                        "404": _error("unknown or expired id"),
                    },
                }
            },
            "/v1/images/{image_id}": {
                "get": {
                    "operationId": "getImage",
                    "summary": "A generated image (the target of `url` responses), until it expires",
                    "parameters": [{"name": "image_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "PNG image", "content": {"image/png": {}}},
                        "404": _error("unknown or expired image"),
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "security": secured,
                    "responses": {"200": {"description": "the model names this deployment accepts"}},
                }
            },
            "/v1/plan": {
                "get": {
                    "operationId": "getPlan",
                    "summary": "Allocation, PASM, thresholds, predicted load, saturation, workers, cache health",
                    "security": secured,
                    "responses": {"200": {"description": "the plan in force"}, "503": unavailable},
                }
            },
            "/healthz": {"get": {"operationId": "healthz", "responses": {"200": {"description": "alive"}}}},
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "responses": {"200": {"description": "a plan with a worker exists"}, "503": unavailable},
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "responses": {"200": {"description": "Prometheus text format", "content": {"text/plain": {}}}},
                }
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                }
            }
        },
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
