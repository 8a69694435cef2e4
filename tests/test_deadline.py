"""One deadline model (argusdiff.deadline): argus+ routes to the deadline admission judges, admission
takes its verdict (a request routed to be on time is never refused, a refused one is late on every
allowed path), and the simulator counts the refusals that would have met their SLO."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from argusdiff.admission import Admission, AdmissionConfig
from argusdiff.deadline import deadline_s, earliest_finish, finish_s, moved_by_deadline
from argusdiff.domain import DeadlineVerdict, Outcome, Plan, RouteReason, Timeliness
from argusdiff.policies import make_policy
from argusdiff.profile import load_profile
from argusdiff.simulator import SimConfig, quick_workload, simulate, summarize

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_finish_estimate_and_deadline():
    assert deadline_s(10.0, 12.6) == pytest.approx(22.6)
    assert deadline_s(10.0, 10.0, 0.8) == pytest.approx(18.0)
    assert finish_s(5.0, 3.0, 2.0) == 7.0 and finish_s(5.0, 9.0, 2.0) == 11.0
    w, f = earliest_finish(["a", "b", "c"], {"a": 9.0, "b": 4.0, "c": 4.0}, 5.0, 2.0)
    assert (w, f) == ("b", 7.0)  # the first worker that frees (ties: the first given)
    assert earliest_finish([], {}, 0.0, 1.0) == (None, math.inf)


def _plan(profile, assignment) -> Plan:
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
    )


def test_one_constructor_for_a_move_by_deadline():
    """argus+'s ladder and unified routings build their escalated and best-effort assignments with
    one constructor; only the words of where an escalation went differ."""
    up = moved_by_deadline(Timeliness.ESCALATED, "fast", "w1", "best", 8.0, 9.0, to="a faster level")
    assert (up.level, up.worker, up.optimal_level) == ("fast", "w1", "best")
    assert up.outcome is Outcome.ESCALATED and up.cause is RouteReason.DEADLINE_MOVED and not up.best_effort
    assert (
        up.verdict == DeadlineVerdict(Timeliness.ESCALATED, 8.0, 9.0)
        and up.reason == "deadline: moved to a faster level"
    )
    assert (
        moved_by_deadline(Timeliness.ESCALATED, "fast", "w1", None, 8.0, 9.0).reason
        == "deadline: moved to another path"
    )
    late = moved_by_deadline(Timeliness.LATE, "fast", "w2", "best", 12.0, 9.0)
    assert late.outcome is Outcome.SERVED and late.cause is RouteReason.DEADLINE_LATE and late.best_effort
    assert late.verdict == DeadlineVerdict(Timeliness.LATE, 12.0, 9.0) and late.taken
    with pytest.raises(ValueError, match="not a move"):
        moved_by_deadline(Timeliness.ON_TIME, "fast", "w1", None, 8.0, 9.0)


def test_admission_takes_the_policys_verdict():
    sm = load_profile("sm-a100")
    adm = Admission({lv.id: lv for lv in sm.levels}, AdmissionConfig(queue_cap=3))
    plan = _plan(sm, {"w0": "sd-xl", "w1": "tiny-sd"})
    kw = dict(plan=plan, workers=1, now_s=0.0, arrival_s=0.0, slo_s=12.6)
    # without a verdict: 50 queued at SD-XL is late by admission's own estimate (and over the cap)
    assert not adm.check("sd-xl", queued=50, **kw).admitted
    # the policy judged it on time: admitted, neither the estimate nor the cap second-guess it
    on_time = DeadlineVerdict(Timeliness.ESCALATED, 8.0, 12.6)
    d = adm.check("sd-xl", queued=50, verdict=on_time, **kw)
    assert d.admitted and d.finish_s == 8.0
    # late on every path: refused, with a retry after the overrun
    late = DeadlineVerdict(Timeliness.LATE, 30.0, 12.6)
    d = adm.check("sd-xl", queued=0, verdict=late, **kw)
    assert not d.admitted and d.reason == "definitely late" and d.retry_after_s == 18
    # no serving worker frees up (all down): an infinite finish estimate is refused, never a crash
    never = DeadlineVerdict(Timeliness.LATE, float("inf"), 12.6)
    d = adm.check("sd-xl", queued=0, verdict=never, **kw)
    assert not d.admitted and d.retry_after_s == adm.config.max_retry_after_s
    # admission off: the verdict does not matter
    off = Admission({lv.id: lv for lv in sm.levels}, AdmissionConfig(enabled=False))
    assert off.check("sd-xl", queued=0, verdict=late, **kw).admitted


@pytest.mark.parametrize("profile_name", ["sdxl-ac-a100", "unified-a100"])
def test_argus_plus_is_refused_only_when_late_on_every_path(profile_name):
    """With admission on, every argus+ request carries a verdict; exactly the late ones are refused,
    and the simulator counts the refusals that would have met their SLO."""
    profile = load_profile(profile_name)
    wl = quick_workload("bursty:low=60,high=400,period=2m,duration=8m", [profile], n_prompts=300)
    pol = make_policy("argus+", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    verdicts: dict[str, DeadlineVerdict | None] = {}
    decide = pol.decide

    def recording(request, plan, view):
        a = decide(request, plan, view)
        verdicts[request.id] = a.verdict
        if a.verdict is not None:
            # routed to the deadline admission judges, with admission's factor
            assert a.verdict.deadline_s == pytest.approx(request.arrival_s + 0.8 * view.slo_s)
        return a

    pol.decide = recording
    res = simulate(pol, wl, SimConfig(gpus=4, admission=AdmissionConfig(deadline_factor=0.8)))
    kinds = {i: v.kind for i, v in verdicts.items() if v is not None}
    refused = {str(i) for i in np.flatnonzero(res.refused)}
    late = {i for i, k in kinds.items() if k is Timeliness.LATE}
    assert refused, "the burst should overload 4 workers"
    assert refused == late  # never an on-time or escalated request
    assert any(k is Timeliness.ESCALATED for k in kinds.values())
    s = summarize(res)
    assert 0 <= s["false_refusals"] <= s["refused"] == len(refused)
    assert s["false_refusals"] == int(res.false_refused.sum())
    assert not res.false_refused[~res.refused].any()
