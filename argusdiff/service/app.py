"""Assembly of one service instance: profile, policy, router, control loop, queues, workers.

``Service(settings)`` builds everything from a :class:`~argusdiff.config.Settings`; ``await
service.start()`` starts the dispatch, the control loop and any embedded workers;
``await service.stop()`` stops them (embedded workers finish the batch in hand).

* Embedded (``[service] redis_url`` unset): in-process queues, ``[service] workers`` worker
  threads in this process.
* Distributed (``redis_url`` set): Redis Streams; workers are separate ``argusdiff worker``
  processes (``workers`` embedded ones may still be started, e.g. for a single-box deployment).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.config import Settings
from argusdiff.domain import Profile, Strategy, Tier, level_catalogue
from argusdiff.policies import make_policy
from argusdiff.profile import PROFILE_DIR, load_profile
from argusdiff.service.caches import build_cache
from argusdiff.service.dispatch import LocalDispatch, RedisDispatch
from argusdiff.service.errors import ShuttingDown
from argusdiff.service.health import CacheHealth
from argusdiff.service.images import build_image_store, store_spec
from argusdiff.service.leader import ClusterControlLoop
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.quotas import MemoryQuotaStore, Quotas, RedisQuotaStore
from argusdiff.service.router import Router
from argusdiff.service.transport.memory import LocalControlStore
from argusdiff.service.worker import ServiceWorker
from workers.executor import ExecutorFactory

__all__ = ["Service", "load_classifier", "policy_options"]

log = logging.getLogger("argusdiff.service")


def profile_ref(profile: Profile) -> str:
    """A shipped profile's name, else the path it was loaded from (what a worker passes to load_profile)."""
    if profile.source and Path(profile.source).resolve().parent == PROFILE_DIR.resolve():
        return profile.name
    return profile.source or profile.name


def served_sizes(settings: Settings, profile: Profile) -> tuple[str, ...]:
    """``[service] sizes``, else the native WxH of the profile's models in the model registry."""
    if settings.service.sizes:
        return tuple(settings.service.sizes)
    from workers.registry import ModelRegistry

    registry = ModelRegistry.from_config(settings.workers)
    sizes = []
    for lv in profile.levels:
        if lv.model in registry:
            spec = registry.spec(lv.model)
            sizes.append(f"{spec.width}x{spec.height}")
    return tuple(dict.fromkeys(sizes)) or ("512x512",)


def policy_options(settings: Settings, profile: Profile, fallback: Profile | None) -> dict[str, Any]:
    """The policy options the settings give, as one mapping: whichever policy ``[service] policy``
    names takes its own (:func:`argusdiff.policies.make_policy`)."""
    s = settings.service
    return {
        "slo_s": profile.default_slo_s(),
        "period_s": s.control_period_s,
        "predictor": settings.predictor.demand,
        "affinity_window": settings.predictor.affinity_window,
        "formulation": settings.solver.formulation,
        "backend": settings.solver.backend,
        "switch_tolerance": settings.solver.switch_tolerance,
        "time_limit_s": settings.solver.time_limit_s,
        "fallback": fallback,
        "cache_latency_limit_s": s.cache_latency_threshold_s,
        "cache_error_limit": s.cache_error_threshold,
        "switch_margin": s.switch_margin,
    }


def load_classifier(settings: Settings, profile: Profile) -> Any:
    """The batched level classifier for the profile's strategy (``[classifier] models``); else,
    with ``[classifier] fit_at_start``, one fitted now on the packaged prompt embeddings
    (:mod:`classifiers.first_start`); else None."""
    cfg = settings.classifier
    strategy = next(iter(sorted(profile.strategies)), Strategy.AC)
    path = cfg.models.get(strategy.value)
    if path is None and not cfg.fit_at_start:
        return None
    from classifiers.level import BatchedClassifier, LevelClassifier
    from workers.registry import resolve_device

    if path is None:
        from classifiers.first_start import fit_at_start

        clf = fit_at_start(
            profile,
            strategy=strategy.value,
            ratio=cfg.ratio,
            max_length=cfg.max_length,
            seed=settings.traces.quality_seed,
            precision=cfg.precision,
            threads=cfg.threads,
        )
        report = clf.meta.report
        log.info(
            "level classifier: %s (hold-out accuracy %.2f; labels and fit %.2f s)",
            clf.description, report["holdout_accuracy"], report["fit_s"],
        )  # fmt: skip
    else:
        clf = LevelClassifier.load(
            path,
            level_ids=profile.ids,
            device=resolve_device(cfg.device),
            precision=cfg.precision,
            threads=cfg.threads,
        )
    return BatchedClassifier(clf, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_s, repeat_cache=cfg.repeat_cache)


class Service:
    def _quotas(self) -> Quotas:
        """``[quotas]`` over process memory (embedded) or the deployment's Redis (distributed)."""
        cfg = self.config
        if self.dispatch.mode == "redis":
            store: Any = RedisQuotaStore(self.dispatch.aio.r, self.dispatch.aio.keys)
        else:
            store = MemoryQuotaStore()
        # a slot's backstop expiry (a router that died holding it): as long as a request record lives
        lease_s = cfg.request_timeout_s + cfg.drain_timeout_s + 60
        return Quotas(self.settings.quotas, store, retry_after_s=cfg.retry_after_s, lease_s=lease_s)

    def __init__(
        self,
        settings: Settings,
        *,
        profile: Profile | None = None,
        classifier: Any = None,
        executor_factory: Any = None,
        cache: Any = None,
        cache_probe: Any = None,
        cache_similarity: Any = None,
        image_store: Any = None,
    ) -> None:
        self.settings = settings
        cfg = self.config = settings.service
        self.profile = profile or load_profile(settings.profile)
        self.fallback = load_profile(cfg.fallback_profile) if cfg.fallback_profile else None
        self.levels = level_catalogue(self.profile, self.fallback)
        self.metrics = ServiceMetrics()
        if classifier is None:
            classifier = load_classifier(settings, self.profile)
        self.classifier = classifier
        self.policy = make_policy(
            cfg.policy,
            self.profile,
            rng=np.random.default_rng(cfg.seed),
            classifier=classifier,
            config=policy_options(settings, self.profile, self.fallback),
        )
        images = image_store if image_store is not None else build_image_store(settings)
        memory = int(cfg.result_memory_mb * (1 << 20))
        if cfg.redis_url:
            self.dispatch: Any = RedisDispatch(
                cfg.redis_url,
                namespace=cfg.namespace,
                result_ttl_s=cfg.result_ttl_s,
                memory_bytes=memory,
                images=images,
                min_record_ttl_s=cfg.request_timeout_s + cfg.drain_timeout_s + 60,
            )
            from argusdiff.service.transport.redis_control import RedisControlStore

            self.store: Any = RedisControlStore.sharing(self.dispatch.queue)
        else:
            self.dispatch = LocalDispatch(cfg.result_ttl_s, memory_bytes=memory, images=images)
            self.store = LocalControlStore()
        self.cache_health = CacheHealth(
            cfg.cache_window, latency_limit_s=cfg.cache_latency_threshold_s, error_limit=cfg.cache_error_threshold
        )
        real_workers = cfg.workers > 0 and cfg.stand_in_scale is None and executor_factory is None
        if cache is None and real_workers:
            cache = build_cache(settings, self.profile)
        self.cache = cache
        if cache_similarity is None and self.policy.uses_cache_similarity:
            cache_similarity = self._cache_view(cache)
        self.cache_similarity = cache_similarity
        self.prompt_pass = None
        both = self.policy.uses_classifier and self.policy.uses_cache_similarity
        if both and cache_similarity is not None:
            from argusdiff.service.prompt_pass import PromptPass

            self.prompt_pass = PromptPass.of(
                classifier,
                cache_similarity,
                max_batch=settings.classifier.max_batch,
                max_wait_s=settings.classifier.max_wait_s,
                repeat_cache=settings.classifier.repeat_cache,
            )
        self.router = Router(
            profile=self.profile,
            policy=self.policy,
            dispatch=self.dispatch,
            metrics=self.metrics,
            config=cfg,
            classifier=classifier,
            fallback=self.fallback,
            cache_health=self.cache_health,
            sizes=served_sizes(settings, self.profile),
            similarity=cache_similarity,
            admission=settings.admission.mechanism(time_scale=cfg.stand_in_scale or 1.0),
            prompt_pass=self.prompt_pass,
            moderation=settings.safety.checker != "off",
        )
        self.dispatch.on_forget = self.router.forget_items
        for tier in Tier:  # the deadline a request of the tier gets without its own slo_s (Router.slo_for)
            factor = float(cfg.tier_slo_factors.get(tier.value, 1.0))
            self.metrics.slo.labels(tier.value).set(self.policy.slo_s * factor)
        self.dispatch.on_error = self.router.metrics.queue_errors.inc
        self.quotas = self._quotas()
        if cache_probe is None and cache is not None:
            cache_probe = self._probe_latent_cache
        self.factory = executor_factory or ExecutorFactory.from_settings(
            self.profile, settings, fallback=self.fallback, cache=cache, stand_in_scale=cfg.stand_in_scale
        )
        self.drift = self._drift_loop(classifier)
        self.control = ClusterControlLoop(
            router_id=cfg.router_id,
            lease_s=cfg.leader_lease_s,
            router=self.router,
            store=self.store,
            queue=self.dispatch.queue,
            metrics=self.metrics,
            period_s=cfg.control_period_s,
            heartbeat_s=cfg.heartbeat_s,
            level_ids=tuple(self.levels),
            levels=self.levels,
            cache_probe=cache_probe,
            probe_period_s=cfg.cache_probe_period_s,
        )
        self.workers = [
            ServiceWorker(
                self._worker_id(i),
                self._worker_queue(i),
                self.store,
                self.factory,
                heartbeat_s=cfg.heartbeat_s,
                ttl_s=cfg.worker_timeout_s,
                poll_s=settings.workers.poll_s,
                level_ids=tuple(self.levels),
            )
            for i in range(cfg.workers)
        ]
        self.started = False
        self.serving: dict[str, str] = {}  # worker -> the level it serves (heartbeats, refreshed)
        self.waiting_workers: dict[str, dict[str, Any]] = {}  # alive workers serving no level yet
        self._watcher: asyncio.Task | None = None
        self._drain: asyncio.Task | None = None
        self._drain_deadline: float | None = None

    def _worker_id(self, i: int) -> str:
        if self.config.redis_url:
            import socket

            return f"{socket.gethostname()}-local-{i}"
        return f"local-{i}"

    def _worker_queue(self, i: int) -> Any:
        """Embedded: the shared in-process queue; Redis: one connection (consumer) per worker."""
        if not self.config.redis_url:
            return self.dispatch.queue
        from argusdiff.service.transport.redis_streams import RedisWorkQueue

        cfg = self.config
        return RedisWorkQueue(
            cfg.redis_url,
            namespace=cfg.namespace,
            consumer=self._worker_id(i),
            result_ttl_s=cfg.result_ttl_s,
            claim_idle_s=max(60.0, 10 * cfg.worker_timeout_s),
            images=self.dispatch.images,
        )

    def _drift_loop(self, classifier: Any) -> Any:
        """The live drift-retraining loop (:mod:`argusdiff.service.drift`) when ``[classifier]
        drift_sample`` > 0, the policy routes by the classifier and a trained one is loaded."""
        c = self.settings.classifier
        uses = self.policy.uses_classifier
        if uses and hasattr(classifier, "version"):
            self.metrics.classifier_version.set(classifier.version)
        if not c.drift_sample > 0:
            return None
        if not uses or not hasattr(classifier, "swap") or not hasattr(classifier, "level_ids"):
            log.warning(
                "[classifier] drift_sample is set, but the drift loop needs a policy that routes by the level "
                "classifier and a trained one ([classifier] models); it is off"
            )
            return None
        from argusdiff.service.drift import build_drift_loop

        loop = build_drift_loop(self.settings, self.profile, classifier, self.factory, self.metrics)
        self.dispatch.on_served = loop.observe
        loop.images = self.dispatch.images  # a served image in the image store (Redis mode) is read there
        return loop

    def classifier_status(self) -> dict[str, Any] | None:
        """The level classifier's version, retrains and drift-loop state (``/v1/plan``); None when
        the policy routes without a classifier."""
        if self.drift is not None:
            return self.drift.status()
        if not self.policy.uses_classifier:
            return None
        meta = getattr(getattr(self.classifier, "classifier", None), "meta", None)
        report = getattr(meta, "report", None) or {}
        status = {
            "version": int(getattr(self.classifier, "version", 1)),
            "retrains": 0,
            "kind": getattr(self.classifier, "description", None) or ("trained" if self.classifier else "none"),
            "drift": None,
        }
        if "holdout_accuracy" in report:  # fitted at start: what it learned from
            status.update({k: report[k] for k in ("holdout_accuracy", "label_counts", "labels") if k in report})
        return status

    def _cache_view(self, cache: Any) -> Any:
        """The router's cache-similarity view (:mod:`argusdiff.service.similarity`) for a policy
        that routes by it: over this process's cache, or, for a router without local workers,
        over a shared index (``[cache] index = "qdrant"`` with ``qdrant_url``). None otherwise: the
        policy then routes every prompt as a cache miss."""
        from argusdiff.service.similarity import CacheSimilarity, ac_model

        model = ac_model(self.profile)
        if model is None:
            return None
        c = self.settings.cache
        if cache is None:  # the shared index: replicated through Redis, or the Qdrant server
            from argusdiff.service.caches import shared_cache_view
            from cache.api import CacheUnavailable

            try:
                cache = shared_cache_view(self.settings)
            except CacheUnavailable as exc:
                log.warning("no cache-similarity view: %s", exc)
                return None
        if cache is None:
            log.warning(
                "policy %s routes by cache similarity, but this router has no view of the latent cache "
                "(no local AC workers, no Redis-replicated index, no shared qdrant_url): every prompt routes "
                "as a cache miss",
                self.policy.name,
            )
            return None
        embed = None
        if c.encoder == "clip":  # the serving model's text encoder, as the AC workers embed
            from workers.prompt_encoder import ClipPromptEncoder, check_dim
            from workers.registry import ModelRegistry

            registry = ModelRegistry.from_config(self.settings.workers)
            spec = registry.spec(model)
            embed = ClipPromptEncoder.from_pretrained(registry.local_path(spec), family=spec.family)
            check_dim(embed.dim, c.embedding_dim, f"the CLIP text encoder of {model!r}")
        return CacheSimilarity(cache, model=model, embed=embed, max_batch=self.settings.classifier.max_batch)

    def _probe_latent_cache(self) -> None:
        """A background probe (ARGUS §4.6): an index lookup of a random unit vector, then a fetch of
        a blob that does not exist from the store (a healthy store answers "missing"). Raises when
        either part fails; the control loop times it."""
        from cache.store import BlobMissing, blob_key

        dim = self.settings.cache.embedding_dim
        vec = np.random.default_rng().standard_normal(dim).astype(np.float32)
        vec /= np.linalg.norm(vec)
        ac = [lv for lv in self.profile.levels if lv.strategy is Strategy.AC and lv.skip > 0]
        k = ac[0].skip if ac else 1
        self.cache.lookup(vec, k, model=self.profile.best.model)
        with contextlib.suppress(BlobMissing):
            self.cache.blobs.get(blob_key("0" * 32, 0))

    async def start(self) -> None:
        await self.dispatch.start()
        if self.dispatch.mode == "redis":
            deployment = {"profile": profile_ref(self.profile), "fallback": self.config.fallback_profile}
            images = store_spec(self.dispatch.images)
            if images is not None:  # the workers write images there (the claim check)
                deployment["images"] = images
            try:
                await asyncio.to_thread(self.store.publish_deployment, deployment)
            except Exception as exc:  # Redis down at start: the control loop keeps retrying
                log.warning("cannot publish the deployment to redis: %s", exc)
        for w in self.workers:
            w.heartbeat_once()  # known to the first plan
            w.start()
        self.control.start()
        if self.drift is not None:
            self.drift.start()
        await self._refresh_workers()
        self._watcher = asyncio.create_task(self._watch_workers(), name="argusdiff-readiness")
        self.started = True

    # -- readiness -------------------------------------------------------------------------

    async def _refresh_workers(self) -> None:
        try:
            alive, _ = await asyncio.to_thread(self.store.heartbeats)
        except Exception as exc:  # the store (Redis) is down: readiness reports the queue
            log.debug("cannot read heartbeats: %s", exc)
            return
        self.serving = {w: str(info["level"]) for w, info in alive.items() if info.get("level")}
        self.waiting_workers = {w: info for w, info in alive.items() if not info.get("level")}

    async def _watch_workers(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self._refresh_workers()

    def not_serving_reason(self) -> str:
        """Why no worker serves a level, from the workers' heartbeats."""
        if not self.waiting_workers:
            return "no worker is up (no heartbeat)"
        states: dict[str, list[str]] = {}  # one line per distinct state, naming its workers
        for w, info in sorted(self.waiting_workers.items()):
            if info.get("last_error"):
                state = str(info["last_error"])
                state = state if len(state) <= 400 else state[:397] + "..."
            elif info.get("loading"):
                state = f"loading {info['loading']}"
            else:
                state = "idle (not in the plan yet)"
            states.setdefault(state, []).append(w)
        text = "; ".join(f"{', '.join(ws)}: {state}" for state, ws in states.items())
        return "no worker serves a level: " + (text if len(text) <= 1000 else text[:997] + "...")

    def readiness(self) -> tuple[bool, str | None]:
        """(ready, why not): ready while not shutting down, the queue answers, a plan exists and at
        least one worker serves a level."""
        if self.router.closing:
            return False, "shutting down"
        if self.dispatch.mode == "redis" and not self.dispatch.healthy:
            return False, "redis is unreachable"
        plan = self.router.plan
        if plan is None or not any(lv is not None for lv in plan.assignment.values()):
            return False, "no plan with a worker yet: the control loop has not run"
        if not self.serving:
            return False, self.not_serving_reason()
        return True, None

    def ready(self) -> bool:
        return self.readiness()[0]

    # -- shutdown --------------------------------------------------------------------------

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """Stop accepting (503 ``shutting_down``, ``/readyz`` not ready) and give the waiting
        clients up to ``timeout_s`` (``[service] drain_timeout_s``) for their images; then every
        wait ends (503 ``shutting_down``). Embedded workers keep serving the accepted images that
        long (they live only in this process); with Redis the work stays queued for the other
        workers. Call from the event loop (or its signal handler); idempotent."""
        if self._drain is not None:
            return
        self.router.closing = True
        limit = self.config.drain_timeout_s if timeout_s is None else timeout_s
        self._drain_deadline = time.monotonic() + limit
        self._drain = asyncio.get_running_loop().create_task(self._drain_waits(limit), name="argusdiff-drain")

    def _draining(self) -> bool:
        if self.dispatch.waiting():
            return True
        return self.dispatch.mode == "embedded" and bool(self.workers) and bool(self.router.inflight)

    async def _drain_waits(self, limit: float) -> int:
        assert self._drain_deadline is not None
        while self._draining() and time.monotonic() < self._drain_deadline:
            await asyncio.sleep(0.05)
        ended = self.dispatch.end_waits(ShuttingDown(f"the service is shutting down (drained for {limit:g} s)"))
        left = len(self.router.inflight) if self.dispatch.mode == "embedded" and self.workers else 0
        if left or ended:
            log.warning("stopping after %.0f s of draining: %d accepted images unfinished, %d waits ended",
                        limit, left, ended)  # fmt: skip
        elif self.router.accepted:
            log.info("drained: every accepted image finished")
        return left

    async def drain(self, timeout_s: float | None = None) -> int:
        """:meth:`begin_shutdown` and wait for its end. Returns the images still unfinished
        (embedded mode; with Redis they stay queued for the other workers)."""
        self.begin_shutdown(timeout_s)
        assert self._drain is not None
        return await asyncio.shield(self._drain)

    async def stop(self) -> None:
        if self.started:
            await self.drain()
        if self._watcher is not None:
            self._watcher.cancel()
        await self.control.stop()
        for w in self.workers:  # all of them stop taking work now; each finishes its batch in hand
            w.stop(timeout=0)
        # the drain waited for the accepted work: a batch still running past it is abandoned
        deadline = time.monotonic() + max(1.0, (self._drain_deadline or 0.0) - time.monotonic())
        for w in self.workers:
            w.stop(timeout=max(0.0, deadline - time.monotonic()))
        await self.dispatch.close()
        if self.drift is not None:
            await asyncio.to_thread(self.drift.stop)
        for part in (self.prompt_pass, self.classifier, self.cache_similarity):
            close = getattr(part, "close", None)
            if callable(close):
                close()
        self.started = False
