"""``/openapi.json``, rendered from the pydantic models of :mod:`argusdiff.service.schemas` (the same
models validate the requests and build the responses) and one table of the routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from argusdiff import __version__
from argusdiff.service import schemas as s

__all__ = ["OPERATIONS", "Operation", "openapi_document"]

Body = type[BaseModel] | tuple[type[BaseModel], ...] | str | None  # a model, any of several, a media type


@dataclass(frozen=True, slots=True)
class Operation:
    path: str
    method: str
    operation_id: str
    summary: str
    responses: dict[int, tuple[str, Body]]
    request: str | None = None  # "openai" / "native": the deployment's request model
    secured: bool = True
    path_params: tuple[str, ...] = ()
    streams: bool = False  # 200 may also be text/event-stream
    idempotent: bool = False  # takes an Idempotency-Key header (argusdiff.service.idempotency)


_REJECTED = {
    400: ("invalid request; `param` names the field", s.ErrorResponse),
    401: ("missing or invalid API key", s.ErrorResponse),
    408: ("the request body did not arrive within body_timeout_s", s.ErrorResponse),
    413: ("request body too large", s.ErrorResponse),
    415: ("the body's Content-Type is not accepted here (JSON endpoints: application/json)", s.ErrorResponse),
    429: ("overloaded, or no capacity at the requested quality; nothing was accepted; see Retry-After",
          s.ErrorResponse),
    503: ("no worker serves a level yet, shutting down, the queue is unavailable, or the accepted work was lost; "
          "see Retry-After", s.ErrorResponse),
}  # fmt: skip
_KEYED = {
    409: ("another attempt with this Idempotency-Key is still being accepted; see Retry-After", s.ErrorResponse),
    422: ("this Idempotency-Key was used with a different request body", s.ErrorResponse),
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
    "description": "a retry with the same key and body, through any router, gets the original generation",
}

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "/v1/images/generations", "post", "createImage", "Generate images (OpenAI Images API; stream: true for SSE)",
        {200: ("generated images; with stream: true, server-sent events", s.ImagesResponse),
         500: ("a worker failed the image", s.ErrorResponse),
         504: ("not finished within request_timeout_s; the work stays queued", s.ErrorResponse), **_REJECTED,
         **_KEYED},
        request="openai", streams=True, idempotent=True,
    ),
    Operation(
        "/v1/images/edits", "post", "createImageEdit",
        "Edit an image (OpenAI Images API, multipart form): img2img, or inpainting where the mask is transparent",
        {200: ("edited images", s.ImagesResponse), 500: ("a worker failed the image", s.ErrorResponse),
         504: ("not finished within request_timeout_s; the work stays queued", s.ErrorResponse), **_REJECTED,
         **_KEYED},
        request="edit", idempotent=True,
    ),
    Operation(
        "/v1/argusdiff/generations", "post", "createGeneration",
        "Generate images with an SLO, tier, minimum quality level and seed",
        {200: ("generated images with the serving level, timings and cache use", s.NativeGeneration),
         202: ("accepted (wait = false, or still running); poll Location", s.GenerationAccepted),
         500: ("a worker failed the image", s.ErrorResponse), **_REJECTED, **_KEYED},
        request="native", idempotent=True,
    ),
    Operation(
        "/v1/argusdiff/generations/{id}", "get", "getGeneration", "Status or result of an accepted generation",
        {200: ("completed, or cancelled", (s.NativeGeneration, s.GenerationCancelled)),
         202: ("still queued or running", s.GenerationAccepted),
         401: _REJECTED[401], 404: ("unknown or expired id", s.ErrorResponse),
         410: ("finished, but its image is no longer kept (it was delivered)", s.ErrorResponse),
         500: ("a worker failed the image", s.ErrorResponse)},
        path_params=("id",),
    ),
    Operation(
        "/v1/argusdiff/generations/{id}", "delete", "cancelGeneration",
        "Cancel a generation: queued images leave the queue, running ones stop at their next denoising step",
        {200: ("cancelled (also when it already was)", s.GenerationCancelled), 401: _REJECTED[401],
         404: ("unknown or expired id", s.ErrorResponse),
         409: ("every image has already finished", s.ErrorResponse)},
        path_params=("id",),
    ),
    Operation(
        "/v1/images/{image_id}", "get", "getImage", "A generated image (the target of local `url` responses)",
        {200: ("the image", "image/*"), 404: ("unknown or expired image", s.ErrorResponse)},
        secured=False, path_params=("image_id",),
    ),
    Operation("/v1/models", "get", "listModels", "The model names this deployment accepts",
              {200: ("model names (model_name, the profile, the aliases)", s.ModelList)}),
    Operation("/v1/plan", "get", "getPlan", "Allocation, PASM, thresholds, predicted load, workers, cache health",
              {200: ("the plan in force", "application/json"), 503: ("no plan yet", s.ErrorResponse)}),
    Operation("/v1/cluster", "get", "getCluster", "Routers, the leader and its fencing token, workers, the plan",
              {200: ("the cluster (argusdiff status)", "application/json"),
               503: ("redis unavailable", s.ErrorResponse)}),
    Operation("/healthz", "get", "healthz", "Liveness", {200: ("alive", s.Health)}, secured=False),
    Operation("/health", "get", "health", "Liveness (the vLLM / TGI name of /healthz)", {200: ("alive", s.Health)},
              secured=False),
    Operation("/readyz", "get", "readyz", "Readiness: at least one worker serves a level",
              {200: ("ready", s.Readiness), 503: ("not ready; `reason` says why", s.Readiness)}, secured=False),
    Operation("/metrics", "get", "metrics", "Prometheus metrics", {200: ("Prometheus text format", "text/plain")},
              secured=False),
    Operation("/ui", "get", "livePlanPage", "The live plan page (it reads /v1/plan, /v1/cluster and /metrics)",
              {200: ("a self-contained HTML page", "text/html")}, secured=False),
)  # fmt: skip

_STREAM_EVENTS = (s.ImagePartialEvent, s.ImageCompletedEvent, s.ProgressEvent, s.ErrorResponse)


@dataclass
class _Schemas:
    """Collects models and renders each once under ``#/components/schemas``."""

    models: dict[tuple[type[BaseModel], str], None] = field(default_factory=dict)

    def add(self, model: type[BaseModel], mode: str) -> None:
        self.models[(model, mode)] = None

    def render(self) -> tuple[dict[tuple[type[BaseModel], str], Any], dict[str, Any]]:
        refs, top = models_json_schema(list(self.models), ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
        return refs, top.get("$defs", {})


def _content(body: Body, refs: dict) -> dict[str, Any]:
    if body is None:
        return {}
    if isinstance(body, str):
        return {body: {}}
    models = body if isinstance(body, tuple) else (body,)
    schemas = [refs[(m, "serialization")] for m in models]
    return {"application/json": {"schema": schemas[0] if len(schemas) == 1 else {"oneOf": schemas}}}


def _edit_form(defs: dict[str, Any]) -> dict[str, Any]:
    """The edit form's schema: the edit model's fields plus ``image`` and ``mask`` files."""
    model = dict(defs["ImageEditRequest"])
    binary = {"type": "string", "format": "binary"}
    props = {
        "image": {**binary, "description": "the image to edit (PNG, JPEG or WebP)"},
        "mask": {**binary, "description": "PNG with alpha: fully transparent pixels are edited"},
        **model.get("properties", {}),
    }
    return {**model, "properties": props, "required": ["image", *model.get("required", [])]}


def openapi_document(limits: s.Limits, *, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a deployment with ``limits`` (``auth``: Bearer keys are set)."""
    openai_req, native_req = s.request_models(limits)
    requests = {"openai": openai_req, "native": native_req, "edit": s.edit_model(limits)}
    reg = _Schemas()
    for model in requests.values():
        reg.add(model, "validation")
    for op in OPERATIONS:
        for _, body in op.responses.values():
            for model in body if isinstance(body, tuple) else (body,):
                if isinstance(model, type):
                    reg.add(model, "serialization")
    for model in _STREAM_EVENTS:
        reg.add(model, "serialization")
    refs, defs = reg.render()
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
        if op.secured and auth:
            entry["security"] = [{"bearer": []}]
        if op.path_params:
            entry["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
                for p in op.path_params
            ]
        if op.idempotent:
            entry["parameters"] = [*entry.get("parameters", []), dict(_IDEMPOTENCY_KEY)]
        if op.request == "edit":  # a multipart form: the text fields and the two files
            entry["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": _edit_form(defs)}}}
        elif op.request is not None:
            schema = refs[(requests[op.request], "validation")]
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        responses = {}
        for status, (description, body) in sorted(op.responses.items()):
            response: dict[str, Any] = {"description": description}
            content = _content(body, refs)
            if status == 200 and op.streams:
                events = [refs[(m, "serialization")] for m in _STREAM_EVENTS]
                content["text/event-stream"] = {"schema": {"oneOf": events}}
            if content:
                response["content"] = content
            responses[str(status)] = response
        entry["responses"] = responses
        paths.setdefault(op.path, {})[op.method] = entry
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "argusdiff",
            "version": __version__,
            "description": "Quality-aware text-to-image serving: the OpenAI Images API (with streaming) and a "
            "native endpoint with SLOs, tiers and quality floors.",
        },
        "paths": paths,
        "components": {"schemas": defs},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
