"""The executor factory: the one place where a level of a deployment becomes a
:class:`~workers.messages.LevelExecutor`.

:class:`ExecutorFactory` is ``factory(level_id) -> LevelExecutor`` for a profile (and its fallback
profile), as :class:`workers.loop.Worker` and the service's workers need. It builds

* the real executors (:func:`build_executor`): an ``ac`` level becomes a
  :class:`workers.ac.ApproxCacheExecutor` that stores the latents of the K levels
  :func:`workers.ac.ac_capture_ks` names; an ``sm`` level a :class:`workers.sm.ModelExecutor`; the
  light level of a cascade pair with a judge a :class:`workers.cascade.CascadeExecutor` (without
  a judge, a plain model executor that never defers);
* or, in TEST MODE (``stand_in_scale``), :class:`workers.standin.StandInExecutor` stand-ins that
  sleep the level's profiled latency scaled.

:meth:`ExecutorFactory.from_settings` reads the service's settings (``[workers]``, ``[cache]
encoder``, ``[classifier] discriminator``, ``[service] stand_in_image``). This module imports no
torch: the executors, the model registry and the discriminator are imported when first built.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from argusdiff.domain import ApproxLevel, CascadeSpec, Profile, Strategy, level_catalogue
from argusdiff.errors import ConfigError
from workers.messages import LevelExecutor, WorkItem

if TYPE_CHECKING:  # pragma: no cover
    from cache.api import LatentCacheProtocol
    from workers.registry import ModelRegistry

__all__ = ["ExecutorFactory", "build_executor"]

log = logging.getLogger("argusdiff.workers")


def build_executor(
    level: ApproxLevel,
    registry: ModelRegistry,
    cache: LatentCacheProtocol | None = None,
    *,
    judge: Any = None,
    heavy: ApproxLevel | None = None,
    cascade: CascadeSpec | None = None,
    threshold: float | None = None,
    embed: Callable[[Sequence[str]], Any] | None = None,
    capture_ks: Sequence[int] | None = None,
    inline_heavy: bool = False,
    refine_strength: float | None = None,
    encoder: str = "minilm",
    safety: Any = None,
    adapters: Sequence[Any] = (),
    max_adapters: int = 4,
) -> LevelExecutor:
    """The real executor for ``level`` (torch and diffusers are imported here, not at module import).

    * ``ac`` levels: :class:`workers.ac.ApproxCacheExecutor` (without a cache every request runs
      all N steps and nothing is stored; ``capture_ks`` are the K latents stored per miss);
    * ``sm`` levels: :class:`workers.sm.ModelExecutor`;
    * ``cascade`` levels: the light level of ``cascade`` with a ``judge`` (a discriminator or a
      ``judge(image) -> confidence`` callable) becomes a :class:`workers.cascade.CascadeExecutor`
      deferring to ``heavy`` below ``threshold`` (default: the middle of the profiled grid); any
      other cascade level is a plain model executor.

    ``safety`` (a :class:`workers.safety.SafetyChecker`) checks every image the executor returns;
    ``adapters`` are the LoRA adapters of the level's model (:mod:`workers.adapters`; at most
    ``max_adapters`` loaded at once).
    """
    executor: Any = _build(level, registry, cache, judge, heavy, cascade, threshold, embed, capture_ks,
                           inline_heavy, refine_strength, encoder)  # fmt: skip
    executor.safety = safety
    executor.adapters = {a.name: a for a in adapters if a.model == level.model}
    executor.max_adapters = max_adapters
    executor.active_adapter = None
    return executor


def _build(level, registry, cache, judge, heavy, cascade, threshold, embed, capture_ks, inline_heavy,
           refine_strength, encoder) -> LevelExecutor:  # fmt: skip
    if level.strategy is Strategy.AC:
        from workers.ac import ApproxCacheExecutor

        return ApproxCacheExecutor(level, registry, cache=cache, embed=embed, capture_ks=capture_ks, encoder=encoder)
    if level.strategy is Strategy.CASCADE and cascade is not None and level.id == cascade.light and judge is not None:
        from workers.cascade import CascadeExecutor

        if heavy is None:
            raise ValueError(f"cascade light level {level.id!r} needs the heavy level {cascade.heavy!r}")
        return CascadeExecutor(
            level,
            heavy,
            registry,
            judge=judge,
            threshold=middle_threshold(cascade) if threshold is None else threshold,
            inline_heavy=inline_heavy,
            refine_strength=refine_strength,
        )
    from workers.sm import ModelExecutor

    return ModelExecutor(level, registry)


def middle_threshold(cascade: CascadeSpec) -> float:
    """A cascade executor's threshold until a plan sets one: the middle of the profiled grid."""
    return cascade.thresholds[len(cascade.thresholds) // 2]


class ExecutorFactory:
    """``factory(level_id) -> LevelExecutor`` for the levels of ``profile`` and ``fallback``.

    ``registry`` is the model registry (or ``load_registry()`` builds it on first use); ``judge``
    judges cascade light images (or ``load_judge()`` loads it on first use; None: cascades never
    defer). ``cache``, ``embed`` and ``encoder`` go to AC executors; ``threshold``,
    ``inline_heavy`` and ``refine_strength`` to cascade executors.

    TEST MODE: with ``stand_in_scale`` every level is a stand-in. Each worker thread keeps the
    models it loaded (LRU, up to ``max_loaded_models``, as a real worker's registry does): a model
    not among them costs its scaled load time (the first is loaded before the worker takes work).
    ``stand_in_judge`` (``judge(item) -> confidence``, e.g. a replay's per-prompt confidences)
    makes a cascade light level's stand-in hand low-confidence requests to the heavy level.
    """

    def __init__(
        self,
        profile: Profile,
        registry: ModelRegistry | None = None,
        cache: LatentCacheProtocol | None = None,
        *,
        fallback: Profile | None = None,
        load_registry: Callable[[], ModelRegistry] | None = None,
        judge: Any = None,
        load_judge: Callable[[], Any] | None = None,
        threshold: float | None = None,
        embed: Callable[[Sequence[str]], Any] | None = None,
        inline_heavy: bool = False,
        refine_strength: float | None = None,
        encoder: str = "minilm",
        stand_in_scale: float | None = None,
        stand_in_full_size: bool = False,
        max_loaded_models: int = 1,
        load_safety: Callable[[], Any] | None = None,
        max_loaded_adapters: int = 4,
    ) -> None:
        self.profile = profile
        self.levels = level_catalogue(profile, fallback)
        # LoRA adapters of the deployment's models ([[adapters]] of the profile and its fallback)
        self.adapters = (*profile.adapters, *(fallback.adapters if fallback is not None else ()))
        self.max_loaded_adapters = max_loaded_adapters
        self.cache = cache
        self._registry = registry
        self._load_registry = load_registry
        self._judge = judge
        self._load_judge = load_judge
        self.threshold = threshold
        self.embed = embed
        self.inline_heavy = inline_heavy
        self.refine_strength = refine_strength
        self.encoder = encoder
        self.stand_in_scale = stand_in_scale
        self.stand_in_full_size = stand_in_full_size
        self.max_loaded_models = max(1, int(max_loaded_models))
        # TEST MODE: a cascade light level's stand-in judge (``judge(item) -> confidence``), e.g. a
        # replay's per-prompt confidences; None: stand-ins never defer
        self.stand_in_judge: Callable[[WorkItem], float] | None = None
        self._local = threading.local()
        self._load_safety = load_safety
        self._safety: Any = None
        self._safety_lock = threading.Lock()

    @classmethod
    def from_settings(
        cls,
        profile: Profile,
        settings: Any,
        *,
        fallback: Profile | None = None,
        cache: LatentCacheProtocol | None = None,
        stand_in_scale: float | None = None,
        registry: ModelRegistry | None = None,
    ) -> ExecutorFactory:
        """The service's factory (a :class:`argusdiff.config.Settings`): the registry of
        ``[workers]``, the judge of ``[classifier] discriminator``, the prompt encoder of ``[cache]``,
        and stand-ins of ``[service] stand_in_image`` size."""

        def load_registry() -> ModelRegistry:
            from workers.registry import ModelRegistry

            return ModelRegistry.from_config(settings.workers)

        def load_judge() -> Callable[[Any], float] | None:
            path = settings.classifier.discriminator
            if path is None:
                return None
            from classifiers.discriminator import Discriminator

            disc = Discriminator.load(path)
            return lambda image: float(disc.confidence([image])[0])

        def load_safety() -> Any:
            cfg = settings.safety
            if cfg.checker == "off":
                return None
            from workers.safety import SafetyChecker

            reg = factory.registry
            dtype = reg.torch_dtype_name() if cfg.dtype == "auto" else cfg.dtype
            return SafetyChecker(cfg.model, device=reg.device, dtype=dtype, low_margin=cfg.low_margin)

        factory = cls(
            profile,
            registry,
            cache,
            fallback=fallback,
            load_registry=load_registry,
            load_judge=load_judge,
            load_safety=load_safety,
            encoder=settings.cache.encoder,
            stand_in_scale=stand_in_scale,
            stand_in_full_size=getattr(settings.service, "stand_in_image", "tiny") == "full",
            max_loaded_models=getattr(settings.workers, "max_loaded_models", 1),
            max_loaded_adapters=getattr(settings.workers, "max_loaded_adapters", 4),
        )
        return factory

    @property
    def registry(self) -> ModelRegistry:
        if self._registry is None:
            if self._load_registry is None:
                raise ConfigError("the executor factory has no model registry")
            self._registry = self._load_registry()
        return self._registry

    @property
    def judge(self) -> Any:
        """The cascade judge (loaded on first use), or None."""
        if self._judge is None and self._load_judge is not None:
            self._judge = self._load_judge()
            self._load_judge = None
        return self._judge

    @property
    def safety(self) -> Any:
        """The deployment's safety checker (loaded once, on first use, shared by every executor),
        or None."""
        with self._safety_lock:
            if self._load_safety is not None:
                self._safety = self._load_safety()
                self._load_safety = None
            return self._safety

    def level(self, level_id: str) -> ApproxLevel:
        try:
            return self.levels[level_id]
        except KeyError:
            raise ConfigError(f"level {level_id!r} is not in profile {self.profile.name!r}") from None

    def __call__(self, level_id: str) -> LevelExecutor:
        level = self.level(level_id)
        if self.stand_in_scale is not None:
            return self._stand_in(level, self.stand_in_scale)
        cascade = self.profile.cascade_for(level.id)
        heavy = None
        judge = None
        if level.strategy is Strategy.CASCADE and cascade is not None:
            judge = self.judge
            if judge is None:
                log.warning("no discriminator configured: cascade level %s runs without deferral", level.id)
            heavy = self.levels[cascade.heavy]
        capture = None
        if level.strategy is Strategy.AC:
            from workers.ac import ac_capture_ks

            capture = ac_capture_ks(self.levels.values(), level)
        return build_executor(
            level,
            self.registry,
            self.cache,
            judge=judge,
            heavy=heavy,
            cascade=cascade,
            threshold=self.threshold,
            embed=self.embed,
            capture_ks=capture,
            inline_heavy=self.inline_heavy,
            refine_strength=self.refine_strength,
            encoder=self.encoder,
            safety=self.safety,
            adapters=[a for a in self.adapters if a.model == level.model],
            max_adapters=self.max_loaded_adapters,
        )

    def _stand_in(self, level: ApproxLevel, scale: float) -> LevelExecutor:
        from workers.standin import StandInExecutor

        resident: list[str] = getattr(self._local, "resident", None) or []
        if level.model in resident:
            resident.remove(level.model)
            load_s = 0.0
        else:
            load_s = level.load_time_s * scale if resident else 0.0
        resident.append(level.model)
        self._local.resident = resident[-self.max_loaded_models :]
        cascade = self.profile.cascade
        if self.stand_in_judge is not None and cascade is not None and level.id == cascade.light:
            return StandInExecutor(
                level,
                scale,
                load_s=load_s,
                full_size=self.stand_in_full_size,
                judge=self.stand_in_judge,
                heavy=cascade.heavy,
                judge_s=cascade.discriminator_latency_s,
                threshold=middle_threshold(cascade),  # as a real cascade executor until a plan sets one
            )
        return StandInExecutor(level, scale, load_s=load_s, full_size=self.stand_in_full_size)
