"""Request correlation and tracing: X-Request-Id, W3C traceparent, optional OpenTelemetry spans, request ids in logs.

* The router keeps a client's ``X-Request-Id`` (printable ASCII, at most 128 characters) or makes
  one, answers with it on every response, and puts it in the work item's meta (``x-request-id``)
  so the worker logs it too; :data:`REQUEST_ID` holds it for the task that handles the request.
* Tracing is off unless :func:`configure` is called (``[service] otlp_endpoint``): then the
  router continues the client's ``traceparent`` (or starts a trace), spans cover admission,
  classification and the router's cache lookup, the work item carries the request span's
  ``traceparent``, and the worker adds spans for queue wait, cache lookup, denoise and decode
  from the phase timings it measures. OpenTelemetry (the ``tracing`` extra) is imported only
  then; while off, :func:`span` returns one shared no-op context manager.
* :func:`configure_logging` installs a filter that adds ``request_id`` to every record and a
  text or JSON (one object a line) format.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

__all__ = [
    "META_REQUEST_ID",
    "META_TRACEPARENT",
    "REQUEST_ID",
    "configure",
    "configure_logging",
    "enabled",
    "install_record_factory",
    "item_meta",
    "record_work",
    "request_id_from",
    "server_span",
    "shutdown",
    "span",
]

#: The request id of the request being handled (router) or the batch being run (worker: its
#: items' ids, comma-separated).
REQUEST_ID: ContextVar[str | None] = ContextVar("argusdiff_request_id", default=None)
META_REQUEST_ID = "x-request-id"
META_TRACEPARENT = "traceparent"
_VALID_ID = re.compile(r"[\x21-\x7e]{1,128}")
_NULL = contextlib.nullcontext()


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-Id`` when it is printable ASCII of at most 128 characters, else a
    new one (32 hex digits)."""
    if header and _VALID_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


class _State:
    tracer: Any = None
    provider: Any = None
    propagator: Any = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def configure(endpoint: str | None = None, *, exporter: Any = None, service_name: str = "argusdiff") -> bool:
    """Turn tracing on: spans go to ``endpoint`` (an OTLP/HTTP collector, e.g.
    ``http://otel-collector:4318``; ``/v1/traces`` is added) or to ``exporter`` (tests: an
    in-memory one, exported at once). Returns whether tracing is on."""
    if endpoint is None and exporter is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint.rstrip("/")
        url = url if url.endswith("/v1/traces") else f"{url}/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    shutdown()
    _state.provider = provider
    _state.tracer = provider.get_tracer("argusdiff")
    _state.propagator = TraceContextTextMapPropagator()
    return True


def shutdown() -> None:
    """Flush and turn tracing off."""
    provider, _state.provider, _state.tracer = _state.provider, None, None
    if provider is not None:
        provider.shutdown()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager:
    """A child span of the current one (no-op while tracing is off)."""
    tracer = _state.tracer
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, attributes=_attrs(attributes))


@contextlib.contextmanager
def server_span(traceparent: str | None, name: str, **attributes: Any) -> Iterator[None]:
    """The span of one HTTP request, continuing the client's ``traceparent`` when it sent one."""
    tracer = _state.tracer
    if tracer is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    ctx = _state.propagator.extract({META_TRACEPARENT: traceparent}) if traceparent else None
    with tracer.start_as_current_span(name, context=ctx, kind=SpanKind.SERVER, attributes=_attrs(attributes)):
        yield


def item_meta() -> dict[str, str]:
    """What a work item carries for the worker: the request id and, while tracing, the current
    span's ``traceparent``."""
    out: dict[str, str] = {}
    rid = REQUEST_ID.get()
    if rid:
        out[META_REQUEST_ID] = rid
    if _state.tracer is not None:
        carrier: dict[str, str] = {}
        _state.propagator.inject(carrier)
        if META_TRACEPARENT in carrier:
            out[META_TRACEPARENT] = carrier[META_TRACEPARENT]
    return out


def record_work(
    meta: Mapping[str, str],
    phases: Sequence[tuple[str, float, float]],
    *,
    start_s: float,
    end_s: float,
    **attributes: Any,
) -> None:
    """A worker's span for one work item (child of the request span its ``traceparent`` names)
    from ``start_s`` to ``end_s`` (wall clock), with a child span per measured phase
    ``(name, start_s, end_s)``; nothing while tracing is off."""
    tracer = _state.tracer
    if tracer is None:
        return
    from opentelemetry import trace

    parent = meta.get(META_TRACEPARENT)
    ctx = _state.propagator.extract({META_TRACEPARENT: parent}) if parent else None
    attrs = dict(attributes)
    if meta.get(META_REQUEST_ID):
        attrs["argusdiff.request_id"] = meta[META_REQUEST_ID]
    root = tracer.start_span("work", context=ctx, start_time=_ns(start_s), attributes=_attrs(attrs))
    inner = trace.set_span_in_context(root)
    for name, t0, t1 in phases:
        s = tracer.start_span(name, context=inner, start_time=_ns(t0))
        s.end(end_time=_ns(max(t0, t1)))
    root.end(end_time=_ns(end_s))


def _ns(t: float) -> int:
    return int(t * 1e9)


def _attrs(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if isinstance(v, str | bool | int | float)}


# -- logs ------------------------------------------------------------------------------------


_factory_installed = False


def install_record_factory() -> None:
    """Every log record made from now on carries ``request_id`` (:data:`REQUEST_ID`, or "-")."""
    global _factory_installed
    if _factory_installed:
        return
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.request_id = REQUEST_ID.get() or "-"
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, request id (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """The root logger at ``level`` with a text or JSON format; every record gets ``request_id``."""
    install_record_factory()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
