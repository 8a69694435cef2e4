"""Executor factories for the service's workers: real diffusers executors, or the TEST MODE
stand-ins that sleep a scaled profiled latency.

A factory maps a level id (of the deployment profile or of its SM fallback) to a
:class:`workers.executor.LevelExecutor`. The real factory shares one model registry and one
latent cache per process; cascade light levels get the discriminator as their judge when one is
configured (``[classifier] discriminator``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from argusdiff.domain import ApproxLevel, Profile, Strategy
from argusdiff.errors import ConfigError

__all__ = ["ExecutorFactory", "build_cache", "level_table"]

log = logging.getLogger("argusdiff.service")


def level_table(profile: Profile, fallback: Profile | None = None) -> dict[str, ApproxLevel]:
    levels = {lv.id: lv for lv in profile.levels}
    if fallback is not None:
        for lv in fallback.levels:
            levels.setdefault(lv.id, lv)
    return levels


def build_cache(settings: Any, profile: Profile) -> Any:
    """The latent cache of an approximate-caching deployment (None for other profiles or when
    ``[cache] enabled = false``)."""
    if Strategy.AC not in profile.strategies or not settings.cache.enabled:
        return None
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(settings.cache)


class ExecutorFactory:
    """``factory(level_id) -> LevelExecutor``."""

    def __init__(
        self,
        profile: Profile,
        settings: Any,
        *,
        fallback: Profile | None = None,
        cache: Any = None,
        stand_in_scale: float | None = None,
        registry: Any = None,
    ) -> None:
        self.profile = profile
        self.settings = settings
        self.levels = level_table(profile, fallback)
        self.cache = cache
        self.stand_in_scale = stand_in_scale
        self._registry = registry
        self._judge: Callable[[Any], float] | None = None
        self._local = threading.local()

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from workers.registry import ModelRegistry

            self._registry = ModelRegistry.from_config(self.settings.workers)
        return self._registry

    def _cascade_judge(self) -> Callable[[Any], float] | None:
        path = self.settings.classifier.discriminator
        if path is None:
            return None
        if self._judge is None:
            from classifiers.discriminator import Discriminator

            disc = Discriminator.load(path)
            self._judge = lambda image: float(disc.confidence([image])[0])
        return self._judge

    def __call__(self, level_id: str) -> Any:
        try:
            level = self.levels[level_id]
        except KeyError:
            raise ConfigError(f"level {level_id!r} is not in profile {self.profile.name!r}") from None
        if self.stand_in_scale is not None:
            from argusdiff.service.standin import StandInExecutor

            # the calling worker thread's previous model: switching models costs its load time
            prev = getattr(self._local, "model", None)
            self._local.model = level.model
            load_s = level.load_time_s * self.stand_in_scale if prev is not None and prev != level.model else 0.0
            return StandInExecutor(level, self.stand_in_scale, load_s=load_s)
        from workers.executor import build_executor

        cascade = self.profile.cascade
        if level.strategy is Strategy.CASCADE and cascade is not None and level.id == cascade.light:
            judge = self._cascade_judge()
            if judge is not None:
                return build_executor(
                    level, self.registry, judge=judge, heavy=self.levels[cascade.heavy], cascade=cascade
                )
            log.warning("no [classifier] discriminator configured: cascade level %s runs without deferral", level.id)
        if level.strategy is Strategy.AC and self.cache is not None:
            from workers.ac import ApproxCacheExecutor

            # every AC level (K = 0 included) stores the latents of each K the profile's levels skip,
            # so full runs fill the cache the faster levels resume from (NIRVANA)
            skips = sorted({lv.skip for lv in self.levels.values() if lv.strategy is Strategy.AC and lv.skip > 0})
            return ApproxCacheExecutor(
                level, self.registry, cache=self.cache, capture_ks=skips, encoder=self.settings.cache.encoder
            )
        return build_executor(level, self.registry)
