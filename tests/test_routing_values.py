"""Routing going down as a value (issue 25, point 2): every policy routes each request with the
immutable routing object its plan carries (``Plan.routing``), built from the plan, the profile and
the options (never a reference to the policy) when the plan is made, with the policy's generator
passed in; argus+'s modes are named classes."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest

from argusdiff.domain import ClusterStats, Request
from argusdiff.policies import RouteView, make_policy
from argusdiff.policies.mixed import merged_ladder
from argusdiff.profile import load_profile

WORKERS = ("w0", "w1", "w2", "w3", "w4", "w5")


def _profile(name: str):
    if name == "mixed":
        return merged_ladder(load_profile("sdxl-ac-a100"), load_profile("sm-a100-gputable"))
    return load_profile(name)


@pytest.mark.parametrize(
    ("policy_name", "profile_name", "kind"),
    [
        ("argus", "sm-a100", "ArgusRouting"),
        ("pac", "sdxl-ac-a100", "ArgusRouting"),
        ("argus+", "sdxl-ac-a100", "LadderRouting"),
        ("argus+", "sm-a100", "LadderRouting"),
        ("argus+", "mixed", "MixedLadderRouting"),
        ("argus+", "unified-a100", "UnifiedRouting"),
        ("proteus", "sm-a100", "ProteusRouting"),
        ("sommelier", "sm-a100", "SommelierRouting"),
        ("nirvana", "sdxl-ac-a100", "NirvanaRouting"),
        ("clipper-ha", "sm-a100", "StaticRouting"),
        ("clipper-ht", "sm-a100", "StaticRouting"),
        ("diffserve", "cascade-sdturbo-sdv15", "DiffServeRouting"),
        ("diffserve-static", "cascade-sdturbo-sdv15", "DiffServeRouting"),
    ],
)
def test_each_plan_routes_with_one_immutable_value(policy_name, profile_name, kind):
    profile = _profile(profile_name)
    config = {"backend": "highs", "slo_s": 12.6} if profile_name == "mixed" else {"backend": "highs"}
    if policy_name == "diffserve-static":
        config["peak_qpm"] = 120.0
    pol = make_policy(policy_name, profile, rng=np.random.default_rng(0), config=config)
    plan = pol.plan(ClusterStats(now_s=60.0, period_s=60.0, arrivals=120, workers=WORKERS))
    r = plan.routing  # the plan carries it: built by the policy when it made the plan
    assert type(r).__name__ == kind
    with pytest.raises(AttributeError):
        r.levels = ()  # immutable
    slots = {s for c in type(r).__mro__ for s in getattr(c, "__slots__", ())}
    assert not any(getattr(r, s) is pol for s in slots)  # no back-reference to the mutable policy

    # the routing object alone, with a generator of the same seed, decides what the policy decides
    view = RouteView(now_s=60.0, busy_until=dict.fromkeys(WORKERS, 0.0), up=set(WORKERS), slo_s=pol.slo_s)
    rng = np.random.default_rng(0)
    for k, lv in enumerate(profile.ids * 3):
        view.optimal_level = lv
        view.cache_similarity = 0.95 if k % 2 else 0.5
        view.now_s = 60.0 + 7.0 * k
        req = Request(id=str(k), prompt="p", arrival_s=view.now_s - 3.0 * (k % 4))
        assert pol.route(req, plan, view) == r.route(req, view, rng)
        view.deferred_from = plan.levels[-1] if pol.cascade else None
        assert pol.route_heavy(req, plan, view) == r.route_heavy(req, view)
        view.deferred_from = None
    # a new plan carries a new routing object (a plan kept, diffserve-static's, keeps its own)
    plan2 = pol.plan(ClusterStats(now_s=120.0, period_s=60.0, arrivals=300, workers=WORKERS))
    assert plan2.routing is not None and (plan2.routing is r) == (plan2 is plan)
    # not data of the plan: equality leaves it out, a changed copy has none until routed, a
    # renumbered one keeps it
    bare = dataclasses.replace(plan)
    assert bare.routing is None and bare == plan and "routing" not in repr(plan)
    assert plan.renumbered(plan.version + 5).routing is r
    assert pol.routed(plan) is plan and type(pol.routed(bare).routing) is type(r)
    # a routed plan pickles and deep-copies, routing included, as a plan without one does
    for copied in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert copied == plan and type(copied.routing) is type(r)
        with pytest.raises(AttributeError):
            copied.routing.levels = ()
        assert copied.routing.route(req, view, np.random.default_rng(3)) == r.route(req, view, np.random.default_rng(3))


@pytest.mark.parametrize(("policy_name", "profile_name"), [("argus", "sm-a100"), ("argus+", "unified-a100")])
def test_a_plan_read_from_the_control_store_is_routed_by_the_routers_policy(policy_name, profile_name):
    """A follower reads the plan as JSON (no routing object): its router attaches one its own
    policy builds, which routes as the leader's does."""
    from argusdiff.service.plans import plan_from_dict, plan_to_dict

    profile = _profile(profile_name)
    leader = make_policy(policy_name, profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    follower = make_policy(policy_name, profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    plan = leader.plan(ClusterStats(now_s=60.0, period_s=60.0, arrivals=120, workers=WORKERS))
    read = plan_from_dict(plan_to_dict(plan))
    assert read.routing is None and read == plan
    routed = follower.routed(read)
    assert type(routed.routing) is type(plan.routing)
    view = RouteView(now_s=60.0, busy_until=dict.fromkeys(WORKERS, 0.0), up=set(WORKERS), slo_s=leader.slo_s)
    for k, lv in enumerate(profile.ids * 2):
        view.optimal_level = lv
        req = Request(id=str(k), prompt="p", arrival_s=59.0)
        assert leader.decide(req, plan, view) == follower.decide(req, routed, view)
