"""Cancel that stops the GPU: a cancelled request's denoising loop stops at its next step (diffusers'
``callback_on_step_end`` and the pipeline's interrupt), the worker is free at once, and the
generation ends ``cancelled`` — in process and over Redis, by ``DELETE`` and by a client that goes
away. Real tiny pipelines; a step counter (the denoising network's forward calls) shows the run
stopped early."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from fixtures_service import demo_model_settings, service_settings

from argusdiff.domain import ApproxLevel, Strategy
from argusdiff.service.transport.memory import InProcessWorkQueue
from argusdiff.service.worker import wait_until
from workers.cancel import CANCELLED
from workers.loop import Worker
from workers.messages import WorkItem
from workers.progress import events_to

pytestmark = pytest.mark.integration

STREAM = {"stream": "1", "partial_images": "0"}
SD = ApproxLevel(id="sd", strategy=Strategy.SM, model="demo-tiny-sd", steps=8, skip=0, latency_s={1: 0.1},
                 quality=1.0, load_time_s=0.1)  # fmt: skip


def _ac(k: int, model: str) -> ApproxLevel:
    return ApproxLevel(id=f"ac-k{k}", strategy=Strategy.AC, model=model, steps=8, skip=k,
                       latency_s={1: 0.1}, quality=1.0, load_time_s=0.1)  # fmt: skip


def _cancel_at(step: int, cancel) -> tuple[list[int], object]:
    """A step-event sink that cancels when the run reports ``step`` (steps seen are recorded)."""
    seen: list[int] = []

    def sink(rid: str, event: dict) -> None:
        if event["type"] == "progress":
            seen.append(event["step"])
            if event["step"] == step:
                cancel(rid)

    return seen, sink


def test_a_cancelled_run_stops_at_its_next_step_and_frees_the_worker(demo_registry):
    from workers.sm import ModelExecutor

    queue = InProcessWorkQueue()
    worker = Worker("w", queue, lambda level: ModelExecutor(SD, demo_registry), level="sd", poll_s=0.01)
    queue.put("sd", WorkItem("doomed", "a lighthouse in a storm", "sd", seed=1, meta=STREAM))
    seen, sink = _cancel_at(2, lambda rid: queue.stop([rid]))
    with events_to(sink):
        assert worker.run_once() == 1
    res = queue.wait_result("doomed", 5)
    assert res.error_type == CANCELLED and res.image_png is None
    assert res.unet_calls == 2 and seen == [0, 1, 2]  # 2 of 8 steps ran, nothing after the cancel
    assert worker.stats.cancelled == 1 and queue.pending("sd") == 0
    queue.put("sd", WorkItem("next", "a quiet harbour", "sd", seed=2))  # the worker is free at once
    assert worker.run_once() == 1
    nxt = queue.wait_result("next", 5)
    assert nxt.ok and nxt.unet_calls == 8 and not queue.cancelled(["doomed", "next"])


@pytest.mark.parametrize("model", ["demo-tiny-sdxl", "demo-tiny-sd"])  # img2img resume; the SD resume loop
def test_a_cancelled_cache_resume_stops_too(demo_registry, memory_cache, hash_embedder, model):
    from workers.ac import ApproxCacheExecutor

    prompt = "a red cube on a wooden table"
    full = ApproxCacheExecutor(_ac(0, model), demo_registry, cache=memory_cache, embed=hash_embedder,
                               capture_ks=(4,))  # fmt: skip
    full.run([WorkItem("seed", prompt, "ac-k0", seed=5)])
    queue = InProcessWorkQueue()
    k4 = ApproxCacheExecutor(_ac(4, model), demo_registry, cache=memory_cache, embed=hash_embedder)
    worker = Worker("w", queue, lambda level: k4, level="ac-k4", poll_s=0.01)
    queue.put("ac-k4", WorkItem("r", prompt, "ac-k4", seed=5, meta=STREAM))
    seen, sink = _cancel_at(5, lambda rid: queue.stop([rid]))
    with events_to(sink):
        worker.run_once()
    res = queue.wait_result("r", 5)
    assert res.error_type == CANCELLED and res.unet_calls == 1 and seen == [4, 5]  # resumed at K = 4, 1 step


def test_a_batch_runs_on_while_one_of_its_requests_is_wanted(demo_registry):
    from workers.sm import ModelExecutor

    queue = InProcessWorkQueue()
    worker = Worker("w", queue, lambda level: ModelExecutor(SD, demo_registry), level="sd", batch_size=2, poll_s=0.01)
    queue.put("sd", WorkItem("gone", "a cat", "sd", seed=1, meta=STREAM))
    queue.put("sd", WorkItem("kept", "a dog", "sd", seed=2))
    _, sink = _cancel_at(2, lambda rid: queue.stop([rid]))
    with events_to(sink):
        assert worker.run_once() == 2
    assert queue.wait_result("kept", 5).ok and queue.wait_result("gone", 5).unet_calls == 8


def test_an_item_cancelled_while_queued_is_skipped(demo_registry):
    from workers.sm import ModelExecutor

    queue = InProcessWorkQueue()
    worker = Worker("w", queue, lambda level: ModelExecutor(SD, demo_registry), level="sd", poll_s=0.01)
    queue.put("sd", WorkItem("late", "a cat", "sd", seed=1))
    queue.stop(["late"])  # another router cancelled it: it cannot take the stream entry out
    assert worker.run_once() == 0
    res = queue.wait_result("late", 5)
    assert res.error_type == CANCELLED and res.unet_calls == 0 and worker.stats.cancelled == 1


def test_over_redis_a_cancel_key_stops_the_running_pipeline(demo_registry, redis_server):
    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.sm import ModelExecutor

    queue = RedisWorkQueue(redis_server.url, namespace="cx", consumer="w", cancel_poll_s=0.0)
    worker = Worker("w", queue, lambda level: ModelExecutor(SD, demo_registry), level="sd", poll_s=0.05)

    def router_cancels(rid: str) -> None:  # what a router's DELETE does, from any router
        async def go() -> None:
            aio = AsyncRedisDispatch(redis_server.url, namespace="cx")
            await aio.request_cancel([rid], 60)
            await aio.close()

        asyncio.run(go())

    queue.put("sd", WorkItem("doomed", "a fox in the snow", "sd", seed=3, meta=STREAM))
    seen, sink = _cancel_at(3, router_cancels)
    with events_to(sink):
        assert worker.run_once() == 1
    res = queue.fetch_result("doomed")
    assert res.error_type == CANCELLED and res.unet_calls == 3 and seen == [0, 1, 2, 3]
    assert queue.pending("sd") == 0 and queue.qsize("sd") == 0  # acked: the worker is free


class _Gate:
    """Blocks the denoising network at its ``at``-th forward call until released (the test acts
    while the pipeline is provably mid-run), and counts the calls."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    def hook(self, original):
        def forward(module, *args, **kwargs):
            self.calls += 1
            if self.calls == self.at:
                self.reached.set()
                assert self.release.wait(60)
            return original(module, *args, **kwargs)

        return forward


@pytest.fixture
def gated_unet(monkeypatch):
    from diffusers import UNet2DConditionModel

    gate = _Gate(at=2)
    monkeypatch.setattr(UNet2DConditionModel, "forward", gate.hook(UNet2DConditionModel.forward))
    yield gate
    gate.release.set()


def _metric(server, line: str) -> float:
    for row in httpx.get(f"{server.url}/metrics").text.splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


def _cancelled(server) -> float:
    """Images counted ``cancelled`` at any level."""
    rows = httpx.get(f"{server.url}/metrics").text.splitlines()
    return sum(float(r.rsplit(" ", 1)[1]) for r in rows if r.startswith("argusdiff_requests_total{")
               and 'outcome="cancelled"' in r)  # fmt: skip


def test_delete_stops_a_running_generation(live_service, demo_models_dir, tmp_path, gated_unet):
    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus"))
    url = f"{server.url}/v1/argusdiff/generations"
    gid = httpx.post(url, json={"prompt": "a red barn", "wait": False}, timeout=30).json()["id"]
    assert gated_unet.reached.wait(120)  # the worker is in its 2nd denoising step
    r = httpx.delete(f"{url}/{gid}", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["status"], body["n"], body["done"]) == (gid, "cancelled", 1, 0)
    gated_unet.release.set()
    worker = server.service.workers[0].worker
    assert wait_until(lambda: worker.stats.cancelled == 1, 60)
    assert gated_unet.calls == 2  # stopped after step 2 of 8: the GPU was freed, not the result dropped
    assert httpx.get(f"{url}/{gid}").json()["status"] == "cancelled"
    assert httpx.delete(f"{url}/{gid}").json()["status"] == "cancelled"  # idempotent
    assert _metric(server, 'argusdiff_cancels_total{how="delete",stage="running"}') == 1
    assert wait_until(lambda: _metric(server, 'argusdiff_requests_total{level="xl-k0",outcome="cancelled"}') == 1, 10)
    assert not server.service.router.inflight
    done = httpx.post(url, json={"prompt": "a quiet harbour"}, timeout=120)  # the worker serves again
    assert done.status_code == 200 and httpx.delete(f"{url}/{done.json()['id']}").status_code == 409
    assert httpx.delete(f"{url}/gen-nope").status_code == 404


def test_a_client_that_goes_away_stops_its_running_generation(live_service, demo_models_dir, tmp_path, gated_unet):
    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus"))
    body = {"prompt": "a red barn", "stream": True, "response_format": "b64_json"}
    with httpx.stream("POST", f"{server.url}/v1/images/generations", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert gated_unet.reached.wait(120)
    # the connection is closed: the router cancels, and the worker stops at its next step
    line = 'argusdiff_cancels_total{how="disconnect",stage="running"}'
    assert wait_until(lambda: _metric(server, line) == 1, 30)
    gated_unet.release.set()
    worker = server.service.workers[0].worker
    assert wait_until(lambda: worker.stats.cancelled == 1, 60) and gated_unet.calls == 2


def test_delete_over_redis(live_service, redis_any, worker_procs):
    """Distributed: a stand-in worker process (batches of the profiled seconds, slept step by step);
    DELETE of the generation that runs and of the one behind it (queued, or in the same batch):
    both end cancelled, the worker stops mid-run and serves the next request."""
    from argusdiff.config import Settings

    base = service_settings("sm-a100", redis_url=redis_any.url, workers=0, stand_in_scale=None).model_dump()
    server = live_service(Settings.model_validate(base), ready=False)
    worker_procs(redis_any.url, "wr-0", scale=1.0)
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 60)
    url = f"{server.url}/v1/argusdiff/generations"
    first = httpx.post(url, json={"prompt": "a red barn", "wait": False}, timeout=30).json()
    second = httpx.post(url, json={"prompt": "a red cat", "wait": False}, timeout=30).json()
    queue = server.service.dispatch.queue
    assert wait_until(lambda: queue.pending(first["levels"][0]) == 1, 30)  # the worker runs the first
    for gid in (second["id"], first["id"]):
        r = httpx.delete(f"{url}/{gid}", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    queued = _metric(server, 'argusdiff_cancels_total{how="delete",stage="queued"}')
    running = _metric(server, 'argusdiff_cancels_total{how="delete",stage="running"}')
    assert queued + running == 2 and running >= 1  # the second was queued, or in the first's batch
    assert wait_until(lambda: _cancelled(server) == 2, 30)
    assert wait_until(lambda: not server.service.router.inflight, 10)
    # the worker stopped the running one mid-run (a Cancelled result comes only from a stop)
    beat = lambda: httpx.get(f"{server.url}/v1/plan").json()["workers"]["wr-0"]  # noqa: E731
    assert wait_until(lambda: beat()["cancelled"] == running, 10), beat()
    fresh = httpx.post(url, json={"prompt": "a cat"}, timeout=60)
    assert fresh.status_code == 200, fresh.text
