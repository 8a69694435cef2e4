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

__all__ = ["ExecutorFactory", "build_cache", "level_table", "replicated_index", "shared_cache_view"]

log = logging.getLogger("argusdiff.service")


def level_table(profile: Profile, fallback: Profile | None = None) -> dict[str, ApproxLevel]:
    levels = {lv.id: lv for lv in profile.levels}
    if fallback is not None:
        for lv in fallback.levels:
            levels.setdefault(lv.id, lv)
    return levels


def build_cache(settings: Any, profile: Profile) -> Any:
    """The latent cache of an approximate-caching deployment (None for other profiles or when
    ``[cache] enabled = false``); its index replicated through Redis where
    :func:`replicated_index` applies."""
    if Strategy.AC not in profile.strategies or not settings.cache.enabled:
        return None
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(settings.cache, index=replicated_index(settings))


def replicated_index(settings: Any) -> Any:
    """The process's replica of the shared cache index (:mod:`cache.replication`) when the
    deployment uses Redis, the embedded HNSW index and ``[cache] replication = "auto"``; else
    None (the configured index: per process, or the Qdrant server every process shares)."""
    c = settings.cache
    url = settings.service.redis_url
    if not (url and c.enabled and c.index == "hnsw" and c.replication == "auto"):
        return None
    from cache.index import HnswIndex
    from cache.replication import CacheLog, ReplicatedIndex

    local = HnswIndex(
        None, c.embedding_dim, m=c.hnsw_m, ef_construction=c.hnsw_ef_construction, ef_search=c.hnsw_ef_search
    )
    return ReplicatedIndex(
        local,
        CacheLog.from_url(url, settings.service.namespace, timeout_s=c.timeout_s or 5.0),
        snapshot_every=c.replication_snapshot_every,
    )


def shared_cache_view(settings: Any) -> Any:
    """A router's view of the cache every worker writes, for a router without local workers:
    the replicated index or the Qdrant server (``qdrant_url``); None when there is none."""
    c = settings.cache
    if not c.enabled:
        return None
    index = replicated_index(settings)
    if index is None and not (c.index == "qdrant" and c.qdrant_url):
        return None
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(c, index=index)


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
        # TEST MODE: a cascade light level's stand-in judge (``judge(item) -> confidence``), e.g. a
        # replay's per-prompt confidences; None: stand-ins never defer
        self.stand_in_judge: Callable[[Any], float] | None = None

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

            # the calling worker thread's loaded models (LRU, up to [workers] max_loaded_models, as
            # a real worker's registry): a model not among them costs its load time (the first is
            # loaded before the worker takes work)
            resident: list[str] = getattr(self._local, "resident", None) or []
            if level.model in resident:
                resident.remove(level.model)
                load_s = 0.0
            else:
                load_s = level.load_time_s * self.stand_in_scale if resident else 0.0
            resident.append(level.model)
            keep = max(1, int(getattr(self.settings.workers, "max_loaded_models", 1)))
            self._local.resident = resident[-keep:]
            full = getattr(self.settings.service, "stand_in_image", "tiny") == "full"
            cascade = self.profile.cascade
            if self.stand_in_judge is not None and cascade is not None and level.id == cascade.light:
                return StandInExecutor(
                    level,
                    self.stand_in_scale,
                    load_s=load_s,
                    full_size=full,
                    judge=self.stand_in_judge,
                    heavy=cascade.heavy,
                    judge_s=cascade.discriminator_latency_s,
                    # as a real cascade executor until a plan sets one: the middle of the grid
                    threshold=cascade.thresholds[len(cascade.thresholds) // 2],
                )
            return StandInExecutor(level, self.stand_in_scale, load_s=load_s, full_size=full)
        from workers.executor import build_executor

        cascade = self.profile.cascade_for(level.id)
        if level.strategy is Strategy.CASCADE and cascade is not None:
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
