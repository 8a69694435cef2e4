"""argus+ over every path of a deployment profile (issue 16, phase B): the ``[[cascades]]`` profile
format, the plan argus+ publishes (one Plan type, round-tripped), its data path (tier PASM, worker
reservation, deferrals to each pair's heavy level), the simulator with several pairs, the replay's
rows and domination check, ``argusdiff plan`` on a unified profile."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from argusdiff.domain import ClusterStats, Plan, Request, Strategy, Tier
from argusdiff.errors import ProfileError
from argusdiff.policies import RouteView, make_policy
from argusdiff.profile import load_profile, parse_profile
from argusdiff.service.plans import plan_from_dict, plan_to_dict
from argusdiff.simulator import SimConfig, quick_workload, simulate, summarize

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def unified():
    return load_profile("unified-a100")


def _raw(name: str = "unified-a100") -> dict:
    import tomllib

    from argusdiff.profile import resolve_profile

    return tomllib.loads(resolve_profile(name).read_text())


# ---- profile format ------------------------------------------------------------------------------


def test_unified_profile_lists_ac_sm_and_three_cascades(unified):
    assert unified.strategies == {Strategy.AC, Strategy.SM, Strategy.CASCADE}
    assert unified.unified and unified.cascade is None
    pairs = {c.light: c.heavy for c in unified.cascade_specs}
    assert pairs == {"sdxl-lightning": "sdxl-k0", "sdturbo": "sd-1.5", "sdxs": "sd-1.5"}
    assert all(c.resume for c in unified.cascades)
    assert unified.cascade_for("sdturbo").heavy == "sd-1.5" and unified.cascade_for("sdxl-k5") is None
    q = [lv.quality for lv in unified.levels]
    assert q == sorted(q, reverse=True)
    # every number cites its source: the [sources] table covers the sourced fields
    assert {"latency_s", "load_time_s", "memory_gb", "quality", "cascade"} <= set(unified.sources)


def test_single_strategy_profiles_load_unchanged(ac, sm, cascade):
    for p in (ac, sm, cascade):
        assert p.cascades == ()
    assert cascade.cascade_specs == (cascade.cascade,)
    assert not ac.unified and not sm.unified and not cascade.unified


def test_demo_cpu_unified_profile_names_built_demo_models():
    from workers.registry import ModelRegistry

    p = load_profile("demo-cpu-unified")
    assert p.cascades and p.strategies == {Strategy.AC, Strategy.SM, Strategy.CASCADE}
    reg = ModelRegistry()
    for lv in p.levels:
        assert reg.spec(lv.model).name == lv.model  # tiny models workers/demo.py builds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["cascades"][0].update(light="nope"), "field 'light' names unknown level 'nope'"),
        (lambda d: d["cascades"][1].update(light="sdxl-lightning"), "already starts an earlier cascade"),
        (lambda d: d["cascades"][0].update(resume="yes"), "field 'resume' must be true or false"),
        (lambda d: d["cascades"][0].update(colour=1), "unknown field(s) colour"),
        (lambda d: d.update(cascade=d["cascades"][0]), "not both"),
        (lambda d: d.update(cascades=[]), "field 'cascades' must be a list"),
        (lambda d: d["cascades"][0].update(deferral=[0.5] + [0.0] * 200), "field 'deferral' must not decrease"),
    ],
)
def test_bad_cascades_entries_name_the_field(change, message):
    data = _raw()
    change(data)
    with pytest.raises(ProfileError) as exc:
        parse_profile(data, source="u.toml")
    assert message in str(exc.value)
    assert "u.toml" in str(exc.value)


def test_one_plan_profiles_are_ordered_by_quality_only():
    data = _raw()
    parse_profile(data)  # SM and light levels out of speed order: fine for one plan
    data["levels"][0], data["levels"][1] = data["levels"][1], data["levels"][0]
    with pytest.raises(ProfileError, match="field 'quality' breaks monotonicity"):
        parse_profile(data)
    # a single-strategy ladder still keeps the throughput order
    ac = _raw("sdxl-ac-a100")
    ac["levels"][1]["latency_s"] = {"1": 9.0}
    with pytest.raises(ProfileError, match="field 'latency_s' breaks monotonicity"):
        parse_profile(ac)


# ---- the plan ------------------------------------------------------------------------------------


def _stats(workers: int, qpm: float, *, tiers: dict[str, int] | None = None, now: float = 60.0) -> ClusterStats:
    arrivals = int(qpm)
    return ClusterStats(
        now_s=now,
        period_s=60.0,
        arrivals=arrivals,
        workers=tuple(f"w{i}" for i in range(workers)),
        arrival_bins=tuple([arrivals // 60] * 60),
        bin_s=1.0,
        tier_arrivals=tiers or {},
        cache_hit_rate=0.6,
    )


def _policy(profile, **opts):
    return make_policy(
        "argus+", profile, rng=np.random.default_rng(0), config={"period_s": 60.0, "backend": "highs", **opts}
    )


def test_argus_plus_plans_every_path_and_the_plan_round_trips(unified):
    pol = _policy(unified)
    assert pol.unified and pol.cascade
    plan = pol.plan(_stats(8, 400, tiers={"interactive": 80, "standard": 200, "batch": 120}))
    plan.validate()
    assert plan.levels == unified.ids
    assert set(plan.thresholds) == {"sdxl-lightning", "sdturbo", "sdxs"}
    assert dict(plan.cascades) == {"sdxl-lightning": "sdxl-k0", "sdturbo": "sd-1.5", "sdxs": "sd-1.5"}
    assert set(plan.tier_pasm) == {"interactive", "standard", "batch"}
    assert sum(1 for lv in plan.assignment.values() if lv is not None) == 8
    # interactive capacity is reserved first: some workers serve only that tier
    assert set(plan.reserved.values()) == {"interactive"}
    back = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert back == plan


def test_ablation_paths_restrict_what_the_plan_routes(unified):
    for paths, banned in ((("ac", "sm"), Strategy.CASCADE), (("sm", "cascade"), Strategy.AC)):
        plan = _policy(unified, paths=paths).plan(_stats(8, 300))
        served = {lv for lv, f in zip(plan.levels, plan.share, strict=True) if f > 1e-9}
        assert served and all(unified.level(lv).strategy is not banned for lv in served), served
    with pytest.raises(Exception, match="option paths"):
        _policy(unified, paths=("gpu",))


def test_without_tiers_one_pasm_serves_every_request(unified):
    plan = _policy(unified, tiers=False).plan(_stats(8, 300, tiers={"interactive": 100, "batch": 200}))
    assert plan.tier_pasm == {} and plan.reserved == {}


def test_route_uses_the_tier_pasm_and_keeps_other_tiers_off_reserved_workers(unified):
    pol = _policy(unified)
    plan = pol.plan(_stats(8, 400, tiers={"interactive": 80, "standard": 200, "batch": 120}))
    reserved = set(plan.reserved)
    assert reserved
    models = {w: unified.level(lv).model for w, lv in plan.assignment.items() if lv is not None}
    seen_reserved = False
    for i in range(300):
        tier = (Tier.INTERACTIVE, Tier.STANDARD, Tier.BATCH)[i % 3]
        view = RouteView(now_s=100.0, optimal_level=unified.ids[i % len(unified.ids)], cache_similarity=0.99)
        view.up = set(plan.assignment)
        a = pol.route(Request(id=str(i), prompt="p", arrival_s=100.0, tier=tier), plan, view)
        assert a.worker is not None and a.level in plan.levels
        assert models[a.worker] == unified.level(a.level).model  # a worker holding the level's model
        if tier is not Tier.INTERACTIVE:
            assert a.worker not in reserved
        else:
            seen_reserved |= a.worker in reserved
    assert seen_reserved


def test_route_heavy_sends_a_deferral_to_its_pair_or_keeps_the_light_image(unified):
    pol = _policy(unified, paths=("cascade", "sm"))
    plan = pol.plan(_stats(8, 600))
    heavy_workers = {lv: [w for w, x in plan.assignment.items() if x == lv] for lv in ("sdxl-k0", "sd-1.5")}
    req = Request(id="1", prompt="p", arrival_s=0.0)
    for light, heavy in plan.cascades.items():
        view = RouteView(now_s=1.0, deferred_from=light)
        a = pol.route_heavy(req, plan, view)
        model = unified.level(heavy).model
        holders = [w for w, lv in plan.assignment.items() if lv is not None and unified.level(lv).model == model]
        if holders:
            assert a.level == heavy and a.worker in holders
        else:
            assert a.level is None and not a.dropped  # the light image is returned
    # no worker holds the heavy model: the light image is returned
    bare = dataclasses.replace(plan, version=plan.version + 100, assignment={"w0": "sdxs"})
    a = pol.route_heavy(req, bare, RouteView(now_s=1.0, deferred_from="sdxs"))
    assert a.level is None and not a.dropped
    assert heavy_workers  # the plan has both heavy levels in its level order


def test_simulator_defers_each_pair_to_its_own_heavy_level(unified):
    wl = quick_workload("poisson:qpm=300,duration=4m", [unified], n_prompts=200)
    assert set(wl.confidences) == {"sdxl-lightning", "sdturbo", "sdxs"}
    pol = _policy(unified, paths=("cascade",), threshold_points=11)
    res = simulate(pol, wl, SimConfig(gpus=8, period_s=60.0, slo_s=12.6, seed=0))
    s = summarize(res)
    assert s["served"] == s["requests"]
    deferred = np.flatnonzero(res.deferred)
    assert len(deferred) > 0
    served_at = {res.level_ids[res.level[i]] for i in deferred if res.level[i] >= 0}
    assert served_at and served_at <= {"sdxl-k0", "sd-1.5"}


def test_composed_synthetic_table_reuses_the_single_strategy_columns(unified, ac):
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_quality_table

    prompts = builtin_prompts().head(50)
    u = synthetic_quality_table(prompts, unified)
    a = synthetic_quality_table(prompts, ac)
    for lv in ac.ids:
        np.testing.assert_allclose(u.scores[:, u.level_index(lv)], a.scores[:, a.level_index(lv)])
    assert u.synthetic and "composed" in u.source


# ---- replay and CLI ------------------------------------------------------------------------------


def test_domination_check():
    from argusdiff.replay import domination

    s = {
        "me": {"slo_violation_ratio": 0.02, "relative_quality": 0.90},
        "me -x": {"slo_violation_ratio": 0.0, "relative_quality": 0.99},
        "worse": {"slo_violation_ratio": 0.03, "relative_quality": 0.95},
        "equal": {"slo_violation_ratio": 0.02, "relative_quality": 0.90},
        "better": {"slo_violation_ratio": 0.02, "relative_quality": 0.91},
    }
    assert domination(s, "me") == ["better"]  # its own variants are not the field
    assert domination(s, "me", among=["worse", "equal"]) == []
    assert domination(s, "me", among=["me -x"]) == ["me -x"]


def test_replay_runs_argus_plus_on_the_unified_profile_by_default():
    from argusdiff.replay import UNIFIED_LABEL, ReplaySpec, run_replay

    spec = ReplaySpec(
        trace="poisson:qpm=60,duration=3m",
        policies=["argus+", "diffserve"],
        embeddings=False,
        gpus=4,
        ablation=True,
        policy_options={"threshold_points": 6},
        admission=False,  # the planner alone: at this load its plan serves every request
    )
    res = run_replay(spec)
    labels = set(res.summaries)
    assert {UNIFIED_LABEL, f"{UNIFIED_LABEL} -cascades", f"{UNIFIED_LABEL} -AC", f"{UNIFIED_LABEL} -SM"} <= labels
    assert f"{UNIFIED_LABEL} -tiers" in labels
    me = res.summaries[UNIFIED_LABEL]
    assert me["profile"] == "unified-a100" and me["served"] == me["requests"]
    assert "unified" in res.provenance["profiles"]


def test_plan_cli_on_a_unified_profile(capsys):
    from argusdiff.cli import main

    rc = main(
        ["plan", "--profile", "unified-a100", "--gpus", "8", "--load-qpm", "200",
         "--tiers", "interactive=0.2,standard=0.5,batch=0.3", "--json"]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["id"] for p in out["paths"]} == set(load_profile("unified-a100").ids)
    cascades = {p["id"]: p for p in out["paths"] if p["strategy"] == "cascade"}
    assert set(cascades) == {"sdxl-lightning", "sdturbo", "sdxs"}
    assert all("threshold" in p and "heavy" in p for p in cascades.values())
    assert sum(out["workers_per_model"].values()) == 8
    rc = main(["plan", "--profile", "unified-a100", "--gpus", "8", "--load-qpm", "200"])
    text = capsys.readouterr().out
    assert rc == 0 and "routing shares" in text and "defers" in text


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tiers", "gold=1"], "--tiers"),
        (["--tiers", "interactive=x"], "--tiers"),
        (["--hit-rate", "2"], "--hit-rate"),
    ],
)
def test_plan_cli_bad_unified_options_exit_2(argv, needle, capsys):
    from argusdiff.cli import main

    rc = main(["plan", "--profile", "unified-a100", "--gpus", "4", "--load-qpm", "10", *argv])
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_plan_cli_tiers_need_a_unified_profile(capsys):
    from argusdiff.cli import main

    rc = main(["plan", "--profile", "sdxl-ac-a100", "--gpus", "4", "--load-qpm", "10", "--tiers", "batch=1"])
    assert rc == 2 and "--tiers" in capsys.readouterr().err


def test_no_workers_gives_a_saturated_plan(unified):
    plan = _policy(unified).plan(_stats(0, 100))
    assert isinstance(plan, Plan) and plan.saturated and plan.assignment == {}


# ---- the service -----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_serve_runs_the_demo_unified_profile_with_argus_plus(demo_models_dir, live_service):
    """``argusdiff serve`` on demo-cpu-unified (tiny real pipelines): argus+ publishes a unified plan
    (thresholds per light level, each pair's heavy level) and answers requests on its paths."""
    import httpx
    from fixtures_service import service_settings

    from argusdiff.config import Settings

    base = service_settings(
        "demo-cpu-unified",
        policy="argus+",
        stand_in_scale=None,
        workers=3,
        request_timeout_s=120,
        worker_timeout_s=10.0,
    ).model_dump()
    base["workers"].update(models_dir=demo_models_dir, device="cpu", torch_threads=1, poll_s=0.05)
    server = live_service(Settings.model_validate(base), ready=False)
    from argusdiff.service.worker import wait_until

    def ready() -> bool:
        try:
            return httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(ready, 180, 0.2)  # the tiny pipelines are built from their configs first
    plan = server.service.router.plan
    assert plan is not None and dict(plan.cascades) == {"sd-light": "sd-4"} and "sd-light" in plan.thresholds
    ids = set(load_profile("demo-cpu-unified").ids)
    url = f"{server.url}/v1/argusdiff/generations"
    for i in range(3):
        r = httpx.post(url, json={"prompt": f"a red boat number {i}", "seed": i}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["level"] in ids
    body = httpx.get(f"{server.url}/v1/plan", timeout=10).json()
    assert body["cascades"] == {"sd-light": "sd-4"}


def test_a_new_leader_continues_the_tier_mix_and_hit_rate(unified):
    from argusdiff.policies.state import export_state, import_state

    a = _policy(unified)
    a.plan(_stats(8, 300, tiers={"interactive": 100, "batch": 200}))
    b = _policy(unified)
    taken = import_state(b, json.loads(json.dumps(export_state(a))))
    assert "_tiers" in taken and "_hit_rate" in taken
    assert b._tiers == pytest.approx(a._tiers) and b._hit_rate == pytest.approx(0.6)
