"""The clairvoyant bound (argusdiff.bound): valid against a brute-force optimal schedule on small
instances and against every policy's simulated result on the shipped traces; its three ways of
writing every window agree."""

from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from argusdiff.bound import BOUND_LABEL, RELAXED, clairvoyant_bound, path_costs, request_slos
from argusdiff.domain import ApproxLevel, Profile, Strategy
from argusdiff.errors import ConfigError
from argusdiff.simulator.workload import Workload

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def toy_profile(slo: float = 6.0) -> Profile:
    """Three levels, the two faster ones batch (a batch of two costs less per image)."""
    levels = (
        ApproxLevel("big", Strategy.SM, "big", 50, 0, {1: 4.0}, 1.0, 0.0),
        ApproxLevel("mid", Strategy.SM, "mid", 50, 0, {1: 2.5, 2: 3.5}, 0.9, 0.0),
        ApproxLevel("small", Strategy.SM, "small", 50, 0, {1: 1.0, 2: 1.6}, 0.7, 0.0),
    )
    return Profile("toy", "cpu", levels, slo_s=slo)


def toy_workload(arrivals, rel: np.ndarray, tiers=None) -> Workload:
    n = len(arrivals)
    ids = ("big", "mid", "small")
    return Workload(
        arrivals_s=np.asarray(arrivals, dtype=float),
        prompt_idx=np.arange(n),
        prompts=[f"p{i}" for i in range(n)],
        quality={lv: rel[:, j].copy() for j, lv in enumerate(ids)},
        relative={lv: rel[:, j].copy() for j, lv in enumerate(ids)},
        tier=tiers,
    )


def brute_force(arrivals, deadlines, profile: Profile, rel: np.ndarray, workers: int) -> dict[int, float]:
    """The optimal schedules by enumeration: for each number S of requests served within their
    deadline, the most total relative quality of those S. A schedule gives each on-time request a
    worker and a level; each worker runs batches of one level one at a time, a batch starting once
    its members have arrived and its previous batch has finished, and taking latency(batch size);
    late requests are left out (they only take capacity)."""
    levels = profile.levels
    n = len(arrivals)

    @functools.cache
    def feasible(items: tuple[tuple[int, int], ...], t: float = 0.0) -> bool:
        if not items:
            return True
        # the first batch: any non-empty subset of one level among the items, then the rest
        for size in range(1, len(items) + 1):
            for batch in itertools.combinations(items, size):
                if len({p for _r, p in batch}) != 1:
                    continue
                lv = levels[batch[0][1]]
                start = max(t, max(arrivals[r] for r, _p in batch))
                finish = start + lv.latency(size)
                if any(finish > deadlines[r] + 1e-9 for r, _p in batch):
                    continue
                rest = tuple(x for x in items if x not in batch)
                if feasible(rest, finish):
                    return True
        return False

    options = [None] + [(w, p) for w in range(workers) for p in range(len(levels))]
    best: dict[int, float] = {}
    for choice in itertools.product(options, repeat=n):
        per_worker: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
        for r, opt in enumerate(choice):
            if opt is not None:
                per_worker[opt[0]].append((r, opt[1]))
        if all(feasible(tuple(sorted(items))) for items in per_worker):
            served = [(r, opt[1]) for r, opt in enumerate(choice) if opt is not None]
            s = len(served)
            q = sum(rel[r, p] for r, p in served)
            if q > best.get(s, -math.inf):
                best[s] = q
    return best


@pytest.mark.parametrize("seed", range(8))
def test_the_bound_is_at_least_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    n = 4 if seed % 2 else 5
    workers = 1 + seed % 2
    arrivals = np.sort(rng.uniform(0.0, 3.0 if seed < 4 else 8.0, n))
    rel = np.column_stack([np.ones(n), rng.uniform(0.6, 1.0, n), rng.uniform(0.2, 0.8, n)])
    profile = toy_profile(slo=float(rng.choice([4.5, 6.0])))
    wl = toy_workload(arrivals, rel)
    slo = request_slos(wl, profile.default_slo_s())
    best = brute_force(arrivals, arrivals + slo, profile, rel, workers)
    b = clairvoyant_bound(wl, profile, gpus=workers, bin_s=0.25)
    s_max = max(best)
    eps = 1e-6
    assert b.min_violation <= 1 - s_max / n + eps
    assert b.served_quality * n >= max(best.values()) - eps
    if s_max == n:
        assert b.quality * n >= best[n] - eps
    for s, q in best.items():
        if s:
            assert b.quality_at(1 - s / n) * s >= q - eps, (s, q, b)
            assert b.gap(1 - s / n, q / s) >= -eps


def test_the_bound_is_exact_when_requests_never_meet():
    # requests far apart on one worker: each takes its best level, nothing is relaxed
    arrivals = np.array([0.0, 20.0, 40.0, 60.0])
    rel = np.array([[1.0, 0.9, 0.5], [1.0, 0.95, 0.2], [1.0, 0.7, 0.6], [1.0, 0.8, 0.1]])
    wl = toy_workload(arrivals, rel)
    b = clairvoyant_bound(wl, toy_profile(), gpus=1, bin_s=0.5)
    assert b.min_violation == 0.0
    assert b.quality == pytest.approx(1.0)
    # with an SLO below the big level's 4 s the best feasible level is mid for each
    b = clairvoyant_bound(wl, toy_profile(slo=3.0), gpus=1, bin_s=0.5)
    assert b.quality == pytest.approx(rel[:, 1].mean())
    assert brute_force(arrivals, arrivals + 3.0, toy_profile(), rel, 1)[4] == pytest.approx(rel[:, 1].sum())


def test_a_burst_beyond_capacity_has_violations_and_the_fastest_levels():
    # ten requests at once, one worker, SLO 4.5 s: at most 4 small images (batches of two,
    # 0.8 s each) or so fit; the bound knows it
    arrivals = np.zeros(10)
    rel = np.tile([1.0, 0.9, 0.5], (10, 1))
    wl = toy_workload(arrivals, rel)
    b = clairvoyant_bound(wl, toy_profile(slo=4.5), gpus=1, bin_s=0.1)
    best = brute_force(arrivals[:6], arrivals[:6] + 4.5, toy_profile(), rel[:6], 1)
    assert 0.0 < b.min_violation < 1.0
    assert b.min_violation <= 1 - max(best) / 10 + 1e-9  # six of the ten already fail the brute force
    assert b.quality < 1.0


def test_path_costs_take_the_best_batch_within_the_slo():
    lv = ApproxLevel("x", Strategy.CASCADE, "x", 50, 0, {1: 6.1, 2: 10.65, 4: 20.92}, 1.0, 0.0)
    assert path_costs(lv, 15.0) == (pytest.approx(10.65 / 2), 6.1)  # batch 4 takes 20.9 s > 15 s
    assert path_costs(lv, 25.0)[0] == pytest.approx(20.92 / 4)
    assert path_costs(lv, 5.0) == (math.inf, math.inf)


def random_workload(seed: int, n: int = 60, tiers: bool = False) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 40, n))
    rel = np.column_stack([np.ones(n), rng.uniform(0.6, 1.0, n), rng.uniform(0.2, 0.8, n)])
    tier = tuple(rng.choice(["interactive", "standard", "batch"], n)) if tiers else None
    return toy_workload(arrivals, rel, tier)


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_backlog_flow_and_every_window_agree(gpus):
    wl = random_workload(gpus)
    p = toy_profile()
    got = [clairvoyant_bound(wl, p, gpus=gpus, bin_s=0.5, windows=w) for w in ("backlog", "flow", "all")]
    assert [g.windows for g in got] == ["backlog", "flow", "all"]
    for g in got[1:]:
        assert g.min_violation == pytest.approx(got[0].min_violation, abs=1e-7)
        assert g.quality == pytest.approx(got[0].quality, abs=1e-7)
        assert g.served_quality == pytest.approx(got[0].served_quality, abs=1e-7)
    # several SLO classes (tiers): the flow form against every window
    wl = random_workload(10 + gpus, tiers=True)
    flow, every = (clairvoyant_bound(wl, p, gpus=gpus, bin_s=0.5, windows=w) for w in ("auto", "all"))
    assert flow.windows == "flow"
    assert flow.served_quality == pytest.approx(every.served_quality, abs=1e-7)
    assert flow.min_violation == pytest.approx(every.min_violation, abs=1e-7)
    with pytest.raises(ConfigError, match="backlog"):
        clairvoyant_bound(wl, p, gpus=gpus, windows="backlog")


def test_request_slos_are_the_simulators():
    from argusdiff.policies import make_policy
    from argusdiff.profile import load_profile
    from argusdiff.simulator import SimConfig, simulate
    from argusdiff.simulator.workload import quick_workload

    p = load_profile("sm-a100")
    wl = quick_workload("bursty:low=40,high=160,period=1m,duration=3m,tiers=0.2/0.5/0.3", [p], n_prompts=200)
    res = simulate(make_policy("clipper-ht", p, rng=np.random.default_rng(0)), wl, SimConfig(gpus=2))
    assert set(wl.tier) == {"interactive", "standard", "batch"}
    np.testing.assert_allclose(request_slos(wl, res.slo_s), res.req_slo_s)


def test_bad_input_names_the_field():
    wl = random_workload(0)
    with pytest.raises(ConfigError, match="gpus"):
        clairvoyant_bound(wl, toy_profile(), gpus=0)
    with pytest.raises(ConfigError, match="slo"):
        clairvoyant_bound(wl, toy_profile(), gpus=1, slo_s=-1.0)
    with pytest.raises(ConfigError, match="bin"):
        clairvoyant_bound(wl, toy_profile(), gpus=1, bin_s=0.0)
    with pytest.raises(ConfigError, match="windows"):
        clairvoyant_bound(wl, toy_profile(), gpus=1, windows="some")
    other = Profile("other", "cpu", (ApproxLevel("zz", Strategy.SM, "zz", 1, 0, {1: 1.0}, 1.0, 0.0),))
    with pytest.raises(ConfigError, match="zz"):
        clairvoyant_bound(wl, other, gpus=1)


def test_the_relaxation_is_stated():
    joined = " ".join(RELAXED)
    for word in ("integrality", "batch", "model loads", "cache"):
        assert word in joined
    assert "not a policy" in BOUND_LABEL


# every shipped trace: the generators and the trace files of ../shared (a few minutes of each)
# at loads around what 4 workers carry on the AC ladder's fastest level (109 QPM), so that the
# policies' violations and qualities sit near the bound rather than far beyond capacity
SHIPPED = [
    "poisson:qpm=90,duration=4m",
    "bursty:low=30,high=130,period=1m,duration=4m",
    "diagonal:start=30,end=140,duration=4m",
    "diurnal:shape=azure,low=30,high=130,duration=4m",
    "azure:low=30,high=130,duration=4m",
]
GPUS = 4
SHARED_FILES = [
    "twitter_proteus_normal-high_load_300.txt",
    "twitter_proteus_low_load_300.txt",
    "twitter_proteus_medium-normal_load_1x.txt",
    "twitter_proteus_zipf_exponential_bursty_300.txt",
    "diffserve_maf_4to32qps.txt",
    "diffserve_maf_fixed_10qps.txt",
]


def _shipped():
    out = [pytest.param(s, id=s.split(":")[0]) for s in SHIPPED]
    for name in SHARED_FILES:
        path = SHARED_TRACES / name
        mark = pytest.mark.skipif(not path.exists(), reason=f"{path} not present (../shared)")
        out.append(pytest.param(f"{path}@peak_qpm=120,start=0,end=240", id=name.split(".")[0], marks=mark))
    return out


@pytest.mark.parametrize("trace", _shipped())
def test_the_bound_is_above_every_policy_on_every_shipped_trace(trace):
    from argusdiff.domain import level_catalogue
    from argusdiff.replay import ReplaySpec, prepare, run_replay

    spec = ReplaySpec(trace=trace, gpus=GPUS, embeddings=False, admission=False, mixed=True)
    prepared = prepare(spec)
    res = run_replay(spec, prepared=prepared)
    catalog = level_catalogue(*prepared.profiles.values())
    bounds = {}
    for label, run in res.results.items():
        s = res.summaries[label]
        key = run.level_ids
        if key not in bounds:
            p = next(iter(prepared.profiles.values()))
            levels = [catalog[i] for i in key if i in prepared.workload.relative]
            bounds[key] = clairvoyant_bound(prepared.workload, p, gpus=GPUS, slo_s=run.slo_s, levels=levels)
        b = bounds[key]
        v, q = s["slo_violation_ratio"], s["relative_quality"]
        assert v >= b.min_violation - 1e-9, (label, v, b)
        if s["within_slo"]:
            assert q <= b.quality_at(v) + 1e-9, (label, v, q, b)
            assert b.quality_at(v) <= b.max_quality
            assert b.gap(v, q) >= -1e-9
    assert len(res.results) >= 10


def test_the_replay_table_has_a_bound_row_per_profile_and_every_gap():
    from argusdiff.replay import ReplaySpec, run_replay
    from argusdiff.report import format_table, summary_json

    spec = ReplaySpec(
        trace="bursty:low=40,high=200,period=1m,duration=3m",
        policies=["argus+", "proteus", "diffserve"],
        ac_only=True,  # argus+ (AC) too: every profile of the replay
        gpus=4,
        embeddings=False,
        admission=False,
    )
    res = run_replay(spec)
    profiles = {s["profile"] for s in res.summaries.values()}
    assert set(res.bounds) == profiles and len(profiles) == 4
    table = format_table(res)
    rows = [line for line in table.splitlines() if line.startswith(BOUND_LABEL)]
    assert len(rows) == 4 and all(any(p in r for p in profiles) for r in rows)
    for label, s in res.summaries.items():
        b = res.bounds[s["profile"]]
        assert s["slo_violation_ratio"] >= b.min_violation - 1e-9, label
        assert s["bound_gap"] >= -1e-9, (label, s["bound_gap"])
    assert set(summary_json(res)["bounds"]) == profiles
    quiet = run_replay(ReplaySpec(**{**spec.__dict__, "bound": False}))
    assert quiet.bounds == {} and BOUND_LABEL not in format_table(quiet)


def test_the_cli_prints_the_bound_and_names_bad_options(capsys):
    import json

    from argusdiff.cli import main

    trace = "bursty:low=40,high=300,period=1m,duration=2m"
    assert (
        main(["bound", "--trace", trace, "--profile", "sdxl-ac-a100,cascade-sdxlltn-sdxl", "--gpus", "2", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    got = {b["profile"]: b for b in out["bounds"]}
    assert set(got) == {"sdxl-ac-a100", "cascade-sdxlltn-sdxl"}
    assert got["sdxl-ac-a100"]["min_violation"] > 0  # 300 QPM on two workers: beyond capacity
    assert got["sdxl-ac-a100"]["label"] == BOUND_LABEL
    assert main(["bound", "--trace", trace, "--profile", "sm-a100", "--gpus", "2"]) == 0
    text = capsys.readouterr().out
    assert "sm-a100" in text and "relaxed:" in text
    for args, option in (
        (["--gpus", "0"], "--gpus"),
        (["--slo", "-3"], "--slo"),
        (["--bin", "zero"], "--bin"),
        (["--profile", "no-such-profile"], "--profile"),
        (["--trace", "nope:x=1"], "--trace"),
        (["--load-fraction", "0"], "--load-fraction"),
        (["--faults", "gpus:x@1m+1m"], "--faults"),
    ):
        assert main(["bound", "--trace", trace, *args] if args[0] != "--trace" else ["bound", *args]) == 2
        assert option in capsys.readouterr().err


def test_faults_change_the_capacity():
    from argusdiff.simulator.faults import Fault

    wl = random_workload(3, n=80)
    p = toy_profile()
    base = clairvoyant_bound(wl, p, gpus=2, bin_s=0.5)
    off = clairvoyant_bound(wl, p, gpus=2, bin_s=0.5, faults=[Fault("gpus", 0.0, 60.0, 1)])
    slow = clairvoyant_bound(wl, p, gpus=2, bin_s=0.5, faults=[Fault("slow", 0.0, 60.0, 2, 2.0)])
    fast = clairvoyant_bound(wl, p, gpus=2, bin_s=0.5, faults=[Fault("slow", 0.0, 60.0, 2, 0.5)])
    one = clairvoyant_bound(wl, p, gpus=1, bin_s=0.5)
    four = clairvoyant_bound(wl, p, gpus=4, bin_s=0.5)
    assert off.served_quality == pytest.approx(one.served_quality)  # one of two off all along
    assert slow.served_quality == pytest.approx(base.served_quality)  # slower: still a bound
    assert fast.served_quality == pytest.approx(four.served_quality)  # twice as fast: twice the capacity
    assert one.served_quality < base.served_quality < four.served_quality
