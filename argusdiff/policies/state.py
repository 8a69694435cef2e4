"""What a policy's ``plan()`` keeps between periods, as JSON, so another process can continue it.

A router that takes the control loop over from a dead leader (:mod:`argusdiff.service.leader`)
imports the state the leader exported with its last plan, and plans its first period from the
same demand prediction, affinity histograms H and active strategy instead of from zero.

The state is a small JSON object of the control-path fields the policies keep (every field is
optional, and a policy imports only the fields it has):

* ``version`` — the policy's own plan counter;
* ``demand`` — the demand predictor (:class:`~argusdiff.predictors.DemandPredictor`): its
  reading, completed bins, the incomplete bin and observations (taken only when the importing
  policy reads demand the same way);
* ``histograms`` — each affinity histogram H (:class:`~argusdiff.predictors.AffinityHistogram`)
  by profile name: the optimal levels of its last ``window`` prompts, oldest first;
* ``active`` — the name of the profile in force (ARGUS's AC↔SM switch) and the switch counters;
* move hysteresis; Sommelier's per-worker rate EWMA and choice; argus+'s observed cache hit rate
  and SLO tier mix (unified plans).

Data-path caches (routing tables, solver memos) are not state: they are rebuilt from the plan.
Import skips what no longer fits (a histogram whose levels changed, an unknown active profile),
so a router with a changed configuration starts those parts afresh instead of failing.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["STATE_FORMAT", "export_state", "import_state"]

STATE_FORMAT = 1

# plain numeric fields, by attribute name (all optional)
_SCALARS = ("healthy_periods", "switches_to_sm", "switches_to_ac", "_last_move", "_last_dir", "_hit_rate")


def _num(x: Any) -> float | int | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return x if math.isfinite(float(x)) else None


def _export_demand(d: Any) -> dict[str, Any]:
    return d.state()


def _import_demand(policy: Any, data: dict[str, Any]) -> bool:
    """Replace the policy's predictor with the exported one when both read demand the same way."""
    from argusdiff.errors import ConfigError
    from argusdiff.predictors import DemandPredictor

    try:
        taken = DemandPredictor.from_state(data)
    except ConfigError:
        return False
    if taken.spec != policy.demand.spec:
        return False  # the configuration changed: the predictor starts afresh
    policy.demand = taken
    return True


def export_state(policy: Any) -> dict[str, Any]:
    """The control-path state of ``policy`` as a JSON-able dict."""
    out: dict[str, Any] = {"format": STATE_FORMAT, "policy": policy.name, "version": int(policy._version)}
    demand = getattr(policy, "demand", None)
    if demand is not None and hasattr(demand, "state"):
        out["demand"] = _export_demand(demand)
    histograms = getattr(policy, "histograms", None)
    if isinstance(histograms, dict):
        out["histograms"] = {
            name: {"levels": list(h.level_ids), "recent": list(h._recent)} for name, h in histograms.items()
        }
    active = getattr(policy, "active", None)
    if active is not None and hasattr(active, "name"):
        out["active"] = active.name
    scalars = {k: _num(getattr(policy, k)) for k in _SCALARS if hasattr(policy, k)}
    out["scalars"] = {k: v for k, v in scalars.items() if v is not None}
    for name in ("rate", "choice", "_tiers"):  # sommelier: per-worker rate EWMA and chosen level; argus+: tier mix
        value = getattr(policy, name, None)
        if isinstance(value, dict):
            out[name] = dict(value)
    return out


def import_state(policy: Any, data: dict[str, Any]) -> list[str]:
    """Load ``data`` (from :func:`export_state`) into ``policy``; returns the parts taken.

    A state exported by another policy kind is ignored as a whole (returns ``[]``)."""
    if not isinstance(data, dict) or data.get("policy") != policy.name or data.get("format") != STATE_FORMAT:
        return []
    taken: list[str] = []
    policy._version = max(int(policy._version), int(data.get("version", 0)))
    taken.append("version")
    demand = getattr(policy, "demand", None)
    has_demand = demand is not None and hasattr(demand, "state") and isinstance(data.get("demand"), dict)
    if has_demand and _import_demand(policy, data["demand"]):
        taken.append("demand")
    histograms = getattr(policy, "histograms", None)
    for name, h in (data.get("histograms") or {}).items():
        mine = histograms.get(name) if isinstance(histograms, dict) else None
        if mine is None or list(mine.level_ids) != list(h.get("levels", ())):
            continue  # the profile changed: that histogram starts afresh
        fresh = type(mine)(mine.level_ids, mine.window)
        fresh.extend(lv for lv in h.get("recent", ()) if lv in mine.level_ids)
        histograms[name] = fresh
        taken.append(f"histogram:{name}")
    active = data.get("active")
    if active is not None and hasattr(policy, "active"):
        for prof in (getattr(policy, "primary", None), getattr(policy, "fallback", None)):
            if prof is not None and prof.name == active:
                policy.active = prof
                taken.append("active")
                break
    for k, v in (data.get("scalars") or {}).items():
        if k in _SCALARS and hasattr(policy, k) and _num(v) is not None:
            setattr(policy, k, type(getattr(policy, k))(v))
            taken.append(k)
    for name in ("rate", "choice", "_tiers"):
        value = getattr(policy, name, None)
        if isinstance(value, dict) and isinstance(data.get(name), dict):
            value.clear()
            value.update(data[name])
            taken.append(name)
    return taken
