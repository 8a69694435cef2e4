"""A policy's control-path state survives a JSON round trip: a policy that imports it plans the
next periods exactly as the one that exported it would have (what a new leader relies on)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from argusdiff.domain import ClusterStats
from argusdiff.policies import make_policy
from argusdiff.policies.state import export_state, import_state

WORKERS = tuple(f"w{i}" for i in range(6))


def _stats(profile, t: int, arrivals: int, current=None, cache_error_rate: float = 0.0) -> ClusterStats:
    ids = profile.ids
    affinity = {ids[i % len(ids)]: (t + i) % 7 for i in range(len(ids))}
    return ClusterStats(
        now_s=10.0 * t,
        period_s=10.0,
        arrivals=arrivals,
        workers=WORKERS,
        current=current or {},
        affinity=affinity,
        cache_error_rate=cache_error_rate,
        level_queue={ids[0]: t % 3},
    )


def _plans(policy, profile, start: int, n: int, current=None):
    out = []
    for t in range(start, start + n):
        plan = policy.plan(_stats(profile, t, 20 + 13 * t, current))
        current = dict(plan.assignment)
        out.append(plan)
    return out, current


def _pair(name, profile, **opts):
    return [make_policy(name, profile, rng=np.random.default_rng(0), config={"period_s": 10.0, **opts}) for _ in "ab"]


@pytest.mark.parametrize("name", ["argus", "argus+", "pac", "proteus", "sommelier"])
def test_imported_state_plans_like_the_exporter(name, ac, sm):
    profile = sm if name in ("proteus", "sommelier") else ac
    opts = {"fallback": sm} if name in ("argus", "argus+") else {}
    leader, successor = _pair(name, profile, **opts)
    _, current = _plans(leader, profile, 0, 5)
    state = json.loads(json.dumps(export_state(leader)))  # through JSON, as through Redis
    taken = import_state(successor, state)
    assert "version" in taken
    a, _ = _plans(leader, profile, 5, 4, current)
    b, _ = _plans(successor, profile, 5, 4, current)
    assert [(p.version, dict(p.assignment), p.pasm, p.predicted_qpm) for p in a] == [
        (p.version, dict(p.assignment), p.pasm, p.predicted_qpm) for p in b
    ]


def test_argus_state_carries_demand_histograms_and_the_active_strategy(ac, sm):
    leader, successor = _pair("argus", ac, fallback=sm)
    leader.plan(_stats(ac, 1, 600))
    leader.plan(_stats(ac, 2, 600, cache_error_rate=0.9))  # cache degraded: AC -> SM
    assert leader.active is leader.fallback
    taken = import_state(successor, json.loads(json.dumps(export_state(leader))))
    assert {"demand", f"histogram:{ac.name}", f"histogram:{sm.name}", "active"} <= set(taken)
    assert successor.active is successor.fallback and successor.switches_to_sm == 1
    assert successor.demand.predicted == pytest.approx(leader.demand.predicted)
    assert successor.histograms[ac.name].counts() == leader.histograms[ac.name].counts()


def test_diffserve_state_carries_its_demand_predictor(cascade):
    leader, successor = _pair("diffserve", cascade)
    for t in range(6):
        leader.plan(_stats(cascade, t, 30 * t))
    assert "demand" in import_state(successor, json.loads(json.dumps(export_state(leader))))
    assert successor.demand.state() == leader.demand.state()
    assert successor.plan(_stats(cascade, 7, 90)).predicted_qpm == leader.plan(_stats(cascade, 7, 90)).predicted_qpm


def test_state_of_another_policy_or_changed_levels_is_not_taken(ac, sm):
    argus = _pair("argus", ac)[0]
    argus.plan(_stats(ac, 1, 100))
    pac = make_policy("pac", ac, rng=np.random.default_rng(0))
    assert import_state(pac, export_state(argus)) == []
    state = export_state(argus)
    state["histograms"][ac.name]["levels"] = ["other"]
    fresh = make_policy("argus", ac, rng=np.random.default_rng(0))
    assert f"histogram:{ac.name}" not in import_state(fresh, state)
    assert len(fresh.histograms[ac.name]) == 0
