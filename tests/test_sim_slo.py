"""Per-request SLOs and tiers: the simulator, the metrics, argus+ admission and the replay."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np
import pytest

from argusdiff.cli import main
from argusdiff.config import ReplayConfig
from argusdiff.domain import ClusterStats, Request, Tier
from argusdiff.errors import ConfigError
from argusdiff.policies import RouteView, make_policy
from argusdiff.profile import load_profile
from argusdiff.simulator import SimConfig, build_workload, quick_workload, simulate, summarize
from argusdiff.simulator.workload import trace_deadlines

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SLO = 12.6


@pytest.fixture(scope="module")
def base_wl(ac, sm):
    # 120 QPM on 8 workers of the AC ladder: queues build, so SLOs decide outcomes
    return quick_workload("poisson:qpm=150,duration=8m", [ac, sm], n_prompts=300)


def _with(wl, *, slo_s=None, tier=None):
    """The same workload with per-request SLOs / tiers."""
    return type(wl)(
        arrivals_s=wl.arrivals_s,
        prompt_idx=wl.prompt_idx,
        prompts=wl.prompts,
        quality=wl.quality,
        relative=wl.relative,
        optimal=wl.optimal,
        neighbours=wl.neighbours,
        neighbour_sim=wl.neighbour_sim,
        confidence=wl.confidence,
        classifier=wl.classifier,
        quality_source=wl.quality_source,
        slo_s=slo_s,
        tier=tier,
    )


def _run(name, prof, wl, sm, **cfg):
    opts = {"period_s": 60.0, "slo_s": SLO}
    if name in ("argus", "argus+"):
        opts["fallback"] = sm
    pol = make_policy(name, prof, rng=np.random.default_rng(0), config=opts)
    return simulate(pol, wl, SimConfig(period_s=60.0, slo_s=SLO, cache_prefill=0.5, **cfg))


def _tiers(n, seed=0):
    names = ("interactive", "standard", "batch")
    return tuple(names[k] for k in np.random.default_rng(seed).integers(0, 3, n))


def test_untiered_run_gives_every_request_the_deployment_slo(ac, sm, base_wl):
    res = _run("pac", ac, base_wl, sm)
    assert np.all(res.req_slo_s == SLO)
    s = summarize(res)
    assert set(s["tiers"]) == {"standard"}
    assert s["tiers"]["standard"]["requests"] == s["requests"]
    assert s["tiers"]["standard"]["within_slo"] == s["within_slo"]


def test_tier_multipliers_set_each_requests_slo_and_violations_split_per_tier(ac, sm, base_wl):
    tiers = _tiers(base_wl.n_requests)
    wl = _with(base_wl, tier=tiers)
    res = _run("pac", ac, wl, sm)
    t = np.array(tiers)
    assert np.all(res.req_slo_s[t == "batch"] == 4 * SLO)
    assert np.all(res.req_slo_s[t != "batch"] == SLO)
    s = summarize(res)
    per = s["tiers"]
    assert set(per) == {"interactive", "standard", "batch"}
    assert sum(d["requests"] for d in per.values()) == s["requests"]
    assert sum(d["within_slo"] for d in per.values()) == s["within_slo"]
    assert per["batch"]["slo_s"] == pytest.approx(4 * SLO)
    # recompute each tier's count from the raw outcome arrays
    lat = res.finish_s - wl.arrivals_s
    for name, d in per.items():
        sel = (t == name) & (res.status == 1)
        assert d["within_slo"] == int(np.sum(lat[sel] <= res.req_slo_s[sel] + 1e-9))
    # workers pull interactive work first: at the same 1x SLO it is late no more often than standard
    assert per["interactive"]["slo_violation_ratio"] <= per["standard"]["slo_violation_ratio"]
    # a configurable multiplier: batch at 1x tightens only the batch tier's judgement
    res1 = _run("pac", ac, wl, sm, tier_slo={"interactive": 1.0, "standard": 1.0, "batch": 1.0})
    per1 = summarize(res1)["tiers"]
    assert per1["batch"]["slo_s"] == pytest.approx(SLO)
    assert per1["batch"]["within_slo"] <= per["batch"]["within_slo"]
    # one tier for every request is the untiered run: the same pull order, the same outcomes
    same = _run("pac", ac, _with(base_wl, tier=("standard",) * base_wl.n_requests), sm)
    untiered = _run("pac", ac, base_wl, sm)
    assert np.array_equal(same.status, untiered.status)
    assert np.array_equal(same.finish_s, untiered.finish_s, equal_nan=True)


def test_explicit_per_request_slo_wins_over_the_tier(ac, sm, base_wl):
    n = base_wl.n_requests
    slo = np.full(n, np.nan)
    slo[::2] = 0.01  # impossible: shorter than any level
    wl = _with(base_wl, slo_s=slo, tier=("batch",) * n)
    res = _run("pac", ac, wl, sm)
    assert np.all(res.req_slo_s[::2] == 0.01)
    assert np.all(res.req_slo_s[1::2] == 4 * SLO)
    s = summarize(res)
    assert s["tiers"]["batch"]["requests"] == n
    lat = res.finish_s - wl.arrivals_s
    assert not np.any((res.status[::2] == 1) & (lat[::2] <= 0.01))
    assert s["within_slo"] <= n - len(slo[::2])


def test_unknown_tier_and_bad_multiplier_are_refused(ac, sm, base_wl):
    wl = _with(base_wl, tier=("gold",) * base_wl.n_requests)
    with pytest.raises(ConfigError, match=r"tier_slo.*'gold'"):
        _run("pac", ac, wl, sm)
    with pytest.raises(ConfigError, match="tier_slo"):
        SimConfig(tier_slo={"batch": 0.0})
    with pytest.raises(ValueError, match="tier"):
        ReplayConfig(tier_slo_factors={"batch": -1.0})
    with pytest.raises(ConfigError, match="per-request SLOs"):
        _with(base_wl, slo_s=np.zeros(base_wl.n_requests))


def test_proteus_deadlines_are_ignored_with_a_note_and_csv_slos_kept():
    from traces.trace import Trace

    arr = np.arange(5, dtype=float)
    slo, tier, note = trace_deadlines(Trace(arrivals_s=arr, slo_s=np.full(5, 0.3), format="proteus"))
    assert slo is None and tier is None and "ignored" in note and "300 ms" in note
    slo, tier, note = trace_deadlines(
        Trace(arrivals_s=arr, slo_s=np.full(5, 30.0), tier=("batch",) * 5, format="argusdiff")
    )
    assert slo is not None and np.all(slo == 30.0) and tier == ("batch",) * 5
    assert "per-request SLOs" in note and "tiers" in note
    # a Proteus file rewritten to the native CSV keeps its source: still ignored
    slo, _tier, note = trace_deadlines(
        Trace(arrivals_s=arr, slo_s=np.full(5, 0.3), format="argusdiff", source="/d/twitter_proteus_x.txt")
    )
    assert slo is None and "ignored" in note


def test_simulator_hands_each_request_its_own_deadline_and_tier(ac, sm, base_wl):
    seen: list[Request] = []
    pol = make_policy("pac", ac, rng=np.random.default_rng(0), config={"period_s": 60.0, "slo_s": SLO})
    orig = pol.route

    def spy(request, plan, view):
        seen.append(request)
        return orig(request, plan, view)

    pol.route = spy  # type: ignore[method-assign]
    tiers = _tiers(base_wl.n_requests, seed=3)
    simulate(pol, _with(base_wl, tier=tiers), SimConfig(period_s=60.0, slo_s=SLO))
    first = {int(r.id): r for r in seen}
    assert len(first) == base_wl.n_requests
    for i, r in first.items():
        assert r.tier == Tier(tiers[i])
        assert r.slo_s == (4 * SLO if tiers[i] == "batch" else SLO)


def test_argus_plus_admission_uses_the_requests_own_deadline(sm):
    pol = make_policy("argus+", sm, rng=np.random.default_rng(0), config={"slo_s": SLO})
    plan = pol.static_plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=0, workers=("w0", "w1")), sm.best.id)
    plan = dataclasses.replace(plan, assignment={"w0": sm.best.id, "w1": sm.fastest.id})

    def view():
        return RouteView(
            now_s=0.0, queue_lengths={"w0": 5, "w1": 50}, busy_until={"w0": 30.0, "w1": 100.0}, optimal_level=sm.best.id
        )

    # w0 frees at 30 s: late for the deployment SLO (12.6 s) -> hopeless, best effort
    a = pol.route(Request(id="a", prompt="p", arrival_s=0.0, tier=Tier.INTERACTIVE, slo_s=SLO), plan, view())
    assert a.best_effort
    # the same request with a batch deadline (4 x 12.6 s) fits at its planned level on w0
    a = pol.route(Request(id="b", prompt="p", arrival_s=0.0, tier=Tier.BATCH, slo_s=4 * SLO), plan, view())
    assert not a.best_effort and a.level == sm.best.id and a.worker == "w0"


def test_argus_plus_on_a_tiered_trace_counts_and_best_effort_by_tier(ac, sm, base_wl):
    tiers = _tiers(base_wl.n_requests, seed=1)
    # 6 workers: queues build past the interactive deadline (on 8 almost nothing is hopeless)
    s = summarize(_run("argus+", ac, _with(base_wl, tier=tiers), sm, gpus=6))
    per = s["tiers"]
    assert sum(d["best_effort"] for d in per.values()) == s["best_effort"]
    assert sum(d["dropped"] for d in per.values()) == s["dropped"]
    # a request judged against 4x the SLO is rarely hopeless: fewer best-effort batch requests
    share = {k: d["best_effort"] / d["requests"] for k, d in per.items()}
    assert per["interactive"]["best_effort"] > 0
    assert share["batch"] < share["interactive"]


def test_diffserve_drops_against_the_requests_own_slo(base_wl):
    cas = load_profile("cascade-sdxlltn-sdxl")
    wl = quick_workload("poisson:qpm=400,duration=4m", [cas], n_prompts=200)
    n = wl.n_requests
    outcomes = {}
    for label, slo in (("tight", np.full(n, 2.0)), ("loose", np.full(n, 1000.0))):
        pol = make_policy("diffserve", cas, rng=np.random.default_rng(0), config={"period_s": 1.0, "slo_s": SLO})
        outcomes[label] = summarize(simulate(pol, _with(wl, slo_s=slo), SimConfig(period_s=1.0, slo_s=SLO)))
    assert outcomes["loose"]["dropped"] == 0
    assert outcomes["tight"]["dropped"] > 0


def test_replay_reports_violations_per_tier(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "replay",
            "--trace",
            "poisson:qpm=120,duration=5m,tiers=0.3/0.4/0.3",
            "--no-embeddings",
            "--quiet",
            "--policies",
            "argus+,pac",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "SLO violations per tier" in table and "interactive" in table and "batch" in table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["per_request_slo"] is True
    assert summary["provenance"]["tier_slo"] == {"interactive": 1.0, "standard": 1.0, "batch": 4.0}
    for s in summary["policies"].values():
        assert set(s["tiers"]) == {"interactive", "standard", "batch"}
        assert sum(d["requests"] for d in s["tiers"].values()) == s["requests"]
        assert s["tiers"]["batch"]["slo_s"] == pytest.approx(4 * s["tiers"]["standard"]["slo_s"])


def test_untiered_replay_has_no_tier_table(capsys):
    rc = main(["replay", "--trace", "poisson:qpm=40,duration=3m", "--no-embeddings", "--quiet", "--policies", "pac"])
    assert rc == 0
    assert "per tier" not in capsys.readouterr().out


def test_build_workload_sorts_slos_and_tiers_with_arrivals(ac):
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_quality_table

    prompts = builtin_prompts().head(10)
    table = synthetic_quality_table(prompts, ac)
    wl = build_workload(
        np.array([3.0, 1.0, 2.0]),
        np.array([0, 1, 2]),
        list(prompts.prompts),
        {ac.name: (ac, table)},
        slo_s=np.array([30.0, 10.0, 20.0]),
        tier=("batch", "interactive", "standard"),
    )
    assert list(wl.slo_s) == [10.0, 20.0, 30.0]
    assert wl.tier == ("interactive", "standard", "batch")


def test_interactive_requests_overtake_queued_batch_work_at_their_level(sm):
    """One worker on one level, batch size 1: work queued behind the running request is pulled
    interactive first, then standard, then batch (FIFO within a tier), as the service's queues;
    the running request is not preempted and the worker does the same work in the same time."""
    from argusdiff.simulator.workload import Workload

    base = quick_workload("poisson:qpm=60,duration=1m", [sm], n_prompts=20)
    arrivals = np.array([0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.1, 0.2, 0.3])
    tiers = ("batch",) * 6 + ("standard", "interactive", "interactive")

    def sim(tier, **cfg):
        wl = Workload(
            arrivals_s=arrivals, prompt_idx=np.arange(len(arrivals)) % len(base.prompts), prompts=base.prompts,
            quality=base.quality, relative=base.relative, optimal=base.optimal, tier=tier,
        )  # fmt: skip
        pol = make_policy("clipper-ha", sm, rng=np.random.default_rng(0), config={"period_s": 60.0})
        res = simulate(pol, wl, SimConfig(gpus=1, period_s=60.0, slo_s=100.0, **cfg))
        assert res.plans[0]["workers"] == 1 and len({lv for lv in res.level}) == 1
        assert np.all(res.status == 1)
        return res

    tiered, fifo = sim(tiers), sim(None)
    assert list(np.argsort(fifo.finish_s, kind="stable")) == list(range(9))  # one tier: arrival order
    assert list(np.argsort(tiered.finish_s, kind="stable")) == [0, 7, 8, 6, 1, 2, 3, 4, 5]
    # work-conserving: the same batches, the last one done at the same time, none overlapping
    assert len(tiered.busy) == len(fifo.busy) == 9
    assert tiered.finish_s.max() == pytest.approx(fifo.finish_s.max())
    spans = sorted((s, e) for _, s, e in tiered.busy)
    assert all(e1 <= s2 + 1e-9 for (_, e1), (s2, _) in itertools.pairwise(spans))
    # the interactive requests waited only for the request in service and each other
    wait = tiered.finish_s - arrivals
    assert wait[7] < wait[8] < wait[6] < wait[1:6].min()
    summary = summarize(tiered)["tiers"]
    assert summary["interactive"]["requests"] == 2 and summary["batch"]["requests"] == 6
    # without tier awareness (the replay's -tiers ablation) the same tiers are pulled in arrival order
    unaware = sim(tiers, tier_priority=False)
    assert list(np.argsort(unaware.finish_s, kind="stable")) == list(range(9))
    assert summarize(unaware)["tiers"]["interactive"]["requests"] == 2
