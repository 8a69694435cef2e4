"""Admission after the policy (argusdiff.admission): the definitely-late test and the queue cap,
the same decision through the live router and the simulator, the knobs, and the replay switch."""

from __future__ import annotations

import os

import numpy as np
import pytest

from argusdiff.admission import Admission, AdmissionConfig, serving_workers
from argusdiff.domain import Plan, tier_rank
from argusdiff.errors import ConfigError
from argusdiff.profile import load_profile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _plan(profile, assignment, batch_sizes=None) -> Plan:
    n = len(profile.ids)
    return Plan(
        version=1,
        created_s=0.0,
        strategy=next(iter(profile.strategies)),
        levels=profile.ids,
        assignment=assignment,
        share=tuple(1.0 / n for _ in range(n)),
        pasm=tuple(tuple(1.0 if i == j else 0.0 for j in range(n)) for i in range(n)),
        predicted_qpm=0.0,
        expected_quality=0.0,
        batch_sizes=batch_sizes or {},
    )


@pytest.fixture(scope="module")
def sm():
    return load_profile("sm-a100")


def test_definitely_late_refuses_with_a_retry_after_from_the_backlog(sm):
    levels = {lv.id: lv for lv in sm.levels}
    adm = Admission(levels, AdmissionConfig(deadline_factor=1.0))
    plan = _plan(sm, {"w0": "sd-xl", "w1": "sd-xl", "w2": "tiny-sd"})
    slo = 12.6  # 3 x 4.2 s
    kw = dict(plan=plan, workers=2, now_s=100.0, arrival_s=100.0, slo_s=slo)
    # sd-xl, 2 workers: the request waits behind q // 2 on the least loaded worker, the one in
    # service counted whole: finish = (q // 2 + 1) x 4.2 <= 12.6 -> q <= 5
    assert all(adm.check("sd-xl", queued=q, **kw).admitted for q in range(6))
    assert adm.most_admitted("sd-xl", plan=plan, workers=2, slo_s=slo) == 5
    refused = [adm.check("sd-xl", queued=q, **kw) for q in range(6, 40)]
    assert not any(d.admitted for d in refused) and {d.reason for d in refused} == {"definitely late"}
    retry = [d.retry_after_s for d in refused]
    # the seconds until the backlog is back to 5: (q - 5) x 2.1 s, whole seconds, capped at 60
    assert retry[0] == 3 and retry == sorted(retry) and len(set(retry)) > 10 and max(retry) == 60
    # a request that waited before it was routed (a redispatch) has less of its SLO left
    assert not adm.check("sd-xl", queued=4, **{**kw, "arrival_s": 99.0}).admitted
    # another level's backlog is its own
    assert adm.check("tiny-sd", queued=4, **{**kw, "workers": 1}).admitted
    assert not adm.check("tiny-sd", queued=5, **{**kw, "workers": 1}).admitted
    # off: everything passes
    off = Admission(levels, AdmissionConfig(enabled=False))
    assert off.check("sd-xl", queued=1000, **kw).admitted
    # a looser deadline factor admits more; a faster stand-in scale too
    assert Admission(levels, AdmissionConfig(deadline_factor=1.5)).check("sd-xl", queued=7, **kw).admitted
    assert (
        Admission(levels, AdmissionConfig(deadline_factor=1.0, time_scale=0.5)).check("sd-xl", queued=10, **kw).admitted
    )
    # the default leaves headroom: definitely late at 0.8 x SLO ((q // 2 + 1) x 4.2 <= 10.08 -> q <= 3)
    assert Admission(levels).check("sd-xl", queued=3, **kw).admitted
    assert not Admission(levels).check("sd-xl", queued=4, **kw).admitted
    # a level too slow for the SLO admits nothing
    assert Admission(levels).most_admitted("sd-xl", plan=plan, workers=2, slo_s=4.0) == -1


def test_queue_cap_backs_up_the_estimate(sm):
    levels = {lv.id: lv for lv in sm.levels}
    plan = _plan(sm, {"w0": "tiny-sd", "w1": "tiny-sd"})
    adm = Admission(levels, AdmissionConfig(queue_cap=3, deadline_factor=100))
    kw = dict(plan=plan, workers=2, now_s=0.0, arrival_s=0.0, slo_s=10.0)
    assert adm.check("tiny-sd", queued=5, **kw).admitted
    d = adm.check("tiny-sd", queued=6, **kw)
    assert not d.admitted and d.reason == "queue cap" and d.retry_after_s >= 1
    # no worker serves the level (it waits for the next plan): the cap of one worker, no estimate
    assert adm.check("sd-xl", queued=2, **{**kw, "workers": 0}).admitted
    assert not adm.check("sd-xl", queued=3, **{**kw, "workers": 0}).admitted
    assert (
        Admission(levels, AdmissionConfig(queue_cap=0, deadline_factor=100)).check("tiny-sd", queued=500, **kw).admitted
    )


def test_batch_size_sets_the_drain_rate():
    demo = load_profile("demo-cpu")
    levels = {lv.id: lv for lv in demo.levels}
    kw = dict(workers=1, now_s=0.0, arrival_s=0.0, slo_s=2.0)
    single = _plan(demo, {"w0": "xl-k0"})
    batched = _plan(demo, {"w0": "xl-k0"}, {"xl-k0": 4})
    adm = Admission(levels, AdmissionConfig(deadline_factor=1.0))
    # one at a time: 0.3643 s each -> 4 queued + own run = 1.82 s; batches of 4: 1.035 / 4 each
    assert adm.check("xl-k0", queued=4, plan=single, **kw).admitted
    assert not adm.check("xl-k0", queued=5, plan=single, **kw).admitted
    # batches of 4: the batch in service (min(q, 4), counted whole), then the rest and the request
    # in batches of 4: q = 6 -> latency(4) + latency(3) = 1.85 s; q = 7 -> 2 x latency(4) = 2.07 s
    assert adm.check("xl-k0", queued=6, plan=batched, **kw).admitted
    assert not adm.check("xl-k0", queued=7, plan=batched, **kw).admitted
    assert adm.most_admitted("xl-k0", plan=batched, workers=1, slo_s=2.0) == 6


def test_serving_workers_includes_ac_siblings_without_workers():
    demo = load_profile("demo-cpu")
    levels = {lv.id: lv for lv in demo.levels}
    plan = _plan(demo, {"w0": "xl-k0", "w1": "xl-k0", "w2": None})
    # NIRVANA's plan: every worker at K = 0, requests routed to K = 4 by their cache similarity
    assert serving_workers(plan, levels, "xl-k4") == ("w0", "w1")
    assert serving_workers(plan, levels, "xl-k4", up={"w1"}) == ("w1",)
    plan2 = _plan(demo, {"w0": "xl-k0", "w1": "xl-k4"})
    assert serving_workers(plan2, levels, "xl-k4") == ("w1",)
    assert serving_workers(plan2, levels, "xl-k2") == ("w0", "w1")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"queue_cap": -1}, "queue_cap"),
        ({"deadline_factor": 0}, "deadline_factor"),
        ({"max_retry_after_s": float("nan")}, "max_retry_after_s"),
        ({"time_scale": -2}, "time_scale"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_admission_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        AdmissionConfig(**kwargs)


def test_admission_section_of_the_configuration(tmp_path):
    from argusdiff.config import load_settings

    s = load_settings(environ={})
    assert s.admission.enabled and s.admission.queue_cap == 64 and s.admission.replay
    mech = s.admission.mechanism(time_scale=0.5)
    assert mech.enabled and mech.time_scale == 0.5 and mech.queue_cap == 64
    with pytest.raises(ConfigError, match=r"admission\.queue_cap"):
        load_settings(environ={"ARGUSDIFF_ADMISSION__QUEUE_CAP": "-3"})
    p = tmp_path / "c.toml"
    p.write_text("[admission]\ndeadline_factor = 0\n")
    with pytest.raises(ConfigError, match=r"admission\.deadline_factor"):
        load_settings(p, environ={})
    p.write_text("[admission]\nenabled = false\nqueue_cap = 0\n")
    assert not load_settings(p, environ={}).admission.mechanism().enabled


def test_service_and_simulator_take_the_same_decision_for_the_same_state(sm):
    """The same plan, backlog and request through the live router's call site and the simulator's:
    every decision (admit, refuse and why) is the same, over backlogs from empty to far past the
    deadline, for a level with its own workers, one without, and workers that are down."""
    from fixtures_service import service_settings

    from argusdiff.policies import make_policy
    from argusdiff.policies.base import RouteView
    from argusdiff.service.app import Service
    from argusdiff.simulator import SimConfig, quick_workload
    from argusdiff.simulator.engine import Simulator

    cfg = AdmissionConfig(queue_cap=3, deadline_factor=3.0)
    settings = service_settings("sm-a100", workers=0, stand_in_scale=None).model_dump()
    settings["admission"] = {"queue_cap": 3, "deadline_factor": 3.0}
    from argusdiff.config import Settings

    service = Service(Settings.model_validate(settings))
    router = service.router
    assert router.admission.config == cfg

    wl = quick_workload("poisson:qpm=60,duration=2m", [sm], n_prompts=50)
    policy = make_policy("argus", sm, rng=np.random.default_rng(0), config={"period_s": 60.0})
    sim = Simulator(policy, wl, SimConfig(gpus=4, admission=cfg))
    sim.admission = Admission(sim.levels, cfg)

    plan = _plan(sm, {"w0": "sd-xl", "w1": "sd-xl", "w2": "tiny-sd", "w3": None})
    i = 7
    now = float(wl.arrivals_s[i])
    slo = float(sim.req_slo[i])
    outcomes = set()
    for up in ({"w0", "w1", "w2", "w3"}, {"w0", "w2", "w3"}):
        router.set_plan(plan, frozenset(up))
        for level in ("sd-xl", "tiny-sd", "small-sd"):
            for queued in range(0, 20):
                router.tier_load.clear()
                router.tier_load[level, tier_rank(None)] = queued
                live = router._admit(level, plan, now, slo, tier_rank(None))
                # the simulator holds the same backlog on the up workers serving the level
                ws = [w for w, lv in plan.assignment.items() if lv == level and w in up]
                if not ws and queued:
                    continue  # the simulator's workers take such requests at once: no such backlog
                ql = {w: 0 for w in plan.assignment}
                for k in range(queued):
                    if ws:
                        ql[ws[k % len(ws)]] += 1
                _hold(sim, RouteView(queue_lengths=ql, up=set(up), slo_s=slo))
                simulated = sim._admit(i, level, plan, now)
                assert simulated == live, (up, level, queued)
                outcomes.add((live.admitted, live.reason))
    assert outcomes == {(True, ""), (False, "definitely late"), (False, "queue cap")}


def _hold(sim, view) -> None:
    """Put a simulator that has not run into the state its event loop keeps for admission: the
    route view, the queue length per worker id (``qd``, which the loop keeps current) and a new
    version of the up set (its cache of each level's serving workers is dropped)."""
    sim.view = view
    sim.qd = dict(view.queue_lengths)
    sim._upv = getattr(sim, "_upv", 0) + 1
    sim._adm_key, sim._adm_ws = (None, -1), {}


def test_a_request_waits_only_behind_its_tier_or_higher_in_both_paths(sm):
    """Workers pull a level's queue highest-priority tier first, so admission counts the backlog of
    the request's tier and the higher ones: an interactive request is admitted where a batch one
    is refused behind the same batch-tier backlog, by the live router and the simulator alike."""
    from fixtures_service import service_settings

    from argusdiff.config import Settings
    from argusdiff.policies import make_policy
    from argusdiff.policies.base import RouteView
    from argusdiff.service.app import Service
    from argusdiff.simulator import SimConfig, quick_workload
    from argusdiff.simulator.engine import Simulator, _Batch

    cfg = AdmissionConfig(queue_cap=0, deadline_factor=1.0)
    settings = service_settings("sm-a100", workers=0, stand_in_scale=None).model_dump()
    settings["admission"] = {"queue_cap": 0, "deadline_factor": 1.0}
    router = Service(Settings.model_validate(settings)).router
    plan = _plan(sm, {"w0": "sd-xl", "w1": None, "w2": None, "w3": None})
    router.set_plan(plan, frozenset({"w0", "w1", "w2", "w3"}))
    base = quick_workload("poisson:qpm=60,duration=1m", [sm], n_prompts=20)
    n = base.n_requests
    tiers = ("batch",) * (n - 2) + ("standard", "interactive")
    wl = type(base)(arrivals_s=base.arrivals_s, prompt_idx=base.prompt_idx, prompts=base.prompts, quality=base.quality,
                    relative=base.relative, optimal=base.optimal, tier=tiers)  # fmt: skip
    policy = make_policy("argus", sm, rng=np.random.default_rng(0), config={"period_s": 60.0})
    sim = Simulator(policy, wl, SimConfig(gpus=4, admission=cfg, slo_s=12.6))
    sim.admission = Admission(sim.levels, cfg)
    backlog = 20  # batch-tier requests queued at sd-xl's one worker: far past a 1x deadline
    sim.widx = {f"w{k}": k for k in range(4)}
    sim.up = [True] * 4
    sim.dq = [[_Batch(0.0, 1e9, 1, "sd-xl", [k], 0, 1.0, 0.0, 2) for k in range(backlog)], [], [], []]
    assert all(b.finish > 0 and b.rank == 2 and len(b.members) == 1 for b in sim.dq[0])
    _hold(sim, RouteView(queue_lengths={"w0": backlog, "w1": 0, "w2": 0, "w3": 0}, up={"w0", "w1", "w2", "w3"}))
    router.tier_load.clear()
    router.tier_load["sd-xl", tier_rank("batch")] = backlog
    outcomes = {}
    for i, tier in ((0, "batch"), (n - 2, "standard"), (n - 1, "interactive")):
        slo = float(sim.req_slo[i])
        live = router._admit("sd-xl", plan, 0.0, slo, tier_rank(tier))
        simulated = sim._admit(i, "sd-xl", plan, 0.0)
        assert simulated == live, tier
        outcomes[tier] = live.admitted
    assert outcomes == {"batch": False, "standard": True, "interactive": True}


def test_replay_applies_admission_by_default_and_says_so(capsys):
    """`argusdiff replay` on an overloaded trace: admission refuses (counted as dropped, hence as
    SLO violations) and the summary says it was on; --no-admission runs the policy alone."""
    import json

    from argusdiff.cli import main

    args = ["replay", "--trace", "poisson:qpm=300,duration=4m", "--no-embeddings", "--quiet", "--gpus", "2"]
    args += ["--policies", "argus", "--json"]
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert on["provenance"]["admission"].startswith("on")
    s = on["policies"]["argus"]
    assert s["admission"] == "on" and 0 < s["refused"] <= s["dropped"]
    assert s["requests"] - s["within_slo"] >= s["refused"]  # a refusal is a violation
    assert main([*args, "--no-admission"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["provenance"]["admission"] == "off"
    t = off["policies"]["argus"]
    assert t["admission"] == "off" and t["refused"] == 0 and t["dropped"] == 0
    # the admitted requests are served within their SLO far more often than without admission
    assert s["within_slo"] / max(1, s["served"]) > t["within_slo"] / max(1, t["served"])
    assert main([*args[:-1]]) == 0
    assert "admission: on" in capsys.readouterr().out
