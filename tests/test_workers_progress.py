"""Step events of streamed requests on the tiny real pipelines: a progress event per step, partial
images decoded from the intermediate latents at evenly spaced steps, a resumed cache hit that
starts at its K, and no events (nor cost) for requests that do not stream."""

from __future__ import annotations

import io

import pytest

from argusdiff.domain import ApproxLevel, Strategy
from workers.messages import WorkItem
from workers.progress import events_to, partial_steps

pytestmark = pytest.mark.integration

STREAM = {"stream": "1", "partial_images": "2"}


def test_partial_steps_spread_over_the_run_and_never_the_last():
    assert partial_steps(0, 8, 2) == (3, 6)
    assert partial_steps(0, 8, 3) == (2, 4, 6)
    assert partial_steps(4, 8, 3) == (5, 6, 7)  # a resumed run: only its own steps
    assert partial_steps(0, 1, 3) == ()  # one step: only the final image
    assert partial_steps(0, 2, 3) == (1,)
    assert partial_steps(0, 50, 0) == ()


def _level(k: int, model: str = "demo-tiny-sdxl") -> ApproxLevel:
    return ApproxLevel(id=f"xl-k{k}", strategy=Strategy.AC, model=model, steps=8, skip=k,
                       latency_s={1: 0.1}, quality=1.0, load_time_s=0.1)  # fmt: skip


SD = ApproxLevel(id="sd", strategy=Strategy.SM, model="demo-tiny-sd", steps=8, skip=0, latency_s={1: 0.1},
                 quality=1.0, load_time_s=0.1)  # fmt: skip


def _collect():
    events: list[tuple[str, dict]] = []
    return events, lambda rid, ev: events.append((rid, ev))


def test_a_streamed_item_reports_each_step_and_partial_images(demo_registry):
    from PIL import Image

    from workers.sm import ModelExecutor

    level = SD
    events, sink = _collect()
    items = [WorkItem("quiet", "a cat", "sd", seed=1), WorkItem("loud", "a dog", "sd", seed=2, meta=STREAM)]
    with events_to(sink):
        res = ModelExecutor(level, demo_registry).run(items)
    assert all(r.ok for r in res) and {rid for rid, _ in events} == {"loud"}
    progress = [ev["step"] for _, ev in events if ev["type"] == "progress"]
    assert progress == list(range(0, 9))
    partial = [ev for _, ev in events if ev["type"] == "partial"]
    assert [(ev["index"], ev["step"]) for ev in partial] == [(0, 3), (1, 6)]
    images = [Image.open(io.BytesIO(ev["png"])) for ev in partial]
    assert {im.size for im in images} == {(64, 64)}
    final = Image.open(io.BytesIO(res[1].image_png))
    assert images[0].tobytes() != images[1].tobytes() != final.tobytes()


@pytest.mark.parametrize("model", ["demo-tiny-sdxl", "demo-tiny-sd"])  # img2img resume; the SD resume loop
def test_a_resumed_cache_hit_reports_from_its_k(demo_registry, memory_cache, hash_embedder, model):
    from workers.ac import ApproxCacheExecutor

    prompt = "a red cube on a wooden table"
    full = ApproxCacheExecutor(_level(0, model), demo_registry, cache=memory_cache, embed=hash_embedder,
                               capture_ks=(4,))  # fmt: skip
    full.run([WorkItem("seed", prompt, "xl-k0", seed=5)])
    events, sink = _collect()
    k4 = ApproxCacheExecutor(_level(4, model), demo_registry, cache=memory_cache, embed=hash_embedder)
    with events_to(sink):
        hit = k4.run([WorkItem("r", prompt, "xl-k4", seed=5, meta=STREAM)])[0]
    assert hit.cache_hit and hit.unet_calls == 4
    assert [ev["step"] for _, ev in events if ev["type"] == "progress"] == [4, 5, 6, 7, 8]
    assert [ev["step"] for _, ev in events if ev["type"] == "partial"] == [6, 7]
    assert all(ev["level"] == "xl-k4" for _, ev in events)


def test_events_never_break_or_change_a_generation(demo_registry):
    import numpy as np

    from workers.sm import ModelExecutor

    level = SD
    ex = ModelExecutor(level, demo_registry)
    plain = ex.run([WorkItem("a", "a house", "sd", seed=3)])[0]

    def broken(rid: str, ev: dict) -> None:
        raise ConnectionError("the queue is down")

    with events_to(broken):
        streamed = ex.run([WorkItem("a", "a house", "sd", seed=3, meta=STREAM)])[0]
    assert streamed.ok
    assert np.array_equal(np.asarray(_png(plain.image_png)), np.asarray(_png(streamed.image_png)))


def _png(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))
