"""The data path, live: validate → classify (batched) → ``policy.decide`` (route: PASM, level,
quality floor) → admission (:mod:`argusdiff.admission`, the call the simulator makes too) → enqueue
on the level's queue (or, for a policy whose delivery is ``PER_WORKER``, on the queue of the worker
it picked: ``meta["worker"]``); then wait for the results. A refused request leaves nothing counted as load.
A cascade deferral comes back from the light worker and goes to ``policy.decide_heavy``
(:meth:`Router.on_handoff`).

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
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from argusdiff import tracing
from argusdiff.admission import Admission, AdmissionConfig, Decision
from argusdiff.config import ServiceConfig
from argusdiff.domain import (
    ApproxLevel,
    Assignment,
    Delivery,
    Outcome,
    Plan,
    Profile,
    Refusal,
    Request,
    RouteReason,
    Tier,
    level_catalogue,
    tier_rank,
)
from argusdiff.latency import LatencyEstimator
from argusdiff.period import PeriodAccumulator, PeriodStats
from argusdiff.policies.base import Policy, RouteView
from argusdiff.service.errors import ApiError, QueueUnavailable
from argusdiff.service.explain import explain
from argusdiff.service.health import CacheHealth
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.ports import PromptClassifier, PromptSimilarity, RouterDispatch
from argusdiff.service.prompt_pass import PromptPass
from argusdiff.service.schemas import GenerationSpec, Limits
from cache.api import EMBEDDING_META_KEY, CacheUnavailable, encode_embedding
from workers.cancel import CANCELLED
from workers.messages import WorkItem, WorkResult
from workers.queue import WORKER_META
from workers.safety import FILTERED

__all__ = ["Router", "Submission"]

log = logging.getLogger("argusdiff.router")

#: ``error_type`` of a request the policy dropped after it was accepted (a cascade deferral
#: predicted to miss its deadline)
DROPPED = "Dropped"

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
    why: tuple[str, ...] = ()  # per image: why it went where it did (argusdiff.service.explain)

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "request_ids": list(self.request_ids),
            "levels": list(self.levels),
            "optimal_levels": list(self.optimal_levels),
            "why": list(self.why),
            "deadline_s": self.deadline_s,
            "arrival_s": self.arrival_s,
            "response_format": self.spec.response_format,
            "n": self.spec.n,
            **self.spec.record_fields(),
        }


@dataclass(slots=True)
class _InFlight:
    level: str
    arrival_s: float
    deadline_s: float
    rank: int = 1  # its tier's pull rank (argusdiff.domain.tier_rank)
    worker: str | None = None  # the worker whose own queue it waits in (Delivery.PER_WORKER)


class Router:
    def __init__(
        self,
        *,
        profile: Profile,
        policy: Policy,
        dispatch: RouterDispatch,
        metrics: ServiceMetrics,
        config: ServiceConfig,
        classifier: PromptClassifier | None = None,
        fallback: Profile | None = None,
        cache_health: CacheHealth | None = None,
        sizes: tuple[str, ...] | None = None,
        similarity: PromptSimilarity | None = None,
        admission: AdmissionConfig | None = None,
        prompt_pass: PromptPass | None = None,
        moderation: bool = False,
        clock=time.time,
    ) -> None:
        self.profile = profile
        self.fallback = fallback
        self.policy = policy
        self.dispatch = dispatch
        self.metrics = metrics
        self.config = config
        self.classifier = classifier if policy.uses_classifier else None
        # what to know of the classifier's readings (e.g. fitted at start on synthetic labels): in each `why`
        self.classifier_caveat: str | None = getattr(self.classifier, "caveat", None)
        # the cache-similarity view (argusdiff.service.similarity), for policies that read it
        self.similarity = similarity if policy.uses_cache_similarity else None
        # both: one encoder pass per prompt for the two (argusdiff.service.prompt_pass)
        both = self.classifier is not None and self.similarity is not None
        self.prompt_pass = prompt_pass if both else None
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
        # Delivery.PER_WORKER: in-flight images per worker, each in the queue of the worker its
        # policy picked (the view's queue lengths, as the simulator's per-worker queues)
        self.worker_load: Counter[str] = Counter()
        # in-flight images per (level, tier pull rank): what a request of a tier waits behind, as
        # workers pull a level's queue highest-priority tier first (admission)
        self.tier_load: Counter[tuple[str, int]] = Counter()
        # the control period's traffic (arrivals and their times, affinity, tier mix, routing,
        # cache lookups), counted as the simulator counts it; the control loop takes it each tick
        # (argusdiff.period). Arrival times no loop takes (e.g. a follower's) are kept for three
        # periods, at least five minutes
        self.period = PeriodAccumulator()
        self._arrival_horizon_s = max(300.0, 3.0 * float(getattr(config, "control_period_s", 60.0) or 60.0))
        self.accepted = 0
        self.completed = 0
        self._levels: dict[str, ApproxLevel] = level_catalogue(profile, fallback)
        # admission after the policy (argusdiff.admission; the simulator applies the same)
        scale = getattr(config, "stand_in_scale", None) or 1.0
        self.admission = Admission(self._levels, admission or AdmissionConfig(time_scale=scale))
        # latencies learned online from what the workers report (argusdiff.latency)
        self.latency = LatencyEstimator()
        self.adapters = (*profile.adapters, *(fallback.adapters if fallback is not None else ()))
        self.limits = Limits.of(
            config,
            profile.name,
            profile.ids,
            tuple(sizes or config.sizes or ("512x512",)),
            moderation=moderation,
            adapters=self.adapters,
        )
        dispatch.on_done = self.on_done
        dispatch.on_handoff = self.on_handoff
        self.handoffs: Counter[str] = Counter()  # cascade hand-offs by decision: heavy, dropped, kept
        # per level: the wall-clock time the next refused request is told to retry at (a burst's
        # Retry-After values are spread over the time the level needs to absorb the retries)
        self._retry_slots: dict[str, float] = {}
        # tenants' concurrent slots held by accepted generations (argusdiff.service.quotas)
        self._lease_of: dict[str, tuple[str, Any]] = {}  # request id -> (generation id, lease)
        self._lease_left: dict[str, int] = {}  # generation id -> its images still in flight

    # -- helpers ---------------------------------------------------------------------------

    def level(self, level_id: str) -> ApproxLevel:
        return self._levels[level_id]

    def slo_for(self, spec: GenerationSpec) -> float:
        if spec.slo_s is not None:
            return spec.slo_s
        factor = float(self.config.tier_slo_factors.get(spec.tier.value, 1.0))
        return self.policy.slo_s * factor

    @property
    def per_worker(self) -> bool:
        """Whether the policy's delivery is :attr:`Delivery.PER_WORKER <argusdiff.domain.Delivery>`:
        each item names the worker ``route`` picked and waits in that worker's queue."""
        return self.policy.delivery is Delivery.PER_WORKER

    def take_period(self, latency_scale: Mapping[str, float] | None = None) -> PeriodStats:
        """The control period's traffic since the last call, with the latencies measured so far
        (``latency_scale``, default this router's: :meth:`latency_scales`) (event-loop thread); a
        new period begins. A period that could not be used goes back with :meth:`give_back`."""
        return self.period.take(self.latency_scales() if latency_scale is None else latency_scale)

    def give_back(self, period: PeriodStats) -> None:
        """A period the control loop could not use counts in the next one (event-loop thread)."""
        self.period.add(period)

    def latency_scales(self, peers: Iterable[Mapping[str, Sequence[float]]] = ()) -> dict[str, float]:
        """Each measured level's latency / profiled (:meth:`argusdiff.latency.LatencyEstimator.scales`),
        pooled with ``peers``, other routers' measurement windows."""
        return self.latency.scales(peers)

    def peek_period(self, latency_scale: Mapping[str, float] | None = None) -> PeriodStats:
        """The control period's traffic so far, with the latencies measured so far (``latency_scale``,
        default this router's) (event-loop thread); the period goes on (a look inside it,
        ``Policy.check_s``)."""
        return self.period.peek(self.latency_scales() if latency_scale is None else latency_scale)

    def _arrived(self, now: float, n: int, tier: str = Tier.STANDARD.value) -> None:
        """Count ``n`` arrivals of ``tier`` at ``now`` as demand (admitted or refused)."""
        self.period.arrived(now, n, tier)
        self.period.forget_before(now - self._arrival_horizon_s)

    def view(
        self,
        now: float,
        plan: Plan,
        optimal: str | None,
        slo_s: float,
        similarity: float | None = None,
        *,
        level_load: Mapping[str, int] | None = None,
        worker_load: Mapping[str, int] | None = None,
        cache_healthy: bool | None = None,
    ) -> RouteView:
        """What the policy observes routing under ``plan`` at ``now``: each worker's queue and busy
        time from the in-flight images per level (``level_load``, default this router's) or, under
        ``Delivery.PER_WORKER``, per worker (``worker_load``, default this router's), and the
        cache's health (``cache_healthy``, default this router's window)."""
        if level_load is None:
            level_load = self.level_load
        per_level: dict[str, list[str]] = {}
        for w, lv in plan.assignment.items():
            if lv is not None:
                per_level.setdefault(lv, []).append(w)
        ql: dict[str, int] = {}
        bu: dict[str, float] = {}
        # Delivery.PER_WORKER: each worker's own queue
        own = (self.worker_load if worker_load is None else worker_load) if self.per_worker else None
        for lv, ws in per_level.items():
            # the level's queue is pulled by its workers: its load spread evenly over them (with 2
            # in flight on 4 workers, 2 are busy and 2 idle, as the simulator would see them), each
            # busy until its share is done in batches of up to the plan's batch size (the batch in
            # service half done on average: the router does not see batches start)
            load = level_load.get(lv, 0)
            level = self._levels.get(lv)
            # the AC levels no worker holds are pulled by these workers too (Plan.unserved_siblings):
            # their in-flight images join the share, each at its own latency
            siblings = [(x, level_load.get(x, 0)) for x in plan.unserved_siblings(self._levels, lv)]
            sib_load = sum(n for _x, n in siblings)
            each, extra = divmod(load + sib_load, len(ws))
            b = max(1, int(plan.batch_sizes.get(lv, 1)))
            sc = plan.latency_scale.get(lv, 1.0)  # the measured latencies the plan was made with
            for k, w in enumerate(ws):
                q = own.get(w, 0) if own is not None else each + (1 if k < extra else 0)
                ql[w] = q
                if level is None:
                    bu[w] = now
                elif sib_load:
                    # batch size 1 across sibling levels (one model, different K): the mean time per image
                    per = (load * level.latency(1) + sum(n * self._levels[x].latency(1) for x, n in siblings)) / (
                        load + sib_load
                    )
                    bu[w] = now + (q - 0.5) * per * sc if q else now
                else:
                    bu[w] = now + self._drain_s(level, q, b) * sc
        return RouteView(
            now_s=now,
            queue_lengths=ql,
            busy_until=bu,
            worker_models={w: lv for w, lv in plan.assignment.items()},
            up=self.up or frozenset(plan.assignment),
            optimal_level=optimal,
            cache_similarity=similarity,
            cache_healthy=self.cache_health.healthy if cache_healthy is None else cache_healthy,
            slo_s=slo_s,
            # one deadline for the policy's routing and admission (argusdiff.deadline)
            deadline_factor=self.admission.config.deadline_factor if self.admission.enabled else 1.0,
        )

    @staticmethod
    def _drain_s(level: ApproxLevel, q: int, b: int) -> float:
        """How long a worker of ``level`` needs for ``q`` requests in batches of up to ``b``, the
        batch in service counted half done."""
        if q <= 0:
            return 0.0
        full, rest = divmod(q, b)
        total = full * level.latency(b) + (level.latency(rest) if rest else 0.0)
        return total - 0.5 * level.latency(min(q, b))

    def _busy(self, message: str, code: str) -> ApiError:
        """A 503 the client should retry (with ``Retry-After``); nothing was accepted."""
        return ApiError(
            503, message, type="server_busy", code=code, headers={"Retry-After": str(self.config.retry_after_s)}
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

    async def _read_prompt(self, prompt: str) -> tuple[str | None, float | None, Any]:
        """The prompt's optimal level, cache similarity and embedding: one encoder pass when the
        classifier and the cache view share their encoder (:attr:`prompt_pass`), else each its own.
        Failures degrade routing as in :meth:`_classify` and :meth:`_cache_similarity`."""
        if self.prompt_pass is None:
            optimal, (similarity, embedding) = await asyncio.gather(
                self._classify(prompt), self._cache_similarity(prompt)
            )
            return optimal, similarity, embedding
        lookup = self.cache_health.healthy
        t0 = time.perf_counter()
        try:
            r = await asyncio.wrap_future(self.prompt_pass.submit(prompt, lookup))
        except Exception as exc:  # the pass steers routing only; never fail a request over it
            log.warning("prompt pass failed: %s", exc)
            return None, None, None
        if r.classifier_error is not None:
            log.warning("classifier failed: %s", r.classifier_error)
        if r.lookup_error is not None:
            if isinstance(r.lookup_error, CacheUnavailable):
                self.cache_health.record(None, error=True)
                self.metrics.cache_lookups.labels("error").inc()
            log.warning("cache similarity lookup failed: %s", r.lookup_error)
            return r.optimal, None, r.embedding
        if r.looked_up:
            self.metrics.cache_similarity_lookup.observe(time.perf_counter() - t0)
        return r.optimal, r.similarity, r.embedding

    # -- the data path ---------------------------------------------------------------------

    async def submit(self, spec: GenerationSpec) -> Submission:
        added: Counter[str] = Counter()  # this request's images counted as load so far
        try:
            return await self._submit(spec, added)
        except BaseException:
            # refused (by the policy, the quality floor or admission), queue down or cancelled:
            # nothing of it was accepted, so none of its images stays counted as load
            rank = tier_rank(spec.tier)
            for lv, k in added.items():
                self.level_load[lv] = max(0, self.level_load[lv] - k)
                self.tier_load[lv, rank] = max(0, self.tier_load[lv, rank] - k)
            raise

    def _refuse(
        self, spec: GenerationSpec, why: str, refusal: Refusal, retry_after_s: float, now: float, optimal: str | None
    ) -> ApiError:
        """429 ``overloaded``: nothing of the request was accepted. It still counts as demand, as
        in the simulator (the planner sees the offered load, not only what was admitted).
        ``refusal`` is who refused (the metric's label), ``why`` the words for the client."""
        self.metrics.requests.labels("none", "rejected").inc(spec.n)
        self.metrics.refused.labels(refusal).inc()
        self._arrived(now, spec.n, spec.tier.value)
        if optimal is not None:
            self.period.classified(optimal, spec.n)
        return ApiError(
            429,
            f"the service is overloaded ({why}); retry later",
            type="server_busy",
            code="overloaded",
            headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
        )

    def _retry_slot(self, level: str, plan: Plan, retry_s: float, now: float, n: int) -> float:
        """``Retry-After`` of a refusal at ``level``: admission's time until the backlog has drained
        enough, pushed back behind the retries already promised at the level, so a burst of refused
        clients is told to come back spread over the time the level needs to absorb them (one image
        interval each), not all at the same second."""
        workers = len(self.admission.workers(plan, level, self.up or None))
        step = self.admission.image_interval(level, plan=plan, workers=workers) * max(1, n)
        cap = float(self.admission.config.max_retry_after_s)
        slot = min(now + cap, max(now + retry_s, self._retry_slots.get(level, 0.0)))
        self._retry_slots[level] = slot + step
        return slot - now

    def _admit(self, level: str, plan: Plan, now: float, slo: float, rank: int, verdict=None) -> Decision:
        """Admission (:mod:`argusdiff.admission`) of one image routed to ``level``: the policy's
        deadline verdict when it gives one, else the level's in-flight images of its tier or a
        higher one (this request's earlier images included; workers pull the highest-priority tier
        first) over the up workers serving it."""
        workers = self.admission.workers(plan, level, self.up or None)
        queued = sum(self.tier_load.get((level, r), 0) for r in range(rank + 1))
        return self.admission.check(
            level, plan=plan, queued=queued, workers=len(workers),
            now_s=now, arrival_s=now, slo_s=slo, verdict=verdict,
        )  # fmt: skip

    async def _submit(self, spec: GenerationSpec, added: Counter[str]) -> Submission:
        t0 = time.perf_counter()
        plan = self._ready_plan()
        now = self.clock()
        slo = self.slo_for(spec)
        gid = f"gen-{secrets.token_hex(12)}"  # 96 random bits
        rank = tier_rank(spec.tier)
        with tracing.span("classification", **{"argusdiff.generation": gid}):
            optimal, similarity, embedding = await self._read_prompt(spec.prompt)
        models = None
        if spec.lora is not None:  # the adapter's models only; their latents are its own (no similarity view)
            models = frozenset(a.model for a in self.adapters if a.name == spec.lora)
            similarity = None
        # every image's item metadata; the request id and traceparent ride to the worker
        correlation = tracing.item_meta()
        base_meta = {"tier": spec.tier.value, "group": gid, "size": spec.size, **spec.item_meta(), **correlation}
        if optimal is not None:
            base_meta["optimal_level"] = optimal
        if similarity is not None:
            base_meta["cache_similarity"] = f"{similarity:.4f}"
        if embedding is not None:
            base_meta[EMBEDDING_META_KEY] = encode_embedding(embedding)  # the AC executor need not embed again
        if spec.min_quality_level is not None:
            base_meta["min_quality_level"] = spec.min_quality_level  # a cascade hand-off keeps the floor
        items: list[WorkItem] = []
        levels: list[str] = []
        why: list[str] = []
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
                models=models,
            )
            with tracing.span("route", **{"argusdiff.optimal_level": optimal or ""}):
                assignment = self.policy.decide(request, plan, self.view(now, plan, optimal, slo, similarity))
            self.metrics.routed.labels(assignment.outcome.value, assignment.cause.value).inc()
            if not assignment.taken:
                raise self._not_taken(assignment, spec, now, optimal)
            level = assignment.level
            with tracing.span("admission", **{"argusdiff.level": level}):
                decision = self._admit(level, plan, now, slo, rank, assignment.verdict)
            if not decision.admitted:
                why = f"{decision.reason} at {level}"
                retry = self._retry_slot(level, plan, decision.retry_after_s, now, spec.n)
                raise self._refuse(spec, why, decision.reason, retry, now, optimal)
            meta = dict(base_meta)
            if self.per_worker and assignment.worker is not None:
                meta[WORKER_META] = assignment.worker  # Delivery.PER_WORKER: it waits in that worker's queue
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
            why.append(
                explain(
                    assignment,
                    plan,
                    optimal=optimal,
                    reads_prompt=self.policy.uses_classifier,
                    tier=spec.tier.value,
                    classifier=self.classifier_caveat,
                )
            )
            # count it as load at once so the next image of the same request sees it (given back
            # by submit() unless the request is accepted)
            self.level_load[level] += 1
            self.tier_load[level, rank] += 1
            added[level] += 1
        sub = Submission(
            id=gid,
            created=int(now),
            request_ids=tuple(it.request_id for it in items),
            levels=tuple(levels),
            optimal_levels=tuple(optimal for _ in items),
            deadline_s=now + slo,
            spec=spec,
            arrival_s=now,
            why=tuple(why),
        )
        await self._enqueue(sub, items)
        added.clear()  # accepted: the load stays until each image is done
        self._accepted(sub, items, rank, optimal)
        per_image = (time.perf_counter() - t0) / spec.n
        for _ in range(spec.n):
            self.metrics.overhead.observe(per_image)
        return sub

    def _ready_plan(self) -> Plan:
        """The plan a new request is routed with; raises the 503 of a service that cannot take it
        (shutting down, no plan with a worker yet, the work queue down)."""
        if self.closing:
            raise self._busy("the service is shutting down; retry against another instance", "shutting_down")
        plan = self.plan
        if plan is None or not any(lv is not None for lv in plan.assignment.values()):
            raise self._busy("the service is starting: no plan with a worker yet; retry shortly", "not_ready")
        if self.dispatch.mode == "redis" and not self.dispatch.healthy:
            self.metrics.queue_errors.inc()
            raise self._busy(_QUEUE_DOWN, "queue_unavailable")
        return plan

    def _not_taken(self, assignment: Assignment, spec: GenerationSpec, now: float, optimal: str | None) -> ApiError:
        """The 429 of a request the policy did not take: no worker serves the adapter's models or
        the quality floor, or the policy dropped it."""
        if assignment.refusal is Refusal.MODELS_UNSERVED:
            param, what = "lora", f"a model with adapter {spec.lora!r}"
        elif assignment.refusal is Refusal.FLOOR_UNMET:
            param, what = "min_quality_level", f"a level at least as good as {spec.min_quality_level!r}"
        else:
            param = what = None
        if param is not None:
            self.metrics.requests.labels("none", "rejected").inc(spec.n)
            return ApiError(
                429,
                f"no worker currently serves {what}; retry later",
                type="server_busy",
                param=param,
                code="insufficient_capacity",
                headers={"Retry-After": str(self.config.retry_after_s)},
            )
        why = assignment.reason or "dropped by the policy"
        return self._refuse(spec, why, Refusal.POLICY, self.config.retry_after_s, now, optimal)

    async def _enqueue(self, sub: Submission, items: list[WorkItem]) -> None:
        """Hand an accepted request's images to the work queue (its result record with them);
        raises the 503 of a queue that is down, having forgotten the waits it registered."""
        if sub.spec.wait:
            self.dispatch.expect(sub.request_ids)
        try:
            await self.dispatch.enqueue(items, (sub.id, sub.record(), self.config.result_ttl_s))
        except QueueUnavailable as exc:
            self.dispatch.forget(sub.request_ids)
            self.metrics.queue_errors.inc()
            raise self._busy(_QUEUE_DOWN, "queue_unavailable") from exc

    def _accepted(self, sub: Submission, items: list[WorkItem], rank: int, optimal: str | None) -> None:
        """Book an enqueued request: its images in flight (per worker under per-worker delivery),
        its arrival, the period's routing and classification counts and the queue-depth gauges."""
        now, slo_end, n = sub.arrival_s, sub.deadline_s, sub.spec.n
        for it in items:
            worker = it.meta.get(WORKER_META) or None
            self.inflight[it.request_id] = _InFlight(it.level, now, slo_end, rank, worker)
            if worker is not None:
                self.worker_load[worker] += 1
        self._arrived(now, n, sub.spec.tier.value)
        self.accepted += n
        for lv in sub.levels:
            self.period.routed(lv)
            self.metrics.queue_depth.labels(lv).set(self.level_load[lv])
        if optimal is not None:
            self.period.classified(optimal, n)
        log.debug("accepted %s: %d image(s) at %s", sub.id, n, ",".join(sub.levels))

    async def wait(self, sub: Submission, timeout: float) -> list[WorkResult]:
        """The results of ``sub`` in order; raises ``TimeoutError`` (the work stays queued),
        ``WorkLost`` or ``ShuttingDown`` (see :meth:`argusdiff.service.dispatch.Dispatch.wait`)."""
        return await self.dispatch.wait(list(sub.request_ids), timeout)

    def hold(self, sub: Submission, lease: Any) -> None:
        """``lease`` (a tenant's concurrent slot, :class:`argusdiff.service.quotas.Lease`) is held
        until every image of ``sub`` is done (finished, cancelled or lost); released at once when
        none is in flight here (a replayed generation, or one already done)."""
        if getattr(lease, "quotas", None) is None:  # nothing held (no concurrent quota)
            return
        left = {rid for rid in sub.request_ids if rid in self.inflight}
        if not left:
            lease.release_soon()
            return
        for rid in left:
            self._lease_of[rid] = (sub.id, lease)
        self._lease_left[sub.id] = len(left)

    def _item_over(self, request_id: str) -> None:
        """An image of a generation is done: free the generation's concurrent slot with its last."""
        held = self._lease_of.pop(request_id, None)
        if held is None:
            return
        gid, lease = held
        self._lease_left[gid] -= 1
        if self._lease_left[gid] <= 0:
            del self._lease_left[gid]
            lease.release_soon()

    def _measure(self, level_id: str, run_s: float) -> None:
        """One image's reported execution time at ``level_id`` into the latency estimator
        (:mod:`argusdiff.latency`), against the profile at the workers' speed."""
        lv = self._levels.get(level_id)
        if lv is None:
            return
        profiled = lv.latency(1) * self.admission.config.time_scale
        self.latency.observe(level_id, run_s, profiled)
        self.metrics.level_latency.labels(level_id, "profiled").set(profiled)
        self.metrics.level_latency.labels(level_id, "measured").set(profiled * self.latency.scale(level_id))

    def latencies(self) -> dict[str, dict[str, float]]:
        """Per measured level: profiled and measured seconds per image and the batches measured
        (``GET /v1/plan``'s ``latencies``)."""
        out = {}
        for level_id, scale in sorted(self.latency.scales().items()):
            lv = self._levels.get(level_id)
            if lv is None:
                continue
            profiled = lv.latency(1) * self.admission.config.time_scale
            out[level_id] = {
                "profiled_s": profiled,
                "measured_s": profiled * scale,
                "scale": scale,
                "measured": self.latency.count(level_id),
            }
        return out

    def _worker_done(self, fl: _InFlight) -> None:
        if fl.worker is not None:
            n = self.worker_load[fl.worker] - 1
            if n > 0:
                self.worker_load[fl.worker] = n
            else:
                del self.worker_load[fl.worker]

    def forget_items(self, request_ids: list[str], outcome: str) -> None:
        """Bookkeeping for accepted items that will never finish (taken out of their queue after the
        client went away, or lost by the queue): no longer in flight, counted as ``outcome``."""
        for rid in request_ids:
            self._item_over(rid)
            fl = self.inflight.pop(rid, None)
            if fl is None:
                continue
            self._worker_done(fl)
            self.level_load[fl.level] = max(0, self.level_load[fl.level] - 1)
            self.tier_load[fl.level, fl.rank] = max(0, self.tier_load[fl.level, fl.rank] - 1)
            self.metrics.queue_depth.labels(fl.level).set(self.level_load[fl.level])
            self.metrics.requests.labels(fl.level, outcome).inc()

    def on_done(self, request_id: str, s: dict) -> None:
        """Bookkeeping for a finished work item (event-loop thread); ``s`` is its summary."""
        now = self.clock()
        self._item_over(request_id)
        fl = self.inflight.pop(request_id, None)
        level = s.get("level") or (fl.level if fl else "unknown")
        ok = bool(s.get("ok"))
        dropped = s.get("error_type") == DROPPED
        cancelled = s.get("error_type") == CANCELLED
        filtered = s.get("error_type") == FILTERED
        if fl is not None:
            self._worker_done(fl)
            self.level_load[fl.level] = max(0, self.level_load[fl.level] - 1)
            self.tier_load[fl.level, fl.rank] = max(0, self.tier_load[fl.level, fl.rank] - 1)
            self.metrics.queue_depth.labels(fl.level).set(self.level_load[fl.level])
            if ok and float(s.get("run_s", 0.0)) > 0:
                self._measure(level, float(s["run_s"]))
            if not dropped and not cancelled:
                self.metrics.latency.labels(level).observe(max(0.0, now - fl.arrival_s))
                if now > fl.deadline_s:
                    self.metrics.slo_violations.labels(level).inc()
                self.policy.on_served(level, now - fl.arrival_s, ok and now <= fl.deadline_s)
        self.completed += 1
        outcome = (
            "dropped" if dropped else "cancelled" if cancelled else "filtered" if filtered else "ok" if ok else "error"
        )
        self.metrics.requests.labels(level, outcome).inc()
        lookup = float(s.get("lookup_s", 0.0)) + float(s.get("fetch_s", 0.0))
        if s.get("cache_error"):
            self.cache_health.record(None, error=True)
            self.metrics.cache_lookups.labels("error").inc()
        elif s.get("lookup_s", 0.0) > 0:
            hit = bool(s.get("cache_hit"))
            self.period.looked_up(hit)
            self.cache_health.record(lookup, hit=hit)
            self.metrics.cache_lookups.labels("hit" if hit else "miss").inc()
            self.metrics.cache_lookup.observe(lookup)
            self.metrics.cache_hit_ratio.set(self.cache_health.hit_ratio())

    def on_handoff(self, request_id: str, result: WorkResult) -> tuple[WorkItem | None, WorkResult | None]:
        """A cascade deferral (the light image was rejected): the policy decides, with the same
        ``decide_heavy`` call the simulator makes, whether the heavy level redoes the request (the
        item to queue), the request is dropped, or the light image is the answer (the final
        result). Event-loop thread."""
        item = result.handoff
        assert item is not None
        now = self.clock()
        fl = self.inflight.get(request_id)
        arrival = fl.arrival_s if fl is not None else (item.enqueue_s or now)
        deadline = item.deadline_s if item.deadline_s is not None else arrival + self.policy.slo_s
        slo = max(0.0, deadline - arrival)
        request = Request(
            id=request_id,
            prompt=item.prompt,
            arrival_s=arrival,
            slo_s=slo,
            tier=Tier(item.meta["tier"]) if item.meta.get("tier") in Tier._value2member_map_ else Tier.STANDARD,
            min_quality_level=item.meta.get("min_quality_level") or None,
            seed=item.seed,
            models=frozenset(a.model for a in self.adapters if a.name == item.meta["lora"])
            if item.meta.get("lora")
            else None,
        )
        plan = self.plan
        if plan is None:
            assignment = Assignment(
                level=None, reason="no plan: light image returned", outcome=Outcome.KEPT, cause=RouteReason.NO_HEAVY
            )
        else:
            view = self.view(now, plan, None, slo)
            view.deferred_from = item.meta.get("deferred_from") or result.level  # which pair's heavy level
            assignment = self.policy.decide_heavy(request, plan, view)
        self.metrics.routed.labels(assignment.outcome.value, assignment.cause.value).inc()
        light = replace(result, handoff=None)
        if assignment.outcome is Outcome.KEPT:
            self.handoffs["kept"] += 1
            self.metrics.cascade_handoffs.labels("kept").inc()
            return None, light
        if not assignment.taken:
            self.handoffs["dropped"] += 1
            self.metrics.cascade_handoffs.labels("dropped").inc()
            return None, replace(
                light,
                image_png=None,
                image_ref=None,
                error=f"dropped after the light stage ({assignment.reason or 'the policy dropped it'})",
                error_type=DROPPED,
                deferred=True,
            )
        self.handoffs["heavy"] += 1
        self.metrics.cascade_handoffs.labels("heavy").inc()
        worker = assignment.worker if self.per_worker else None
        if fl is not None:  # the light stage is done: the request now loads the heavy level
            self.level_load[fl.level] = max(0, self.level_load[fl.level] - 1)
            self.tier_load[fl.level, fl.rank] = max(0, self.tier_load[fl.level, fl.rank] - 1)
            self.metrics.queue_depth.labels(fl.level).set(self.level_load[fl.level])
            self._worker_done(fl)
            fl.level, fl.worker = assignment.level, worker
            self.level_load[fl.level] += 1
            self.tier_load[fl.level, fl.rank] += 1
            if worker is not None:
                self.worker_load[worker] += 1
            self.metrics.queue_depth.labels(fl.level).set(self.level_load[fl.level])
        meta = {k: v for k, v in item.meta.items() if k != WORKER_META}
        if worker is not None:
            meta[WORKER_META] = worker
        return replace(item, level=assignment.level, enqueue_s=now, meta=meta), None

    def set_plan(self, plan: Plan, up: frozenset[str]) -> None:
        """Route with ``plan`` from now on, by its routing object (``Plan.routing``): the policy's,
        or, for a plan read from the control store (a follower's), one this router's policy builds."""
        self.plan = self.policy.routed(plan)
        self.up = up
