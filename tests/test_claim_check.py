"""The claim check of the Redis transport: no image bytes in Redis. Workers write images (final and
partial) into the image store, the router writes an edit's inputs there, and Redis carries only
their keys. Checked with a real redis-server (every command it runs, seen through MONITOR, and
every key it holds at the end), a real S3 server as the image store and real worker processes."""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import shutil
import subprocess
import time
import uuid

import httpx
import pytest
from fixtures_service import redis_client, service_settings

from argusdiff.service.images import LocalImageStore
from argusdiff.service.worker import wait_until

pytestmark = pytest.mark.integration

#: image files as they start (PNG, JPEG, WebP's RIFF)
MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"RIFF")
_B64_RUN = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}")


def images_in(data: bytes) -> list[str]:
    """Where ``data`` holds an image: its raw bytes, as MONITOR escapes them, or base64 of one."""
    found = []
    for magic in MAGIC:
        if magic in data:
            found.append(f"raw {magic!r}")
    for escaped in (rb"\x89PNG", rb"\xff\xd8\xff"):
        if escaped in data:
            found.append(f"escaped {escaped!r}")
    for signature in (b"iVBORw0KGgo", b"/9j/", b"UklGR"):  # base64 of each magic
        if signature in data:
            found.append(f"base64 signature {signature!r}")
    for run in _B64_RUN.findall(data):
        for start in range(4):  # the run may begin mid-quantum of a longer token
            chunk = run[start:]
            chunk = chunk[: len(chunk) - len(chunk) % 4]
            try:
                raw = base64.b64decode(chunk, validate=True)
            except (binascii.Error, ValueError):
                continue
            if raw.startswith(MAGIC):
                found.append(f"base64 image ({len(run)} chars)")
                break
    return found


def test_the_detector_finds_images_however_they_are_written():
    from workers.standin import solid_png

    png = solid_png(8, 8, (1, 2, 3))
    assert images_in(png) and images_in(json.dumps({"x": base64.b64encode(png).decode()}).encode())
    assert images_in(b'"XADD" "q" "*" "item" "\\x89PNG\\r\\n"')  # as MONITOR shows raw bytes
    assert images_in(b"prefix" + base64.b64encode(png))  # base64 after other letters
    assert not images_in(json.dumps({"image_ref": "gen-" + "0" * 24 + "-0.png", "b": "A" * 400}).encode())


class Monitor:
    """``redis-cli MONITOR`` on every node: every command the servers run, as text, into files."""

    def __init__(self, ports: list[int], path) -> None:
        self.paths = [path.with_suffix(f".{p}.txt") for p in ports]
        self.fhs = [open(p, "wb") for p in self.paths]  # noqa: SIM115
        self.procs = [
            subprocess.Popen([shutil.which("redis-cli"), "-p", str(port), "monitor"], stdout=fh,
                             stderr=subprocess.DEVNULL)
            for port, fh in zip(ports, self.fhs, strict=True)
        ]  # fmt: skip

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> list[bytes]:
        for proc, fh in zip(self.procs, self.fhs, strict=True):
            proc.terminate()
            proc.wait(timeout=10)
            fh.close()
        return [p.read_bytes() for p in self.paths]


def redis_values(client) -> dict[str, bytes]:
    """Every key's value(s), as bytes."""
    out = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            value = client.get(key) or b""
        elif kind == "hash":
            value = b"\n".join(k + b"=" + v for k, v in client.hgetall(key).items())
        elif kind == "stream":
            value = b"\n".join(k + b"=" + v for _id, fields in client.xrange(key) for k, v in fields.items())
        elif kind == "list":
            value = b"\n".join(client.lrange(key, 0, -1))
        elif kind == "set":
            value = b"\n".join(client.smembers(key))
        elif kind == "zset":
            value = b"\n".join(client.zrange(key, 0, -1))
        else:
            value = b""
        out[key.decode()] = value
    return out


def _png(size=(64, 64), mode="RGB", colour=(200, 30, 30), hole: int = 0) -> bytes:
    from PIL import Image

    img = Image.new(mode, size, colour if mode == "RGB" else (*colour, 255))
    if hole:
        img.paste((0, 0, 0, 0), (0, 0, hole, hole))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _sse(text: str) -> dict[str, list[dict]]:
    events: dict[str, list[dict]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name:
            events.setdefault(name, []).append(json.loads(line[6:]))
    return events


def test_no_image_bytes_in_redis_with_s3_and_real_workers(redis_any, live_service, worker_procs, s3_env, tmp_path):
    import boto3
    from botocore.config import Config

    prefix = f"claim-{uuid.uuid4().hex[:8]}/"
    settings = service_settings(
        redis_url=redis_any.url, workers=0, image_store="s3", image_s3_prefix=prefix
    ).model_dump()
    settings["cache"].update(store="s3", s3_bucket="argusdiff-test", s3_endpoint_url=s3_env["S3_ENDPOINT_URL"])
    settings = type(service_settings()).model_validate(settings)
    monitor = Monitor(getattr(redis_any, "ports", [redis_any.port]), tmp_path / "monitor")
    assert wait_until(monitor.running, 5)
    try:
        server = live_service(settings, ready=False)
        # the workers are told nothing about the image store: they follow the router's announcement
        worker_procs(redis_any.url, "w1", scale=0.002)
        worker_procs(redis_any.url, "w2", scale=0.002)
        assert wait_until(lambda: len(server.service.serving) == 2, 30)
        native = f"{server.url}/v1/argusdiff/generations"
        openai_gen = f"{server.url}/v1/images/generations"

        sync = httpx.post(native, json={"prompt": "two lighthouses", "n": 2}, timeout=60).json()
        assert [base64.b64decode(d["b64_json"])[:4] for d in sync["data"]] == [b"\x89PNG"] * 2
        url = httpx.post(openai_gen, json={"prompt": "by url", "response_format": "url"}, timeout=60).json()
        assert httpx.get(url["data"][0]["url"], timeout=30).content.startswith(b"\x89PNG")
        later = httpx.post(native, json={"prompt": "polled", "wait": False, "output_format": "jpeg"}).json()["id"]

        def polled() -> dict | None:
            body = httpx.get(f"{native}/{later}", timeout=30).json()
            return body if body.get("status") == "completed" else None

        assert wait_until(lambda: polled() is not None, 30)
        assert base64.b64decode(polled()["data"][0]["b64_json"])[:3] == b"\xff\xd8\xff"
        streamed = httpx.post(openai_gen, json={"prompt": "a harbour", "stream": True, "partial_images": 2}, timeout=60)
        events = _sse(streamed.text)
        assert len(events["image_generation.partial_image"]) == 2
        for e in events["image_generation.partial_image"] + events["image_generation.completed"]:
            assert base64.b64decode(e["b64_json"])[:4] == b"\x89PNG"
        mask = _png(mode="RGBA", hole=16)
        edited = httpx.post(
            f"{server.url}/v1/images/edits",
            files={"image": ("x.png", _png()), "mask": ("m.png", mask)},
            data={"prompt": "a red door", "response_format": "b64_json"},
            timeout=60,
        )
        assert edited.status_code == 200, edited.text
        assert base64.b64decode(edited.json()["data"][0]["b64_json"])[:4] == b"\x89PNG"
        values = redis_values(redis_client(redis_any))
    finally:
        seen = monitor.stop()

    # the store holds the images, their partial images and the edit's inputs ...
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=s3_env["S3_ENDPOINT_URL"],
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
    )  # fmt: skip
    names = [o["Key"][len(prefix) :] for o in s3.list_objects_v2(Bucket="argusdiff-test", Prefix=prefix)["Contents"]]
    assert {f"{sync['id']}-0.png", f"{sync['id']}-1.png", f"{later}-0.jpeg"} <= set(names)
    assert sum(".p" in n for n in names) >= 2 and sum(n.endswith(".in.png") for n in names) == 1
    assert sum(n.endswith(".mask.png") for n in names) == 1
    # ... and Redis never held one: not in any command a node ran, not in any key it keeps
    everything = b"".join(seen)
    assert everything.count(b"\n") > 100 and b"XADD" in everything.upper() and b"PUBLISH" in everything.upper()
    for line in everything.splitlines():
        assert not images_in(line), (images_in(line), line[:300])
    assert any(k.endswith(f":result:{sync['id']}-0") for k in values)
    for key, value in values.items():
        assert not images_in(value), (key, images_in(value))


def test_an_edit_input_reaches_the_worker_through_the_store_only(redis_any, tmp_path):
    """The router writes an edit's input image and mask into the store; the stream entry names them;
    the worker gets them back, and an item it gives back goes into Redis without them again."""
    import asyncio

    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkItem

    images = LocalImageStore(tmp_path)
    rid = "gen-" + "ab" * 12 + "-0"
    png, mask = _png(), _png(mode="RGBA", hole=8)
    item = WorkItem(
        request_id=rid, prompt="p", level="lv", meta={
            "edit_image": base64.b64encode(png).decode(), "edit_mask": base64.b64encode(mask).decode(),
        },
    )  # fmt: skip

    async def enqueue():
        aio = AsyncRedisDispatch(redis_any.url, namespace="cc", images=images)
        try:
            await aio.enqueue([item], (rid.rsplit("-", 1)[0], {"id": "x"}, 60))
        finally:
            await aio.close()

    asyncio.run(enqueue())
    q = RedisWorkQueue(redis_any.url, namespace="cc", consumer="w", images=images)
    assert images.get(f"{rid}.in.png") == png and images.get(f"{rid}.mask.png") == mask
    raw = b"".join(v for _id, f in q.r.xrange(q.keys.stream("lv")) for v in f.values())
    assert not images_in(raw) and f"{rid}.in.png".encode() in raw
    got = q.get("lv", timeout=1)
    assert base64.b64decode(got.meta["edit_image"]) == png and base64.b64decode(got.meta["edit_mask"]) == mask
    q.nack(got)  # given back: into Redis by key again
    raw = b"".join(v for _id, f in q.r.xrange(q.keys.stream("lv")) for v in f.values())
    assert not images_in(raw) and q.qsize("lv") == 1
    again = q.get("lv", timeout=1)
    assert again.attempt == 1 and base64.b64decode(again.meta["edit_image"]) == png


def test_step_events_carry_keys_within_a_byte_bound(redis_any, tmp_path):
    """A partial image goes into the store; its event names it and stays under EVENT_MAX_BYTES.
    An event with bytes, or larger than the bound, is refused."""
    from argusdiff.service.transport.redis_streams import EVENT_MAX_BYTES, RedisWorkQueue, event_to_json
    from workers.messages import WorkItem
    from workers.standin import full_size_png

    images = LocalImageStore(tmp_path)
    q = RedisWorkQueue(redis_any.url, namespace="ev", consumer="w", images=images)
    rid = "gen-" + "cd" * 12 + "-0"
    q.put("lv", WorkItem(request_id=rid, prompt="p", level="lv", meta={"stream": "1", "events": "ev:events:r1"}))
    got = q.get("lv", timeout=1)
    sub = q.r.pubsub(ignore_subscribe_messages=True)
    sub.subscribe("ev:events:r1")
    assert wait_until(lambda: sub.get_message(timeout=0.05) is None and sub.subscribed, 5)
    big = full_size_png("1024x1024")  # a real-size partial image: ~1.5 MB
    q.publish_event(rid, {"type": "partial", "index": 0, "step": 7, "steps": 10, "level": "lv", "png": big})
    msg = None
    deadline = time.monotonic() + 5
    while msg is None and time.monotonic() < deadline:
        msg = sub.get_message(timeout=0.1)
    sub.close()
    assert msg is not None and len(msg["data"]) <= EVENT_MAX_BYTES and not images_in(msg["data"])
    assert json.loads(msg["data"])["event"]["ref"] == f"{rid}.p7.png" and images.get(f"{rid}.p7.png") == big
    q.ack(got)
    with pytest.raises(ValueError, match="key, not its bytes"):
        event_to_json(rid, {"type": "partial", "png": b"\x89PNG"})
    with pytest.raises(ValueError, match="larger than"):
        event_to_json(rid, {"type": "progress", "level": "x" * EVENT_MAX_BYTES})


def test_a_result_with_an_image_and_no_store_is_refused(redis_any):
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkResult

    q = RedisWorkQueue(redis_any.url, namespace="ns-none", consumer="w")
    with pytest.raises(ValueError, match="no image bytes"):
        q.result("gen-" + "0" * 24 + "-0", WorkResult(request_id="r", level="a", image_png=b"\x89PNG"))
    assert q.r.keys("{ns-none}:result:*") == []
