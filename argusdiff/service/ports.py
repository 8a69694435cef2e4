"""What the router and the control loop need of their collaborators, as typing protocols (no
behaviour): the dispatch that carries work items and results, the prompt classifier, the cache's
similarity view and the work queue as the control loop sees it. The implementations satisfy them
structurally; this module imports nothing of the service, so any module may name them without
forming an import cycle (``argusdiff.service.dispatch`` itself imports the router through
``argusdiff.service.idempotency``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Protocol

from workers.messages import WorkItem, WorkResult
from workers.queue import WorkQueue

__all__ = ["ControlQueue", "PromptClassifier", "PromptSimilarity", "RouterDispatch"]


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
