"""What the router and the control loop need of their collaborators, as typing protocols (no
behaviour): the dispatch that carries work items and results, the prompt classifier, the cache's
similarity view, the work queue and the router as the control loop sees them (one router's, or a
leader's view of the cluster's: :class:`argusdiff.service.cluster.ClusterRouterView`). The
implementations satisfy them
structurally; this module imports nothing of the service, so any module may name them without
forming an import cycle (``argusdiff.service.dispatch`` itself imports the router through
``argusdiff.service.idempotency``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from workers.messages import WorkItem, WorkResult
from workers.queue import WorkQueue

if TYPE_CHECKING:
    from argusdiff.domain import Plan, Profile
    from argusdiff.period import PeriodStats
    from argusdiff.policies.base import Policy, RouteView

__all__ = [
    "ControlCacheHealth",
    "ControlQueue",
    "ControlledRouter",
    "PromptClassifier",
    "PromptSimilarity",
    "RouterDispatch",
]


class RouterDispatch(Protocol):
    """The data path's transport as the router uses it (:class:`argusdiff.service.dispatch.Dispatch`:
    in-process queues, or Redis Streams)."""

    mode: str  # "embedded" | "redis"
    healthy: bool  # the queue answered its last call
    # set by the router: every finished item's bookkeeping, and the policy's cascade hand-off decision
    on_done: Callable[[str, dict], None] | None
    on_handoff: Callable[[str, WorkResult], tuple[WorkItem | None, WorkResult | None]] | None

    def expect(self, request_ids: Iterable[str]) -> list[asyncio.Future]: ...

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None: ...

    def forget(self, request_ids: Iterable[str]) -> None: ...

    async def wait(self, request_ids: list[str], timeout: float) -> list[WorkResult]: ...


class PromptClassifier(Protocol):
    """Prompt → optimal level id, batched (:class:`classifiers.level.BatchedClassifier`)."""

    def submit(self, prompt: str) -> Future: ...


class PromptSimilarity(Protocol):
    """The cache's similarity view (:class:`argusdiff.service.similarity.CacheSimilarity`): a
    prompt's similarity to its nearest cached prompt (None: nothing cached yet) and its embedding."""

    async def lookup(self, prompt: str) -> tuple[float | None, Any]: ...


class ControlQueue(WorkQueue, Protocol):
    """The work queue as the control loop uses it (``argusdiff.service.transport.memory.LocalWorkQueue``,
    ``argusdiff.service.transport.redis_streams.RedisWorkQueue``): depths, plus moving work off a dead worker
    or an unserved level."""

    def migrate(self, from_level: str, to_level: str, limit: int = 10_000) -> int: ...

    def pending_by_consumer(self, level_id: str) -> dict[str, int]: ...

    def requeue_consumer(self, level_id: str, consumer: str) -> int: ...

    def drop_consumer(self, level_id: str, consumer: str) -> None: ...


class ControlCacheHealth(Protocol):
    """The cache's health as the control loop reads it and its probes write it
    (:class:`argusdiff.service.health.CacheHealth`, or every router's combined:
    :class:`argusdiff.service.cluster.ClusterCacheHealth`)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def latency_limit_s(self) -> float: ...

    def median_latency_s(self) -> float | None: ...

    def error_rate(self) -> float: ...

    def record(self, latency_s: float | None, *, error: bool = False, hit: bool | None = None) -> None: ...

    def reset(self) -> None: ...


class ControlledRouter(Protocol):
    """Everything the control loop reads of the router and hands it
    (:class:`argusdiff.service.control.ControlLoop`): the router itself, or the leader's view of
    every router (:class:`argusdiff.service.cluster.ClusterRouterView`, which implements each member
    explicitly; a new observation is a member here and there, or the type check fails)."""

    @property
    def policy(self) -> Policy: ...

    @property
    def profile(self) -> Profile: ...

    @property
    def per_worker(self) -> bool: ...

    @property
    def tier_load(self) -> Mapping[tuple[str, int], int]: ...

    @property
    def cache_health(self) -> ControlCacheHealth: ...

    def take_period(self) -> PeriodStats: ...

    def peek_period(self) -> PeriodStats: ...

    def give_back(self, period: PeriodStats) -> None: ...

    def latency_scales(self) -> dict[str, float]: ...

    def view(
        self, now: float, plan: Plan, optimal: str | None, slo_s: float, similarity: float | None = None
    ) -> RouteView: ...

    def set_plan(self, plan: Plan, up: frozenset[str]) -> None: ...
