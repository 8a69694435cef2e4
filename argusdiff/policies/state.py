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
* Sommelier's per-worker rate EWMA and choice; argus+'s observed cache hit rate and SLO tier mix
  (unified plans).

Each policy exports and imports its own parts (``Policy.export_state`` / ``Policy.import_state``,
built from the helpers here); this module frames them (format, policy name, version). Data-path
caches (routing tables, solver memos) are not state: they are rebuilt from the plan.
Import skips what no longer fits (a histogram whose levels changed, an unknown active profile),
so a router with a changed configuration starts those parts afresh instead of failing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from argusdiff.errors import ConfigError
from argusdiff.predictors import AffinityHistogram, DemandPredictor

__all__ = [
    "STATE_FORMAT",
    "export_histograms",
    "export_scalars",
    "export_state",
    "import_demand",
    "import_histograms",
    "import_mapping",
    "import_scalars",
    "import_state",
]

STATE_FORMAT = 1


def _num(x: Any) -> float | int | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return x if math.isfinite(float(x)) else None


# ---- the parts a policy's own export_state / import_state are made of ----------------------------


def import_demand(current: DemandPredictor, data: Any) -> DemandPredictor | None:
    """The exported demand predictor when it reads demand as ``current`` does, else None (the
    configuration changed: the predictor starts afresh)."""
    if not isinstance(data, dict):
        return None
    try:
        taken = DemandPredictor.from_state(data)
    except ConfigError:
        return None
    return taken if taken.spec == current.spec else None


def export_histograms(histograms: Mapping[str, AffinityHistogram]) -> dict[str, Any]:
    return {name: {"levels": list(h.level_ids), "recent": list(h._recent)} for name, h in histograms.items()}


def import_histograms(histograms: dict[str, AffinityHistogram], data: Any) -> list[str]:
    """Replace each histogram of ``histograms`` whose levels are those exported; returns the parts taken."""
    taken: list[str] = []
    for name, h in (data or {}).items() if isinstance(data, dict) else ():
        mine = histograms.get(name)
        if mine is None or not isinstance(h, dict) or list(mine.level_ids) != list(h.get("levels", ())):
            continue  # the profile changed: that histogram starts afresh
        fresh = type(mine)(mine.level_ids, mine.window)
        fresh.extend(lv for lv in h.get("recent", ()) if lv in mine.level_ids)
        histograms[name] = fresh
        taken.append(f"histogram:{name}")
    return taken


def export_scalars(obj: Any, names: Iterable[str]) -> dict[str, float | int]:
    """The finite numeric attributes ``names`` of ``obj``."""
    values = {k: _num(getattr(obj, k)) for k in names}
    return {k: v for k, v in values.items() if v is not None}


def import_scalars(obj: Any, names: Iterable[str], data: Any) -> list[str]:
    """Set each attribute of ``names`` that ``data`` holds as a finite number (keeping its type)."""
    taken: list[str] = []
    if not isinstance(data, dict):
        return taken
    for k in names:
        v = data.get(k)
        if _num(v) is not None:
            setattr(obj, k, type(getattr(obj, k))(v))
            taken.append(k)
    return taken


def import_mapping(target: dict[str, Any], data: Any) -> bool:
    """Replace the contents of ``target`` with ``data`` when it is a mapping."""
    if not isinstance(data, dict):
        return False
    target.clear()
    target.update(data)
    return True


# ---- the whole state -------------------------------------------------------------------------


class Policy(Protocol):
    """What the framing reads of a policy (:class:`argusdiff.policies.base.Policy` has it; this
    module is imported by that one, so it names the shape, not the class)."""

    name: str
    _version: int

    def export_state(self) -> dict[str, Any]: ...

    def import_state(self, data: Mapping[str, Any]) -> list[str]: ...


def export_state(policy: Policy) -> dict[str, Any]:
    """The control-path state of ``policy`` as a JSON-able dict (its parts: ``Policy.export_state``)."""
    return {"format": STATE_FORMAT, "policy": policy.name, "version": int(policy._version), **policy.export_state()}


def import_state(policy: Policy, data: dict[str, Any]) -> list[str]:
    """Load ``data`` (from :func:`export_state`) into ``policy``; returns the parts taken.

    A state exported by another policy kind is ignored as a whole (returns ``[]``)."""
    if not isinstance(data, dict) or data.get("policy") != policy.name or data.get("format") != STATE_FORMAT:
        return []
    policy._version = max(int(policy._version), int(data.get("version", 0)))
    return ["version", *policy.import_state(data)]
