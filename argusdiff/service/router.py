"""The data path, live: validate → classify (batched) → policy.route (PASM + worker selector) →
minimum-quality and admission checks → enqueue; then wait for the results.

The router keeps what the policy's :class:`~argusdiff.policies.base.RouteView` and the control
loop need: requests in flight per level (spread over that level's workers as queue lengths and
busy-until estimates), arrivals and classified optimal levels since the last control period, and
the cache health. The policy object is shared with the control loop, which replaces
:attr:`Router.plan` every period.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from argusdiff.domain import ApproxLevel, Plan, Profile, Request, Tier
from argusdiff.policies.base import Policy, RouteView
from argusdiff.service.errors import ApiError, QueueUnavailable
from argusdiff.service.health import CacheHealth
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.schemas import GenerationSpec, Limits
from cache.api import EMBEDDING_META_KEY, CacheUnavailable, encode_embedding
from workers.executor import WorkItem, WorkResult

__all__ = ["Router", "Submission"]

log = logging.getLogger("argusdiff.router")

_QUEUE_DOWN = "the work queue is unavailable; the request was not accepted, retry shortly"


@dataclass(frozen=True, slots=True)
class Submission:
    """An accepted generation: ``n`` work items sharing one id."""

    id: str
    created: int
    request_ids: tuple[str, ...]
    levels: tuple[str, ...]
    optimal_levels: tuple[str | None, ...]
    deadline_s: float  # wall clock
    spec: GenerationSpec
    arrival_s: float = 0.0  # wall clock

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "request_ids": list(self.request_ids),
            "levels": list(self.levels),
            "optimal_levels": list(self.optimal_levels),
            "deadline_s": self.deadline_s,
            "arrival_s": self.arrival_s,
            "response_format": self.spec.response_format,
            "n": self.spec.n,
        }


@dataclass(slots=True)
class _InFlight:
    level: str
    arrival_s: float
    deadline_s: float


class Router:
    def __init__(
        self,
        *,
        profile: Profile,
        policy: Policy,
        dispatch: Any,
        metrics: ServiceMetrics,
        config: Any,
        classifier: Any = None,
        fallback: Profile | None = None,
        cache_health: CacheHealth | None = None,
        sizes: tuple[str, ...] | None = None,
        similarity: Any = None,
        clock=time.time,
    ) -> None:
        self.profile = profile
        self.fallback = fallback
        self.policy = policy
        self.dispatch = dispatch
        self.metrics = metrics
        self.config = config
        self.classifier = classifier if getattr(policy, "uses_classifier", False) else None
        # the cache-similarity view (argusdiff.service.similarity), for policies that read it
        self.similarity = similarity if getattr(policy, "uses_cache_similarity", False) else None
        self.cache_health = cache_health or CacheHealth(
            config.cache_window,
            latency_limit_s=config.cache_latency_threshold_s,
            error_limit=config.cache_error_threshold,
        )
        self.clock = clock
        self.plan: Plan | None = None
        self.closing = False  # shutting down: new requests get 503
        self.up: frozenset[str] = frozenset()
        self.inflight: dict[str, _InFlight] = {}
        self.level_load: Counter[str] = Counter()
        # since the last control period (the control loop swaps them out)
        self.arrivals = 0
        self.affinity: Counter[str] = Counter()
        self.level_arrivals: Counter[str] = Counter()
        self.accepted = 0
        self.completed = 0
        self._levels: dict[str, ApproxLevel] = {lv.id: lv for lv in profile.levels}
        if fallback is not None:
            for lv in fallback.levels:
                self._levels.setdefault(lv.id, lv)
        self.limits = Limits(
            models=tuple(dict.fromkeys((config.model_name, profile.name))),
            levels=profile.ids,
            sizes=tuple(sizes or config.sizes or ("512x512",)),
            max_n=config.max_n,
            max_prompt_chars=config.max_prompt_chars,
            max_slo_s=config.max_slo_s,
        )
        dispatch.on_done = self.on_done

    # -- helpers ---------------------------------------------------------------------------

    def level(self, level_id: str) -> ApproxLevel:
        return self._levels[level_id]

    def slo_for(self, spec: GenerationSpec) -> float:
        if spec.slo_s is not None:
            return spec.slo_s
        factor = float(self.config.tier_slo_factors.get(spec.tier.value, 1.0))
        return self.policy.slo_s * factor

    def take_period_stats(self) -> tuple[int, Counter[str], Counter[str]]:
        """Arrivals, optimal-level counts and per-level arrivals since the last call."""
        out = (self.arrivals, self.affinity, self.level_arrivals)
        self.arrivals, self.affinity, self.level_arrivals = 0, Counter(), Counter()
        return out

    def view(
        self, now: float, plan: Plan, optimal: str | None, slo_s: float, similarity: float | None = None
    ) -> RouteView:
        per_level: dict[str, list[str]] = {}
        for w, lv in plan.assignment.items():
            if lv is not None:
                per_level.setdefault(lv, []).append(w)
        ql: dict[str, int] = {}
        bu: dict[str, float] = {}
        for lv, ws in per_level.items():
            load = self.level_load.get(lv, 0)
            each = math.ceil(load / len(ws)) if ws else 0
            lat = self.level(lv).latency(1) if lv in self._levels else 0.0
            for w in ws:
                ql[w] = each
                bu[w] = now + each * lat
        return RouteView(
            now_s=now,
            queue_lengths=ql,
            busy_until=bu,
            worker_models={w: lv for w, lv in plan.assignment.items()},
            up=self.up or frozenset(plan.assignment),
            optimal_level=optimal,
            cache_similarity=similarity,
            cache_healthy=self.cache_health.healthy,
            slo_s=slo_s,
        )

    def _busy(self, message: str, code: str) -> ApiError:
        """A 503 the client should retry (with ``Retry-After``); nothing was accepted."""
        return ApiError(
            503, message, type="server_busy", code=code, headers={"Retry-After": str(self.config.retry_after_s)}
        )

    def _at_least(self, level_id: str, plan: Plan, minimum: str | None) -> str:
        """``level_id``, or the fastest planned level at least as good as ``minimum``."""
        if minimum is None:
            return level_id
        need = self.level(minimum).quality
        if self.level(level_id).quality >= need - 1e-12:
            return level_id
        served = {lv for lv in plan.assignment.values() if lv is not None}
        good = [lv for lv in plan.levels if lv in self._levels and self.level(lv).quality >= need - 1e-12]
        for lv in reversed(good):  # fastest first
            if lv in served:
                return lv
        raise ApiError(
            429,
            f"no worker currently serves a level at least as good as {minimum!r}; retry later",
            type="server_busy",
            param="min_quality_level",
            code="insufficient_capacity",
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    async def _classify(self, prompt: str) -> str | None:
        if self.classifier is None:
            return None
        try:
            return await asyncio.wrap_future(self.classifier.submit(prompt))
        except Exception as exc:  # a classifier failure degrades routing, never the request
            log.warning("classifier failed: %s", exc)
            return None

    async def _cache_similarity(self, prompt: str) -> tuple[float | None, Any]:
        """The prompt's similarity to its nearest cached prompt and its embedding (None, None: no
        view, an unhealthy cache, or a failed lookup, which counts against the cache's health;
        similarity None with an embedding: nothing of the model is cached yet)."""
        if self.similarity is None or not self.cache_health.healthy:
            return None, None
        t0 = time.perf_counter()
        try:
            sim, embedding = await self.similarity.lookup(prompt)
        except CacheUnavailable as exc:
            self.cache_health.record(None, error=True)
            self.metrics.cache_lookups.labels("error").inc()
            log.warning("cache similarity lookup failed: %s", exc)
            return None, None
        except Exception as exc:  # the view steers routing only; never fail a request over it
            log.warning("cache similarity lookup failed: %s", exc)
            return None, None
        self.metrics.cache_similarity_lookup.observe(time.perf_counter() - t0)
        return sim, embedding

    # -- the data path ---------------------------------------------------------------------

    async def submit(self, spec: GenerationSpec) -> Submission:
        t0 = time.perf_counter()
        if self.closing:
            raise self._busy("the service is shutting down; retry against another instance", "shutting_down")
        plan = self.plan
        if plan is None or not any(lv is not None for lv in plan.assignment.values()):
            raise self._busy("the service is starting: no plan with a worker yet; retry shortly", "not_ready")
        if self.dispatch.mode == "redis" and not self.dispatch.healthy:
            raise self._busy(_QUEUE_DOWN, "queue_unavailable")
        now = self.clock()
        slo = self.slo_for(spec)
        gid = f"gen-{uuid.uuid4().hex[:24]}"
        optimal, (similarity, embedding) = await asyncio.gather(
            self._classify(spec.prompt), self._cache_similarity(spec.prompt)
        )
        embedding_text = encode_embedding(embedding) if embedding is not None else None
        items: list[WorkItem] = []
        levels: list[str] = []
        for i in range(spec.n):
            rid = f"{gid}-{i}"
            seed = None if spec.seed is None else (spec.seed + i) % (2**32)
            request = Request(
                id=rid,
                prompt=spec.prompt,
                arrival_s=now,
                slo_s=slo,
                tier=spec.tier,
                min_quality_level=spec.min_quality_level,
                seed=seed,
            )
            assignment = self.policy.route(request, plan, self.view(now, plan, optimal, slo, similarity))
            if assignment.dropped or assignment.level is None:
                self.metrics.requests.labels("none", "rejected").inc(spec.n)
                raise ApiError(
                    429,
                    f"the service is overloaded ({assignment.reason or 'admission control'}); retry later",
                    type="server_busy",
                    code="overloaded",
                    headers={"Retry-After": str(self.config.retry_after_s)},
                )
            level = self._at_least(assignment.level, plan, spec.min_quality_level)
            meta = {"tier": spec.tier.value, "group": gid, "size": spec.size}
            if optimal is not None:
                meta["optimal_level"] = optimal
            if similarity is not None:
                meta["cache_similarity"] = f"{similarity:.4f}"
            if embedding_text is not None:
                meta[EMBEDDING_META_KEY] = embedding_text  # the AC executor need not embed again
            if assignment.worker:
                meta["worker_hint"] = assignment.worker
            items.append(
                WorkItem(
                    request_id=rid,
                    prompt=spec.prompt,
                    level=level,
                    seed=seed,
                    deadline_s=now + slo,
                    enqueue_s=now,
                    meta=meta,
                )
            )
            levels.append(level)
            # count it as load at once so the next image of the same request sees it
            self.level_load[level] += 1
        sub = Submission(
            id=gid,
            created=int(now),
            request_ids=tuple(it.request_id for it in items),
            levels=tuple(levels),
            optimal_levels=tuple(optimal for _ in items),
            deadline_s=now + slo,
            spec=spec,
            arrival_s=now,
        )
        if spec.wait:
            self.dispatch.expect(sub.request_ids)
        try:
            await self.dispatch.enqueue(items, (gid, sub.record(), self.config.result_ttl_s))
        except QueueUnavailable as exc:
            for lv in levels:
                self.level_load[lv] -= 1
            self.dispatch.forget(sub.request_ids)
            self.metrics.queue_errors.inc()
            raise self._busy(_QUEUE_DOWN, "queue_unavailable") from exc
        for it in items:
            self.inflight[it.request_id] = _InFlight(it.level, now, now + slo)
        self.arrivals += spec.n
        self.accepted += spec.n
        for lv in levels:
            self.level_arrivals[lv] += 1
            self.metrics.queue_depth.labels(lv).set(self.level_load[lv])
        if optimal is not None:
            self.affinity[optimal] += spec.n
        per_image = (time.perf_counter() - t0) / spec.n
        for _ in range(spec.n):
            self.metrics.overhead.observe(per_image)
        return sub

    async def wait(self, sub: Submission, timeout: float) -> list[WorkResult]:
        """The results of ``sub`` in order; raises ``TimeoutError`` (the work stays queued)."""
        futs = self.dispatch.expect(sub.request_ids)
        try:
            done = await asyncio.wait_for(asyncio.gather(*(asyncio.shield(f) for f in futs)), timeout)
        except TimeoutError:
            self.dispatch.forget(sub.request_ids)
            raise
        return list(done)

    def on_done(self, request_id: str, s: dict) -> None:
        """Bookkeeping for a finished work item (event-loop thread); ``s`` is its summary."""
        now = self.clock()
        fl = self.inflight.pop(request_id, None)
        level = s.get("level") or (fl.level if fl else "unknown")
        ok = bool(s.get("ok"))
        if fl is not None:
            self.level_load[fl.level] = max(0, self.level_load[fl.level] - 1)
            self.metrics.queue_depth.labels(fl.level).set(self.level_load[fl.level])
            self.metrics.latency.labels(level).observe(max(0.0, now - fl.arrival_s))
            if now > fl.deadline_s:
                self.metrics.slo_violations.labels(level).inc()
            self.policy.on_served(level, now - fl.arrival_s, ok and now <= fl.deadline_s)
        self.completed += 1
        self.metrics.requests.labels(level, "ok" if ok else "error").inc()
        lookup = float(s.get("lookup_s", 0.0)) + float(s.get("fetch_s", 0.0))
        if s.get("cache_error"):
            self.cache_health.record(None, error=True)
            self.metrics.cache_lookups.labels("error").inc()
        elif s.get("lookup_s", 0.0) > 0:
            hit = bool(s.get("cache_hit"))
            self.cache_health.record(lookup, hit=hit)
            self.metrics.cache_lookups.labels("hit" if hit else "miss").inc()
            self.metrics.cache_lookup.observe(lookup)
            self.metrics.cache_hit_ratio.set(self.cache_health.hit_ratio())

    def set_plan(self, plan: Plan, up: frozenset[str]) -> None:
        self.plan = plan
        self.up = up


def tier_of(value: str | None) -> Tier:
    return Tier(value) if value else Tier.STANDARD
