"""Routing/allocation policies: ARGUS, its baselines, DiffServe, and argus+.

Every policy implements :class:`~argusdiff.policies.base.Policy` and registers itself by name
when its module is imported (``class Argus(Policy, name="argus", family="ac")``); importing this
package imports every policy module (they are light: the solver and the cache are imported when a
plan is made). ``POLICIES`` is the registry (name -> class, read-only); :func:`make_policy` builds
one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Profile

# importing a policy module registers its policies (Policy.__init_subclass__); the order is the
# registry's, and with it the order of listings
from argusdiff.policies import argus, argus_plus, diffserve, nirvana, proteus, sommelier, static  # noqa: F401
from argusdiff.policies.base import (
    REGISTRY,
    CommonOptions,
    Policy,
    PolicyError,
    RouteView,
    select_worker,
)

__all__ = [
    "POLICIES",
    "CommonOptions",
    "Policy",
    "PolicyError",
    "RouteView",
    "make_policy",
    "policy_class",
    "select_worker",
]

#: every registered policy, name -> class
POLICIES: Mapping[str, type[Policy]] = REGISTRY


def policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def make_policy(
    name: str,
    profile: Profile,
    *,
    rng: np.random.Generator,
    classifier: Any = None,
    config: CommonOptions | Mapping[str, Any] | None = None,
) -> Policy:
    """A fresh policy instance (policies keep per-run state: predictors, switch state).

    ``config``: the policy's options (an instance of its ``options_type``), or a mapping of option
    names, which may also carry other policies' options (each policy takes its own)."""
    return policy_class(name)(profile, rng=rng, classifier=classifier, config=config)
