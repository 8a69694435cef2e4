"""Routing/allocation policies: ARGUS, its baselines, DiffServe, and argus+.

``POLICIES`` maps a policy name to ``(module:Class, one-line description)``; :func:`make_policy`
builds one. Every policy implements :class:`~argusdiff.policies.base.Policy`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Profile
from argusdiff.policies.base import Policy, PolicyError, PolicyOptions, RouteView, select_worker

__all__ = [
    "POLICIES",
    "Policy",
    "PolicyError",
    "PolicyOptions",
    "RouteView",
    "make_policy",
    "policy_class",
    "select_worker",
]

POLICIES: dict[str, tuple[str, str]] = {
    "argus": ("argus:Argus", "classifier -> PASM (ODA) -> worker selector; AC, to SM when the cache degrades"),
    "argus+": ("argus_plus:ArgusPlus", "ARGUS + deadline-aware admission, switch-cost- and backlog-aware planning"),
    "pac": ("argus:Pac", "ARGUS without classifier and ODA: prompt-agnostic routing to the allocated levels"),
    "proteus": ("proteus:Proteus", "prompt-agnostic accuracy scaling over smaller models (ILP), random routing"),
    "clipper-ha": ("static:ClipperHA", "static: every worker at the best level"),
    "clipper-ht": ("static:ClipperHT", "static: every worker at the fastest level"),
    "sommelier": ("sommelier:Sommelier", "per-GPU level choice from that GPU's own load, no cluster view"),
    "nirvana": ("nirvana:Nirvana", "approximate caching on every worker, K from cache similarity, uniform load"),
    "diffserve": ("diffserve:DiffServe", "light->heavy cascade, discriminator threshold from the MILP each period"),
    "diffserve-static": ("diffserve:DiffServeStatic", "light->heavy cascade provisioned once for the peak"),
}


def policy_class(name: str) -> type[Policy]:
    try:
        target, _ = POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(f"argusdiff.policies.{module}"), cls)


def make_policy(
    name: str,
    profile: Profile,
    *,
    rng: np.random.Generator,
    classifier: Any = None,
    config: PolicyOptions | Mapping[str, Any] | None = None,
) -> Policy:
    """A fresh policy instance (policies keep per-run state: predictors, switch state)."""
    return policy_class(name)(profile, rng=rng, classifier=classifier, config=config)
