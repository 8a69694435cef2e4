"""Unit tests of the service's pieces without servers: validation, expiry, cache health, plan JSON,
stand-in executor, the control loop on an in-memory store."""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest

from argusdiff.domain import Refusal, Tier
from argusdiff.service.errors import ApiError
from argusdiff.service.health import CacheHealth
from argusdiff.service.schemas import Limits, parse_native, parse_openai
from argusdiff.service.transport.memory import ENTRY_OVERHEAD, ResultMemory

LIMITS = Limits(
    models=("argusdiff", "demo"), levels=("a", "b", "c"), sizes=("64x64",), max_n=4, max_prompt_chars=50, max_slo_s=60
)


def test_openai_defaults_and_quality_mapping():
    spec = parse_openai({"prompt": "a cat"}, LIMITS)
    assert (spec.n, spec.size, spec.response_format, spec.min_quality_level) == (1, "64x64", "url", None)
    assert parse_openai({"prompt": "a", "quality": "hd"}, LIMITS).min_quality_level == "a"
    assert parse_openai({"prompt": "a", "n": 2.0, "size": "auto"}, LIMITS).n == 2


def test_native_fields():
    spec = parse_native(
        {"prompt": "a", "seed": 3, "slo_s": 2, "tier": "batch", "min_quality_level": "b", "wait": False}, LIMITS
    )
    assert (spec.seed, spec.slo_s, spec.tier, spec.min_quality_level, spec.wait) == (3, 2.0, Tier.BATCH, "b", False)
    assert spec.response_format == "b64_json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "n": 1.5}, "n"),
        ({"prompt": "a\x00b"}, "prompt"),
        ({"prompt": "a", "user": "u" * 300}, "user"),
        ({"prompt": "a", "slo_s": float("nan")}, "slo_s"),
        ({"prompt": "a", "slo_s": 61}, "slo_s"),
        ({"prompt": "a", "size": 64}, "size"),
    ],
)
def test_rejections_name_the_field(body, param):
    with pytest.raises(ApiError) as exc:
        parse_native(body, LIMITS)
    assert exc.value.status == 400 and exc.value.param == param


def test_result_memory_expires_in_insertion_order():
    now = [0.0]
    d = ResultMemory(1 << 20, 10, clock=lambda: now[0])
    d.set("a", 1)
    now[0] = 5
    d.set("b", 2)
    assert d.get("a") == 1 and len(d) == 2
    now[0] = 11
    assert d.get("a") is None and d.get("b") == 2 and len(d) == 1


def test_result_memory_is_capped_by_bytes_oldest_first():
    from workers.messages import WorkResult

    d = ResultMemory(3 * (ENTRY_OVERHEAD + 1000), 3600)
    for i in range(10):
        d.set(f"r{i}", WorkResult(request_id=f"r{i}", level="a", image_png=b"x" * 1000))
    assert len(d) == 3 and d.evicted == 7 and d.bytes <= d.max_bytes
    assert d.get("r0") is None and d.get("r9").image_png == b"x" * 1000


def test_cache_health_latency_errors_reset():
    h = CacheHealth(4, latency_limit_s=0.1, error_limit=0.25)
    assert h.healthy and h.median_latency_s() is None
    for _ in range(3):
        h.record(0.01, hit=True)
    h.record(0.5, hit=False)
    assert h.healthy and h.hit_ratio() == 0.75
    h.record(None, error=True)
    h.record(None, error=True)
    assert h.error_rate() == 0.5 and not h.healthy
    h.reset()
    assert h.healthy and h.samples == 0


def test_plan_json_round_trip():
    from argusdiff.domain import Plan, Strategy
    from argusdiff.service.plans import plan_from_dict, plan_to_dict

    plan = Plan(
        version=3, created_s=1.0, strategy=Strategy.AC, levels=("a", "b"), assignment={"w1": "a", "w2": None},
        share=(0.6, 0.4), pasm=((1.0, 0.0), (0.2, 0.8)), predicted_qpm=12.0, expected_quality=0.9,
        thresholds={"a": 0.5}, batch_sizes={"a": 2}, notes=("x",), preload={"w1": ("b",)},
    )  # fmt: skip
    data = plan_to_dict(plan)
    assert data["counts"] == {"a": 1, "b": 0}
    assert plan_from_dict(data) == plan


def test_stand_in_executor_png_and_load_time():
    from argusdiff.profile import load_profile
    from workers.messages import WorkItem
    from workers.standin import StandInExecutor, solid_png

    png = solid_png(3, 2, (1, 2, 3))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    length = struct.unpack(">I", png[8:12])[0]
    assert png[12:16] == b"IHDR" and struct.unpack(">II", png[16:24]) == (3, 2) and length == 13
    idat_len = struct.unpack(">I", png[33:37])[0]
    assert zlib.decompress(png[41 : 41 + idat_len]) == (b"\x00" + bytes((1, 2, 3)) * 3) * 2
    slept = []
    level = load_profile("sm-a100").levels[0]
    ex = StandInExecutor(level, 0.5, load_s=2.0, sleep=slept.append)
    out = ex.run([WorkItem(request_id="r1", prompt="p", level=level.id, seed=4)])
    assert slept == [2.0, level.latency(1) * 0.5]
    assert out[0].ok and out[0].seed == 4 and out[0].timings["stand_in"] == 1.0
    ex.run([WorkItem(request_id="r2", prompt="p", level=level.id)])
    assert slept[2:] == [level.latency(1) * 0.5]  # the load is paid once


def test_control_loop_removes_a_silent_worker_and_moves_its_queue():
    from fixtures_service import service_settings

    from argusdiff.service.app import Service

    async def scenario():
        service = Service(service_settings(workers=0, policy="clipper-ht"))
        await service.dispatch.start()
        store, control = service.store, service.control
        fastest = service.profile.ids[-1]
        store.beat("w1", {"level": None}, ttl_s=60)
        store.beat("w2", {"level": None}, ttl_s=60)
        plan = await control.tick()
        assert set(plan.assignment) == {"w1", "w2"} and set(plan.assignment.values()) == {fastest}
        store.beat("w2", {"level": fastest}, ttl_s=-1)  # w2 falls silent
        plan = await control.tick(full=False)
        assert set(plan.assignment) == {"w1"} and set(control.alive) == {"w1"}
        assert plan.version == 2 and service.router.plan is plan
        await service.dispatch.close()

    asyncio.run(scenario())


def test_control_loop_hands_the_demand_predictor_per_second_arrival_bins():
    import time

    from fixtures_service import service_settings

    from argusdiff.service.app import Service

    async def scenario():
        service = Service(service_settings(workers=0, policy="argus"))
        await service.dispatch.start()
        store, control, router = service.store, service.control, service.router
        store.beat("w1", {"level": None, "resident": ["tiny-sd"]}, ttl_s=60)
        now = float(int(time.time()))
        control.clock = lambda: now  # exactly one 60 s period
        control.last_tick = now - 60.0
        # a 10 s burst of 5 requests per second in an otherwise quiet minute
        for sec in range(int(now) - 15, int(now) - 5):
            router._arrived(float(sec) + 0.5, 5)
        await control.tick()
        demand = service.policy.demand
        assert demand.observations == 1
        # the peak reading sees the burst's rate, not the minute's mean of 50 QPM
        assert demand.estimate >= 150.0 - 1e-6
        assert not router.period.arrival_times and router.period.arrivals == 0  # taken
        await service.dispatch.close()

    asyncio.run(scenario())


def test_control_loop_hands_the_policy_the_periods_tier_mix_and_cache_hit_rate():
    """One decision path: the live ClusterStats carries the period's arrivals per tier (admitted or
    refused) and the share of its cache lookups that hit, as the simulator's does, so argus+'s
    tier mix and hit rate follow the same observations live and in a replay."""
    import time

    from fixtures_service import service_settings

    from argusdiff.domain import Tier
    from argusdiff.service.app import Service
    from argusdiff.service.schemas import GenerationSpec

    async def scenario():
        service = Service(service_settings(workers=0, policy="argus"))
        await service.dispatch.start()
        store, control, router = service.store, service.control, service.router
        store.beat("w1", {"level": None, "resident": ["tiny-sd"]}, ttl_s=60)
        now = float(int(time.time()))
        control.clock = lambda: now
        control.last_tick = now - 60.0
        seen = []
        plan = service.policy.plan
        service.policy.plan = lambda stats: seen.append(stats) or plan(stats)
        for tier, n in ((Tier.INTERACTIVE, 2), (Tier.BATCH, 3), (Tier.STANDARD, 1)):
            router._refuse(GenerationSpec(prompt="p", n=n, tier=tier), "test", Refusal.CAPPED, 1.0, now - 1, None)
        for hit in (True, True, False, True):
            router.on_done("none", {"level": "tiny-sd", "ok": True, "lookup_s": 0.01, "cache_hit": hit})
        router.on_done("none", {"level": "tiny-sd", "ok": True})  # no lookup: not counted
        await control.tick()
        stats = seen[-1]
        assert stats.reason == "period" and stats.arrivals == 6
        assert dict(stats.tier_arrivals) == {"interactive": 2, "batch": 3, "standard": 1}
        assert stats.cache_hit_rate == 0.75
        # taken: the next period starts from nothing
        left = router.take_period()
        assert left.tier_arrivals == {} and left.cache_hit_rate is None
        await service.dispatch.close()

    asyncio.run(scenario())


def test_control_loop_bins_arrivals_by_their_own_times_from_the_period_start():
    """Regression: the live loop counted arrivals per wall-clock second, so with a period that does
    not start on a whole second a burst late in one predictor bin landed in the next one (and the
    peak reading differed from the simulator's). Now both bin each arrival's own time, from the
    period's start (argusdiff.predictors.arrival_bins)."""
    import numpy as np
    from fixtures_service import service_settings

    from argusdiff.service.app import Service
    from argusdiff.simulator import SimConfig, Simulator, quick_workload

    async def scenario():
        service = Service(service_settings(workers=0, policy="argus"))
        await service.dispatch.start()
        store, control, router = service.store, service.control, service.router
        store.beat("w1", {"level": None}, ttl_s=60)
        start = 1_000_000.3  # the period starts 0.3 s into a wall-clock second
        control.clock = lambda: start + 60.0
        control.last_tick = start
        seen = []
        plan = service.policy.plan
        service.policy.plan = lambda stats: seen.append(stats) or plan(stats)
        # 20 arrivals 9.50-9.88 s into the period (the first 10 s bin), 3 more at 30.2 s
        times = [start + 9.5 + 0.02 * k for k in range(20)] + [start + 30.2] * 3
        for t in times:
            router._arrived(t, 1)
        await control.tick()
        (stats,) = seen
        assert stats.arrivals == 23 and len(stats.arrival_bins) == 60 and stats.bin_s == 1.0
        assert stats.arrival_bins[9] == 20 and stats.arrival_bins[30] == 3 and sum(stats.arrival_bins) == 23
        # the peak of 10 s rates: 20 arrivals in the first 10 s = 120 QPM (counted per wall-clock
        # second, the 10 after 1_000_010.0 fell into the second 10 s bin: 60 QPM)
        assert service.policy.demand.estimate == 120.0
        await service.dispatch.close()
        # the simulator bins the same times the same way
        wl = quick_workload("poisson:qpm=60,duration=2m", [service.profile], n_prompts=50)
        sim = Simulator(service.policy, wl, SimConfig(gpus=1))
        sim.run()
        got = sim._stats(start + 60.0, 60.0, 23, np.zeros(0, dtype=np.int64), np.array(times))
        assert got.arrival_bins == stats.arrival_bins and got.bin_s == stats.bin_s

    asyncio.run(scenario())


def test_control_loop_keeps_its_cadence_however_long_a_tick_takes():
    import time

    from fixtures_service import service_settings

    from argusdiff.service.app import Service

    service = Service(service_settings(workers=0, policy="argus"))
    control = service.control
    p = control.period_s
    assert control.next_period(100.0, 100.0 + 0.3 * p) == 100.0 + p  # a slow tick does not shift it
    assert control.next_period(100.0, 100.0 + 2.5 * p) == 100.0 + 3 * p  # missed periods are skipped
    control.clock = lambda: 5_000.0
    control.restart_period()  # a period starts now: the arrivals before it belong to the last one
    assert control.last_tick == 5_000.0 and 0.0 < control._next_tick - time.monotonic() <= p


def test_control_loop_moves_unserved_work_but_leaves_ac_siblings_to_their_model_workers():
    from fixtures_service import service_settings

    from argusdiff.service.app import Service
    from workers.messages import WorkItem

    async def scenario():
        service = Service(service_settings("demo-cpu", workers=0, policy="nirvana"))
        await service.dispatch.start()
        store, control, queue = service.store, service.control, service.dispatch.queue
        store.beat("w1", {"level": None}, ttl_s=60)
        plan = await control.tick()
        assert set(plan.assignment.values()) == {"xl-k0"}  # NIRVANA: AC on every worker at K = 0
        queue.put("xl-k4", WorkItem("r1", "a cat", "xl-k4"))
        await control.tick(full=False)
        assert queue.qsize("xl-k4") == 1 and control.migrated == 0  # the K = 0 workers take it

        service = Service(service_settings("sm-a100", workers=0, policy="clipper-ht"))
        await service.dispatch.start()
        store, control, queue = service.store, service.control, service.dispatch.queue
        store.beat("w1", {"level": None}, ttl_s=60)
        plan = await control.tick()
        best, fastest = service.profile.ids[0], service.profile.ids[-1]
        assert set(plan.assignment.values()) == {fastest}
        queue.put(best, WorkItem("r2", "a cat", best))
        await control.tick(full=False)
        assert queue.qsize(best) == 0 and queue.qsize(fastest) == 1 and control.migrated == 1

    asyncio.run(scenario())


def test_shutdown_drains_accepted_work_in_embedded_mode_and_refuses_new_requests():
    """Embedded queues live in the process: on shutdown the workers finish what was accepted
    (here, asynchronous submissions nobody waits on) before they stop; new requests get 503."""
    from fixtures_service import service_settings

    from argusdiff.service.app import Service
    from argusdiff.service.schemas import parse_native

    async def scenario():
        service = Service(service_settings(workers=2, stand_in_scale=0.02, policy="clipper-ht", drain_timeout_s=60))
        await service.start()
        router = service.router
        for _ in range(200):
            if router.plan is not None and any(router.plan.assignment.values()):
                break
            await asyncio.sleep(0.05)
        subs = [
            await router.submit(parse_native({"prompt": f"a cat {i}", "wait": False}, router.limits)) for i in range(12)
        ]
        assert len(router.inflight) > 0  # still queued or running when the shutdown starts
        stopping = asyncio.create_task(service.stop())
        await asyncio.sleep(0)
        assert not service.ready()
        with pytest.raises(ApiError) as err:
            await router.submit(parse_native({"prompt": "late"}, router.limits))
        assert err.value.status == 503 and err.value.code == "shutting_down"
        await stopping
        assert router.accepted == 12 and router.completed == 12 and not router.inflight
        done = await service.dispatch.fetch_results([rid for sub in subs for rid in sub.request_ids])
        assert len(done) == 12 and all(r.ok for r in done.values())

    asyncio.run(scenario())


def test_service_modules_import_no_heavy_libraries():
    import subprocess
    import sys

    code = (
        "import sys, argusdiff.service.app, argusdiff.service.api, argusdiff.commands.serve, "
        "argusdiff.commands.worker, argusdiff.service.transport.redis_streams, "
        "argusdiff.service.transport.redis_control\n"
        "heavy = [m for m in ('torch', 'diffusers', 'transformers', 'timm', 'open_clip') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["--port", "99999"], "--port"), (["--workers", "-1"], "--workers"), (["--profile", "nope"], "unknown profile")],
)
def test_serve_bad_options_exit_2_naming_the_option(argv, needle, capsys):
    from argusdiff.cli import main

    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_serve_defaults_to_the_demo_profile_with_its_sm_fallback(monkeypatch):
    import argparse

    from argusdiff.commands.serve import add_arguments, settings_from_args

    monkeypatch.delenv("ARGUSDIFF_PROFILE", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser, "serve")
    s = settings_from_args(parser.parse_args([]))
    assert (s.profile, s.service.fallback_profile, s.service.redis_url) == ("demo-cpu", "demo-cpu-sm", None)
    assert s.classifier.fit_at_start is True  # the demo routes by prompt
    s = settings_from_args(parser.parse_args(["--profile", "sm-a100", "--redis", "redis://h:1/0", "--api-key", "k"]))
    assert (s.profile, s.service.fallback_profile, s.service.redis_url, s.service.api_keys) == (
        "sm-a100", None, "redis://h:1/0", ("k",)
    )  # fmt: skip
    assert not s.classifier.fit_at_start
    monkeypatch.setenv("ARGUSDIFF_CLASSIFIER__FIT_AT_START", "false")
    assert settings_from_args(parser.parse_args([])).classifier.fit_at_start is False


def test_full_size_stand_in_png_has_a_real_images_byte_size():
    import io

    from PIL import Image

    from workers.standin import full_size_png

    a, b = full_size_png("256x128"), full_size_png("256x128")
    assert Image.open(io.BytesIO(a)).size == (256, 128)
    assert 1.2 < len(a) / (256 * 128) < 2.2  # photographs and diffusion images: ~1.5 bytes per pixel
    assert a == b and a is not b  # each image its own bytes, as a worker's would be


def test_why_an_image_went_where_it_did():
    from argusdiff.domain import Assignment, Plan, RouteReason, Strategy
    from argusdiff.service.explain import explain

    levels = ("k0", "k2", "k4")
    plan = Plan(
        version=1, created_s=0.0, strategy=Strategy.AC, levels=levels, assignment={"w0": "k0", "w1": "k2"},
        share=(0.5, 0.5, 0.0), pasm=((1.0, 0.0, 0.0), (0.25, 0.75, 0.0), (0.25, 0.75, 0.0)),
        predicted_qpm=10.0, expected_quality=0.99,
    )  # fmt: skip

    def why(level, optimal, reads=True, reason="", cause=RouteReason.PLAN):
        a = Assignment(level=level, reason=reason, cause=cause)
        return explain(a, plan, optimal=optimal, reads_prompt=reads)

    assert why("k2", "k2") == "the prompt classifier puts this prompt at k2; the plan serves k2 (P = 0.75)"
    assert why("k0", "k2").endswith("the plan has room at the better level k0 (P = 0.25)")
    assert why("k2", "k4").endswith("the plan has room at the better level k2 (P = 0.75)")
    assert why("k2", "k0").endswith("the plan is short of capacity at k0: the faster level k2 (P = 0.00)")
    assert why("k0", None).startswith("no prompt classifier: the prompt counts as needing the best level;")
    assert why("k0", None, reads=False).startswith("this policy routes without reading the prompt;")
    floor = why("k0", "k4", reason="minimum quality level", cause=RouteReason.QUALITY_FLOOR)
    assert floor.endswith("; minimum quality level: k0")
    caveat = explain(Assignment(level="k2"), plan, optimal="k2", reads_prompt=True, classifier="fitted at start")
    assert caveat.startswith("the prompt classifier (fitted at start) puts this prompt at k2")


def test_status_prints_plan_writes_as_wall_clock_times():
    from argusdiff.service.cluster import format_status

    status = {
        "mode": "redis",
        "routers": {},
        "workers": {},
        "plan_writes": [{"version": 7, "token": 3, "router": "r1", "created_s": 1795786345.3934}],
    }
    text = format_status(status)
    assert "v7      token 3    by r1  at 2026-11-27 13:32:25.393 UTC" in text
    assert "1795786345" not in text
