"""Request correlation and tracing (argusdiff.tracing) on a real running service.

* ``X-Request-Id``: the client's is kept (or one is made, or an unusable one replaced) and comes
  back on every response: success, error, 404, stream;
* it rides in the work item to the worker and is on the log lines about the request (the router's
  and the worker's), in text or JSON;
* with tracing on (an in-memory exporter, OpenTelemetry's SDK), the client's ``traceparent`` is
  continued: the request span has spans for classification, routing and admission, and the
  worker's span for the item (queue wait, denoise, ...) is its child, carrying the request id;
* with tracing off, OpenTelemetry is never imported.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time

import pytest

from argusdiff import tracing

httpx = pytest.importorskip("httpx")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def test_request_ids_are_kept_or_made():
    assert tracing.request_id_from("client-42/a:b") == "client-42/a:b"
    made = tracing.request_id_from(None)
    assert re.fullmatch(r"[0-9a-f]{32}", made) and made != tracing.request_id_from("")
    for bad in ("x" * 129, "with space", "ünïcode", "new\nline"):
        assert re.fullmatch(r"[0-9a-f]{32}", tracing.request_id_from(bad)), bad


@pytest.mark.integration
def test_x_request_id_round_trips_on_every_response(live_service):
    from tests.fixtures_service import service_settings

    server = live_service(service_settings(stand_in_scale=0.0005))
    url = server.url
    ok = httpx.post(f"{url}/v1/argusdiff/generations", json={"prompt": "a fox"}, headers={"X-Request-Id": "abc-1"})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "abc-1"
    made = httpx.post(f"{url}/v1/images/generations", json={"prompt": "a fox"})
    assert made.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    bad = httpx.post(f"{url}/v1/images/generations", json={"prompt": "a fox", "n": 0}, headers={"X-Request-Id": "e-2"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "e-2"
    missing = httpx.get(f"{url}/v1/nope", headers={"X-Request-Id": "e-3"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "e-3"
    replaced = httpx.get(f"{url}/healthz", headers={"X-Request-Id": "y" * 200})
    assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])
    body = {"prompt": "a streamed fox", "stream": True, "response_format": "b64_json"}
    with httpx.stream("POST", f"{url}/v1/images/generations", json=body, headers={"X-Request-Id": "s-4"},
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"] == "s-4"
        assert "image_generation.completed" in r.read().decode()


@pytest.mark.integration
def test_the_request_id_is_on_the_router_and_worker_log_lines(live_service, caplog):
    from tests.fixtures_service import service_settings

    tracing.install_record_factory()
    server = live_service(service_settings(stand_in_scale=0.0005))
    with caplog.at_level(logging.DEBUG, logger="argusdiff"):
        r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a fox", "n": 2},
                       headers={"X-Request-Id": "log-7"}, timeout=60)  # fmt: skip
        assert r.status_code == 200
    accepted = [rec for rec in caplog.records if rec.getMessage().startswith("accepted gen-")]
    batches = [rec for rec in caplog.records if " batch of " in rec.getMessage() and "log-7" in rec.request_id]
    assert [rec.request_id for rec in accepted] == ["log-7"]
    assert batches, "no worker log line carries the request id"
    # both formats carry it
    line = json.loads(tracing.JsonFormatter().format(accepted[0]))
    assert line["request_id"] == "log-7" and line["message"].startswith("accepted gen-")
    assert "[log-7]" in logging.Formatter(tracing.TEXT_FORMAT).format(accepted[0])


@pytest.fixture
def spans():
    exporter_mod = pytest.importorskip(
        "opentelemetry.sdk.trace.export.in_memory_span_exporter", reason="the tracing extra is not installed"
    )
    exporter = exporter_mod.InMemorySpanExporter()
    assert tracing.configure(exporter=exporter, service_name="argusdiff-test")
    try:
        yield exporter
    finally:
        tracing.shutdown()


@pytest.mark.integration
def test_spans_continue_the_client_trace_down_to_the_worker(live_service, spans):
    from tests.fixtures_service import service_settings

    server = live_service(service_settings(stand_in_scale=0.0005))
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-Id": "trace-9"}
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a fox"}, headers=headers, timeout=60)
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(s.name == "work" for s in spans.get_finished_spans()):
        time.sleep(0.02)
    finished = [s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == TRACE_ID]
    by_name = {s.name: s for s in finished}
    request = by_name["POST /v1/argusdiff/generations"]
    assert format(request.parent.span_id, "016x") == PARENT_ID  # the client's span is the parent
    assert request.attributes["http.request_id"] == "trace-9"
    for name in ("classification", "route", "admission"):
        assert by_name[name].parent.span_id == request.context.span_id, name
    work = by_name["work"]
    assert work.parent.span_id == request.context.span_id  # the traceparent rode in the work item
    assert work.attributes["argusdiff.request_id"] == "trace-9"
    assert work.attributes["argusdiff.level"] == r.json()["data"][0]["level"]
    phases = {s.name for s in finished if s.parent is not None and s.parent.span_id == work.context.span_id}
    assert {"queue wait", "denoise"} <= phases
    assert all(s.end_time >= s.start_time for s in finished)


def test_tracing_off_costs_no_import_and_no_span():
    """No tracer, no span, no OpenTelemetry module of argusdiff's (redis-py, when OpenTelemetry is
    installed, imports its metrics SDK by itself: that is counted before)."""
    code = (
        "import sys\n"
        "import redis, starlette\n"
        "before = {m for m in sys.modules if m.startswith('opentelemetry')}\n"
        "from argusdiff import tracing\n"
        "import argusdiff.service.router, argusdiff.service.api, workers.loop\n"
        "assert tracing.span('x') is tracing.span('y') and not tracing.enabled()\n"
        "tracing.REQUEST_ID.set('r-1')\n"
        "assert tracing.item_meta() == {'x-request-id': 'r-1'}\n"
        "tracing.record_work({}, [], start_s=0.0, end_s=1.0)\n"
        "after = {m for m in sys.modules if m.startswith('opentelemetry')}\n"
        "assert after == before, sorted(after - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
