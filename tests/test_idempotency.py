"""``Idempotency-Key`` on both generation endpoints: a retry (same key, same body) through any
router gets the original generation; a different body is 422; no key behaves as before."""

from __future__ import annotations

import asyncio
import base64
import uuid

import httpx
import pytest
from fixtures_service import redis_client, service_settings

from argusdiff.service.worker import wait_until

NATIVE = "/v1/argusdiff/generations"
OPENAI = "/v1/images/generations"


def _key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def test_embedded_retry_returns_the_original_generation(live_service):
    server = live_service(service_settings())
    router = server.service.router
    h = _key()
    first = httpx.post(server.url + NATIVE, json={"prompt": "a fox", "n": 2, "seed": 3}, headers=h, timeout=30)
    again = httpx.post(server.url + NATIVE, json={"prompt": "a fox", "n": 2, "seed": 3}, headers=h, timeout=30)
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert [d["b64_json"] for d in first.json()["data"]] == [d["b64_json"] for d in again.json()["data"]]
    assert router.accepted == 2  # two images, generated once
    # the same key with another body, or on the other endpoint's scope
    other = httpx.post(server.url + NATIVE, json={"prompt": "a wolf", "n": 2, "seed": 3}, headers=h, timeout=30)
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key"
    body = {"prompt": "a fox", "response_format": "b64_json"}
    oa = httpx.post(server.url + OPENAI, json=body, headers=h, timeout=30)
    assert oa.status_code == 200 and router.accepted == 3
    oa2 = httpx.post(server.url + OPENAI, json=body, headers=h, timeout=30)
    assert oa2.json() == oa.json() and router.accepted == 3
    # no key: every request is new
    for _ in range(2):
        assert httpx.post(server.url + NATIVE, json={"prompt": "a fox"}, timeout=30).status_code == 200
    assert router.accepted == 5


@pytest.mark.parametrize("bad", ["", "x" * 256, "has space", "caf\u00e9"])
def test_malformed_key_is_a_400_naming_the_header(live_service, bad):
    server = live_service(service_settings())
    r = httpx.post(server.url + NATIVE, json={"prompt": "p"}, headers={"Idempotency-Key": bad.encode("utf-8")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key"
    assert server.service.router.accepted == 0


def test_concurrent_duplicates_generate_once(live_service):
    server = live_service(service_settings())
    h = _key()

    async def fire():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(
                *(client.post(NATIVE, json={"prompt": "same", "seed": 1}, headers=h) for _ in range(8))
            )

    responses = asyncio.run(fire())
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["id"] for r in responses}) == 1
    assert server.service.router.accepted == 1


def test_a_rejected_request_gives_its_key_back(live_service):
    server = live_service(service_settings())
    h = _key()
    r = httpx.post(server.url + NATIVE, json={"prompt": "p", "min_quality_level": "nope"}, headers=h)
    assert r.status_code == 400  # validation fails before the key is looked at
    server.service.router.closing = True  # 503 shutting_down: not accepted
    assert httpx.post(server.url + NATIVE, json={"prompt": "p"}, headers=h).status_code == 503
    server.service.router.closing = False
    ok = httpx.post(server.url + NATIVE, json={"prompt": "p"}, headers=h, timeout=30)
    assert ok.status_code == 200 and server.service.router.accepted == 1


@pytest.mark.integration
def test_retry_through_another_router_gets_the_original(redis_any, live_service, worker_procs):
    settings = service_settings(redis_url=redis_any.url, workers=0, control_period_s=1.0)
    a = live_service(settings, ready=False)
    b = live_service(settings, ready=False)
    worker_procs(redis_any.url, "w0", scale=0.01)
    assert wait_until(lambda: all(s.service.ready() for s in (a, b)), 30)
    h = _key()
    body = {"prompt": "a harbour at dusk", "n": 2, "wait": False}
    first = httpx.post(a.url + NATIVE, json=body, headers=h)
    assert first.status_code == 202
    gid = first.json()["id"]
    again = httpx.post(b.url + NATIVE, json=body, headers=h)
    assert again.status_code == 202 and again.json()["id"] == gid
    sync = httpx.post(b.url + NATIVE, json={**body, "wait": True}, headers=h, timeout=30)
    assert sync.status_code == 422  # a different body (wait) under the same key
    done = httpx.post(b.url + OPENAI, json={"prompt": "a harbour", "response_format": "b64_json"}, headers=h,
                      timeout=30)  # fmt: skip
    replay = httpx.post(a.url + OPENAI, json={"prompt": "a harbour", "response_format": "b64_json"}, headers=h,
                        timeout=30)  # fmt: skip
    assert done.status_code == replay.status_code == 200
    assert [base64.b64decode(d["b64_json"]) for d in replay.json()["data"]] == [
        base64.b64decode(d["b64_json"]) for d in done.json()["data"]
    ]
    accepted = a.service.router.accepted + b.service.router.accepted
    assert accepted == 3  # 2 images + 1 image; every retry was a replay
    key = next(iter(redis_server_keys(redis_any, "{argusdiff}:idem:*")))
    assert 0 < redis_ttl(redis_any, key) <= settings.service.result_ttl_s  # expires with the results


def redis_server_keys(server, pattern: str) -> list[bytes]:

    return list(redis_client(server).scan_iter(pattern))


def redis_ttl(server, key: bytes) -> float:

    return redis_client(server).pttl(key) / 1000


@pytest.mark.integration
def test_openai_client_sends_the_key_with_extra_headers(redis_any, live_service, worker_procs):
    openai = pytest.importorskip("openai")
    settings = service_settings(redis_url=redis_any.url, workers=0, control_period_s=1.0)
    server = live_service(settings, ready=False)
    worker_procs(redis_any.url, "w0", scale=0.01)
    assert wait_until(server.service.ready, 30)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    one = client.images.generate(prompt="a kite", response_format="b64_json", extra_headers=key)
    two = client.images.generate(prompt="a kite", response_format="b64_json", extra_headers=key)
    assert one.data[0].b64_json == two.data[0].b64_json and server.service.router.accepted == 1


@pytest.mark.integration
def test_a_keyed_client_that_goes_away_keeps_its_work_and_its_retry_streams_it(live_service):
    """Without a key a client that leaves cancels its work (test_service_streaming); with one it
    said it will retry: the work finishes, and the retried stream gets that image at once."""
    import json
    import socket

    openai = pytest.importorskip("openai")
    server = live_service(service_settings(workers=1, stand_in_scale=0.2))
    router = server.service.router
    key = str(uuid.uuid4())
    body = json.dumps({"prompt": "a slow one", "stream": True, "quality": "high"}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(body), body))  # fmt: skip
    sock.settimeout(30)
    seen = b""
    while b"event: argusdiff.progress" not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    sock.close()  # the client leaves mid-stream
    assert wait_until(lambda: router.completed == 1, 30)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    events = list(client.images.generate(prompt="a slow one", stream=True, quality="high",
                                         extra_headers={"Idempotency-Key": key}))  # fmt: skip
    done = [e for e in events if e.type == "image_generation.completed"]
    assert len(done) == 1 and base64.b64decode(done[0].b64_json)[:4] == b"\x89PNG"
    assert router.accepted == 1  # generated once


@pytest.mark.integration
def test_a_replayed_wait_gets_a_result_that_arrives_while_it_reads_redis(redis_server, live_service):
    """A retry through a new router (the router that accepted the generation was killed) waits for
    the generation: it reads Redis for the results already there while the router's results
    listener follows the ``done`` stream. A result that a worker finishes in the middle of that
    read reaches the wait both ways; the wait answers with it (it once raised InvalidStateError,
    which the handler answered 500)."""
    from argusdiff.service import schemas as s
    from argusdiff.service.idempotency import IdempotentSubmit
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkItem, WorkResult
    from workers.standin import solid_png

    server = live_service(service_settings(redis_url=redis_server.url, workers=0), ready=False)
    service, dispatch = server.service, server.service.dispatch
    loop = dispatch.loop

    def on_loop(coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    # the dead router's accepted generation: its record and its one item, queued
    gid, level = "gen-" + uuid.uuid4().hex[:24], service.router.profile.ids[0]
    rid = f"{gid}-0"
    record = {"id": gid, "created": 1, "request_ids": [rid], "levels": [level], "response_format": "b64_json"}
    item = WorkItem(request_id=rid, prompt="a lighthouse", level=level, seed=1, meta={"group": gid})
    on_loop(dispatch.aio.enqueue([item], (gid, record, 60.0), deadline=False))
    worker = RedisWorkQueue(redis_server.url, consumer="w-test", images=dispatch.images)
    taken = worker.get(level, timeout=5)
    assert taken is not None and taken.request_id == rid

    real = dispatch.aio.fetch_results
    hooked: list[list[str]] = []

    async def fetch_results(request_ids: list[str]):
        if rid in request_ids and not hooked:  # the replayed wait's read: the worker finishes now
            hooked.append(list(request_ids))
            result = WorkResult(request_id=rid, level=level, image_png=solid_png(8, 8, (1, 2, 3)), seed=1)
            await asyncio.to_thread(worker.result, rid, result)
            await asyncio.to_thread(worker.ack, taken)
            for _ in range(500):  # until the listener has delivered it (bounded)
                if rid not in dispatch._deliveries:
                    break
                await asyncio.sleep(0.01)
            assert rid not in dispatch._deliveries, "the results listener did not deliver the result"
        return await real(request_ids)

    dispatch.aio.fetch_results = fetch_results
    idem = IdempotentSubmit(service)
    spec = s.parse_native({"prompt": "a lighthouse", "seed": 1}, service.router.limits, None)
    sub = on_loop(idem._replay(gid, spec))
    assert sub is not None and sub.request_ids == (rid,)
    results = on_loop(idem.wait(sub, 10.0))
    assert hooked, "the replayed wait never read Redis"
    assert [(r.request_id, r.ok) for r in results] == [(rid, True)]
    assert results[0].image_ref  # the worker's image, in the image store (claim check)


@pytest.mark.integration
def test_a_replayed_wait_outlasts_a_redis_outage(redis_server, live_service):
    """A retried request waits for its accepted generation; Redis goes away meanwhile. The wait's
    reads of Redis fail, and it goes on waiting (the work is accepted and stays queued): when Redis
    is back and the worker finishes, the wait answers with the result (it once ended with the
    read's QueueUnavailable, which the handler answered 500)."""
    from argusdiff.service import schemas as s
    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.idempotency import IdempotentSubmit
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkItem, WorkResult
    from workers.standin import solid_png

    server = live_service(service_settings(redis_url=redis_server.url, workers=0), ready=False)
    service, dispatch = server.service, server.service.dispatch

    def on_loop(coro):
        return asyncio.run_coroutine_threadsafe(coro, dispatch.loop)

    gid, level = "gen-" + uuid.uuid4().hex[:24], service.router.profile.ids[0]
    rid = f"{gid}-0"
    record = {"id": gid, "created": 1, "request_ids": [rid], "levels": [level], "response_format": "b64_json"}
    item = WorkItem(request_id=rid, prompt="a lighthouse", level=level, seed=1, meta={"group": gid})
    on_loop(dispatch.aio.enqueue([item], (gid, record, 60.0), deadline=False)).result(30)
    idem = IdempotentSubmit(service)
    spec = s.parse_native({"prompt": "a lighthouse", "seed": 1}, service.router.limits, None)
    sub = on_loop(idem._replay(gid, spec)).result(30)
    assert sub is not None

    real, failed = dispatch.fetch_results, []

    async def fetch_results(request_ids, record=None):  # counts the reads Redis failed
        try:
            return await real(request_ids, record)
        except QueueUnavailable:
            failed.append(list(request_ids))
            raise

    dispatch.fetch_results = fetch_results
    waiting = on_loop(idem.wait(sub, 60.0))
    redis_server.stop()
    assert wait_until(lambda: failed or waiting.done(), 30), "the wait never read Redis during the outage"
    assert not waiting.done(), waiting.exception()
    redis_server.start()  # same port; AOF kept the record and the queued item
    worker = RedisWorkQueue(redis_server.url, consumer="w-test", images=dispatch.images)
    taken = worker.get(level, timeout=5)
    assert taken is not None and taken.request_id == rid
    worker.result(rid, WorkResult(request_id=rid, level=level, image_png=solid_png(8, 8, (1, 2, 3)), seed=1))
    worker.ack(taken)
    results = waiting.result(30)
    assert [(r.request_id, r.ok) for r in results] == [(rid, True)] and results[0].image_ref
