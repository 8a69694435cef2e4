"""Streaming (server-sent events in OpenAI's shape) with the official ``openai`` client: embedded
and through Redis (stand-in TEST MODE workers), and on the real tiny diffusers pipelines, whose
partial images are decoded from intermediate latents; a streaming client that goes away cancels
its work. Plus the image store: Redis keeps no image once the router has it, S3 presigned URLs."""

from __future__ import annotations

import base64
import io
import json
import socket

import httpx
import pytest
from fixtures_service import demo_model_settings, redis_client, service_settings

from argusdiff.service.worker import wait_until

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


def _client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _collect(stream) -> dict[str, list]:
    out: dict[str, list] = {}
    for event in stream:
        out.setdefault(event.type, []).append(event)
    return out


def test_openai_client_generates_with_dalle3_a_mapped_size_and_jpeg(live_service):
    server = live_service(service_settings())
    out = _client(server).images.generate(
        prompt="a red fox in the snow", model="dall-e-3", size="1024x1024", output_format="jpeg",
        response_format="b64_json", quality="hd",
    )  # fmt: skip
    native = server.service.router.limits.sizes[0]
    assert (out.size, out.output_format, out.quality, out.background) == (native, "jpeg", "high", "opaque")
    assert base64.b64decode(out.data[0].b64_json)[:2] == b"\xff\xd8"
    r = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a", "background": "transparent"})
    assert r.headers["argusdiff-unhonoured"] == "background=transparent" and r.json()["background"] == "opaque"


def test_openai_client_streams_progress_and_partial_images_embedded(live_service):
    server = live_service(service_settings(stand_in_scale=0.002))
    stream = _client(server).images.generate(
        prompt="a lighthouse at dusk", model="gpt-image-1", stream=True, partial_images=2, output_format="webp"
    )
    events = _collect(stream)
    partial = events["image_generation.partial_image"]
    assert [e.partial_image_index for e in partial] == [0, 1]
    assert all(base64.b64decode(e.b64_json)[8:12] == b"WEBP" and e.output_format == "webp" for e in partial)
    (done,) = events["image_generation.completed"]
    assert base64.b64decode(done.b64_json)[8:12] == b"WEBP"
    progress = events["argusdiff.progress"]
    steps = progress[-1].steps
    assert [e.step for e in progress] == list(range(progress[0].step, steps + 1)) and progress[-1].step == steps


def test_openai_client_streams_through_redis(redis_any, live_service, worker_procs):
    server = live_service(service_settings(redis_url=redis_any.url, workers=0), ready=False)
    worker_procs(redis_any.url, "w1", scale=0.002)
    assert wait_until(lambda: server.service.serving, 30)
    events = _collect(_client(server).images.generate(prompt="a castle", stream=True, partial_images=3))
    assert [e.partial_image_index for e in events["image_generation.partial_image"]] == [0, 1, 2]
    assert len(events["image_generation.completed"]) == 1 and len(events["argusdiff.progress"]) > 3


def test_redis_holds_no_image_only_its_key_in_the_image_store(redis_any, live_service, worker_procs):

    server = live_service(service_settings(redis_url=redis_any.url, workers=0), ready=False)
    worker_procs(redis_any.url, "w1")
    assert wait_until(lambda: server.service.serving, 30)
    r = redis_client(redis_any)
    native = f"{server.url}/v1/argusdiff/generations"

    def stored(gid: str) -> dict:
        assert wait_until(lambda: r.get(f"{{argusdiff}}:result:{gid}-0") is not None, 10), gid
        raw = json.loads(r.get(f"{{argusdiff}}:result:{gid}-0"))
        assert raw["image_png"] is None, f"{gid}: an image in Redis"
        return raw

    sync = httpx.post(native, json={"prompt": "delivered at once"}, timeout=30).json()
    assert sync["data"][0]["b64_json"] and stored(sync["id"])["image_ref"] == f"{sync['id']}-0.png"
    url = httpx.post(native, json={"prompt": "by url", "response_format": "url"}, timeout=30).json()
    assert stored(url["id"])["image_ref"] == f"{url['id']}-0.png"
    assert httpx.get(url["data"][0]["url"]).content.startswith(b"\x89PNG")
    later = httpx.post(native, json={"prompt": "polled", "wait": False, "output_format": "jpeg"}).json()["id"]
    assert stored(later)["image_ref"] == f"{later}-0.jpeg"
    polled = httpx.get(f"{native}/{later}").json()
    assert base64.b64decode(polled["data"][0]["b64_json"])[:2] == b"\xff\xd8"


def test_a_streaming_client_that_goes_away_cancels_its_work(live_service):
    server = live_service(service_settings(workers=1, stand_in_scale=1.0))
    router = server.service.router
    body = json.dumps({"prompt": "a slow one", "stream": True, "quality": "high"}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    sock.settimeout(30)
    seen = b""
    while b"event: argusdiff.progress" not in seen:  # it runs ...
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    rid = next(iter(router.inflight))
    sock.close()  # ... and its client leaves
    assert wait_until(lambda: router.completed == 1, 30)
    assert server.service.dispatch.results.get(rid) is None

    def gone() -> bool:
        text = httpx.get(f"{server.url}/metrics").text
        return 'argusdiff_http_responses_total{route="images_generations",status="499"} 1.0' in text

    assert wait_until(gone, 10)


def test_a_stream_waiting_in_the_queue_gets_sse_pings(live_service):
    """One stand-in worker busy with a long image: a stream queued behind it hears an SSE comment
    every ``sse_ping_s`` (here 0.05 s instead of 15 s) until its first step, so a proxy's read
    timeout never cuts it; the official client ignores the comments and gets its image."""
    server = live_service(service_settings(workers=1, stand_in_scale=0.3, sse_ping_s=0.05))
    busy = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a long one", "wait": False})
    assert busy.status_code == 202
    body = {"prompt": "a queued one", "stream": True, "response_format": "b64_json"}
    lines: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/images/generations", json=body, timeout=60) as r:
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith("event: image_generation.completed"):
                break
    first_event = next(i for i, ln in enumerate(lines) if ln.startswith("event:"))
    pings = [ln for ln in lines[:first_event] if ln == ": ping"]
    assert len(pings) >= 2, lines[: first_event + 1]
    out = _collect(_client(server).images.generate(prompt="after", stream=True))
    assert len(out["image_generation.completed"]) == 1


@pytest.mark.slow
def test_partial_images_are_decoded_from_the_latents_of_real_pipelines(live_service, demo_models_dir, tmp_path):
    from PIL import Image

    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus"))
    client = _client(server)
    events = _collect(client.images.generate(prompt="a red bicycle", stream=True, partial_images=2, quality="high"))
    partial = events["image_generation.partial_image"]
    assert [e.partial_image_index for e in partial] == [0, 1]
    final = base64.b64decode(events["image_generation.completed"][0].b64_json)
    images = [Image.open(io.BytesIO(base64.b64decode(e.b64_json))) for e in partial] + [Image.open(io.BytesIO(final))]
    assert {im.size for im in images} == {(64, 64)}
    assert len({im.tobytes() for im in images}) == 3  # each a different point of the trajectory
    progress = events["argusdiff.progress"]
    assert [e.step for e in progress] == list(range(0, progress[-1].steps + 1))


def _s3_settings(s3_env, **service):
    settings = service_settings(image_store="s3", image_s3_prefix="test-images/", **service)
    data = settings.model_dump()
    data["cache"].update(store="s3", s3_bucket="argusdiff-test", s3_endpoint_url=s3_env["S3_ENDPOINT_URL"])
    return type(settings).model_validate(data)


def test_url_images_in_s3_are_presigned(live_service, s3_env):
    server = live_service(_s3_settings(s3_env, image_s3_public_url=s3_env["S3_ENDPOINT_URL"]))
    out = _client(server).images.generate(prompt="a", output_format="jpeg")
    url = out.data[0].url
    assert url.startswith(s3_env["S3_ENDPOINT_URL"]) and "X-Amz-Signature=" in url
    img = httpx.get(url)
    assert img.status_code == 200 and img.content[:2] == b"\xff\xd8" and img.headers["content-type"] == "image/jpeg"
    key = url.split("?")[0].rsplit("/", 1)[1]
    local = httpx.get(f"{server.url}/v1/images/{key}")  # the router's image route redirects to the object
    assert local.status_code == 307 and "X-Amz-Signature=" in local.headers["location"]


def test_url_images_in_a_private_s3_store_are_served_by_the_router(live_service, s3_env):
    server = live_service(_s3_settings(s3_env))  # the store has no address clients reach
    url = _client(server).images.generate(prompt="a", output_format="webp").data[0].url
    assert url.startswith(f"{server.url}/v1/images/gen-") and url.endswith(".webp")
    img = httpx.get(url)
    assert img.status_code == 200 and img.headers["content-type"] == "image/webp" and img.content[8:12] == b"WEBP"


def test_step_events_go_only_to_the_router_that_streams(redis_any, live_service, worker_procs):
    import redis

    server = live_service(service_settings(redis_url=redis_any.url, workers=0), ready=False)
    worker_procs(redis_any.url, "w1", scale=0.002)
    assert wait_until(lambda: server.service.serving, 30)
    listener = redis.Redis.from_url(redis_any.url).pubsub(ignore_subscribe_messages=True)
    listener.psubscribe("{argusdiff}:events*")  # the shared channel and every router's
    assert wait_until(lambda: listener.get_message(timeout=0.1) is None and listener.subscribed, 10)
    events = _collect(_client(server).images.generate(prompt="a harbour", stream=True, partial_images=2))
    assert len(events["image_generation.partial_image"]) == 2
    channels: dict[str, int] = {}
    while (msg := listener.get_message(timeout=1.0)) is not None:
        channels[msg["channel"].decode()] = channels.get(msg["channel"].decode(), 0) + 1
    listener.close()
    mine = server.service.dispatch.aio.events_channel
    assert set(channels) == {mine} and channels[mine] >= 2 + len(events["argusdiff.progress"])
