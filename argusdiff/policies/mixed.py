"""Mixed ladders: approximate-caching levels and smaller models in one plan.

ARGUS runs either its AC ladder (SD-XL resuming from cached latents, K of N steps skipped) or, when
the cache degrades, a ladder of smaller models. :func:`merged_ladder` builds one profile from both:
every level ordered by profiled quality (best first), the SM level that duplicates the AC model at
full quality left out (the AC ladder's K = 0 level is the same SD-XL model), and, by default, levels
*dominated* by another level (no better quality and no faster) pruned — with ``sm-a100`` (ARGUS
Table 2 latencies) every small model but Tiny-SD is dominated by an AC level; with
``sm-a100-gputable`` the high-K AC levels (K ≥ 15) are dominated by SD-2.0 / SD-1.5 instead. The
allocation ILP and ODA then work on the merged ladder unchanged.

An AC level with K > 0 only runs at its profiled speed on a cache hit; on a miss it would run at
K = 0 (4.2 s on SD-XL). :func:`miss_fallback` names the level a miss goes to instead: the best level
that needs no cache and is no slower than the AC level at a hit, among the levels that have workers
(``argus+`` applies it on the data path).
"""

from __future__ import annotations

from collections.abc import Sequence

from argusdiff.domain import ApproxLevel, Profile, Strategy
from argusdiff.errors import ConfigError

__all__ = ["is_mixed", "merged_ladder", "miss_fallback", "needs_cache"]


def needs_cache(level: ApproxLevel) -> bool:
    """Whether ``level`` only runs at its profiled speed on a cache hit."""
    return level.strategy is Strategy.AC and level.skip > 0


def is_mixed(profile: Profile) -> bool:
    return Strategy.AC in profile.strategies and Strategy.SM in profile.strategies


def merged_ladder(ac: Profile, sm: Profile, *, prune_dominated: bool = True, name: str | None = None) -> Profile:
    """One profile with ``ac``'s AC levels and ``sm``'s smaller models, best quality first."""
    if ac.strategies != {Strategy.AC}:
        raise ConfigError(f"merged ladder: {ac.name!r} is not an approximate-caching profile")
    if sm.strategies != {Strategy.SM}:
        raise ConfigError(f"merged ladder: {sm.name!r} is not a smaller-model profile")
    ac_models = {lv.model for lv in ac.levels}
    levels: list[ApproxLevel] = list(ac.levels)
    seen = {lv.id for lv in levels}
    for lv in sm.levels:
        if lv.model in ac_models:
            continue  # the same model at full quality is the AC ladder's K = 0 level
        if lv.id in seen:
            raise ConfigError(f"merged ladder: level id {lv.id!r} is in both {ac.name!r} and {sm.name!r}")
        levels.append(lv)
    # best first; equal quality: slower first (the ladder's convention), stable otherwise
    levels.sort(key=lambda lv: (-lv.quality, -lv.latency(1)))
    if prune_dominated:
        kept: list[ApproxLevel] = []
        for lv in levels:
            dominated = any(
                o is not lv
                and o.quality >= lv.quality
                and o.latency(1) <= lv.latency(1)
                and (o.quality > lv.quality or o.latency(1) < lv.latency(1))
                for o in levels
            )
            if not dominated or lv is levels[0]:
                kept.append(lv)
        levels = kept
    return Profile(
        name=name or f"{ac.name}+{sm.name}",
        gpu=ac.gpu,
        levels=tuple(levels),
        description=f"merged ladder of {ac.name} (AC) and {sm.name} (SM), best quality first",
        slo_s=ac.slo_s,
    )


def miss_fallback(profile: Profile, level_id: str, with_workers: Sequence[bool]) -> int | None:
    """Index of the level a cache miss at ``level_id`` goes to, or None (run at K = 0).

    The best level that needs no cache, is no slower than ``level_id`` at a hit and has workers;
    else the fastest such level with workers that is faster than the K = 0 level.
    """
    j = profile.index(level_id)
    lv = profile.levels[j]
    if not needs_cache(lv):
        return None
    k0 = next((x for x in profile.levels if x.model == lv.model and x.skip == 0), None)
    k0_lat = k0.latency(1) if k0 is not None else float("inf")
    candidates = [
        i for i, x in enumerate(profile.levels) if with_workers[i] and not needs_cache(x) and x.latency(1) < k0_lat
    ]
    if not candidates:
        return None
    in_time = [i for i in candidates if profile.levels[i].latency(1) <= lv.latency(1)]
    if in_time:
        return min(in_time)  # best quality first
    return min(candidates, key=lambda i: profile.levels[i].latency(1))
