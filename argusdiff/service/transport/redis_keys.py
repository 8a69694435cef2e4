"""The key layout of the Redis transport: :class:`RedisKeys` names every key of the work queues
(:mod:`argusdiff.service.transport.redis_streams`) and of the control store
(:mod:`argusdiff.service.transport.redis_control`), hash-tagged so a cluster shards by level."""

from __future__ import annotations

from argusdiff.domain import TIER_PRIORITY, Tier, tier_rank
from argusdiff.service.transport.redis_client import control_prefix
from workers.messages import WorkItem
from workers.queue import WORKER_META

__all__ = ["RedisKeys"]


class RedisKeys:
    """Every key of a namespace: the work queue's, the results' and the control store's.

    Hash tags (a Redis Cluster puts keys with one tag in one slot): every control key starts with
    the namespace as a tag, ``{ns}:`` (:func:`~argusdiff.service.transport.redis_client.control_prefix`),
    and a level's streams (with their enqueue markers and re-queue fence) with a tag of the level's
    own, ``{ns:q:<level>}``, so a cluster shards the work by level and every atomic step touches one
    slot. ``namespace`` is the plain name (``[service] namespace``) or its tagged prefix."""

    def __init__(self, namespace: str = "argusdiff") -> None:
        self.name = namespace[1:-1] if namespace.startswith("{") and namespace.endswith("}") else namespace
        ns = self.ns = control_prefix(self.name)
        self.group = f"{self.name}:workers"  # the consumer group of every stream (a name, not a key)
        self.done = f"{ns}:done"
        self.plan = f"{ns}:plan"
        self.plan_channel = f"{ns}:plan-changed"
        self.workers = f"{ns}:workers"
        self.deployment = f"{ns}:deployment"
        self.events = f"{ns}:events"  # workers that name no router's channel publish here
        # many routers (argusdiff.service.leader): the lease, its fencing tokens, the plan's version,
        # the policy state published with it and the log of plan writes
        self.leader = f"{ns}:leader"
        self.leader_epoch = f"{ns}:leader:epoch"
        self.plan_version = f"{ns}:plan:version"
        self.plan_state = f"{ns}:plan:state"
        self.plan_log = f"{ns}:plan:log"
        # what a worker reads of a plan: its own entry (``plan:assign``, worker -> level JSON) and
        # the plan without the assignment (``plan:view``, see :func:`worker_view`)
        self.plan_assign = f"{ns}:plan:assign"
        self.plan_view = f"{ns}:plan:view"
        self.workers_beat = f"{ns}:workers:beat"  # worker id -> heartbeat expiry (ZSET)

    def quota(self, tenant: str, limit: str) -> str:
        """A tenant's rate-limit bucket or concurrent slots (:mod:`argusdiff.service.quotas`);
        ``tenant`` is a hash of its API key."""
        return f"{self.ns}:quota:{tenant}:{limit}"

    def cancel(self, request_id: str) -> str:
        """Set by a router that cancels ``request_id`` (``DELETE`` or a client gone); a worker skips
        the item when it takes it and stops a running batch whose requests all have one."""
        return f"{self.ns}:cancel:{request_id}"

    def handoff(self, request_id: str) -> str:
        """Set (NX) by the one router that decides a cascade hand-off of ``request_id``."""
        return f"{self.ns}:handoff:{request_id}"

    def level_tag(self, level_id: str) -> str:
        """The hash tag of ``level_id``'s keys: its streams, enqueue markers and re-queue fence."""
        return "{" + f"{self.name}:q:{level_id}" + "}"

    def stream(self, level_id: str, tier: str | None = None, worker: str | None = None) -> str:
        """The stream of ``level_id``'s work of ``tier`` (``standard``, no tier or an unknown one:
        the level's plain stream, so untiered traffic uses one stream per level); with ``worker``,
        that worker's own stream of it (delivery ``PER_WORKER``), in the level's slot."""
        name = TIER_PRIORITY[tier_rank(tier)]
        base = self.level_tag(level_id) if worker is None else f"{self.level_tag(level_id)}:w:{worker}"
        if name == Tier.STANDARD.value:
            return base
        return f"{base}@{name}"

    def enqueued(self, level_id: str, generation_id: str) -> str:
        """Cluster mode: set when a request's items were queued at ``level_id`` (a retried enqueue
        queues them once)."""
        return f"{self.level_tag(level_id)}:enq:{generation_id}"

    def owners(self, level_id: str) -> str:
        """The workers that have their own streams of ``level_id`` (a set, in the level's slot): a
        router adds the worker before it queues there, the control loop sweeps them."""
        return f"{self.level_tag(level_id)}:owners"

    def fence(self, level_id: str) -> str:
        """Cluster mode: the highest leader token that re-queued at ``level_id``."""
        return f"{self.level_tag(level_id)}:fence"

    def streams(self, level_id: str, worker: str | None = None) -> tuple[str, ...]:
        """Every stream of ``level_id`` (with ``worker``: that worker's own), in pull order
        (highest-priority tier first)."""
        return tuple(self.stream(level_id, tier, worker) for tier in TIER_PRIORITY)

    def item_stream(self, item: WorkItem) -> str:
        """The stream an item is queued on: its level's, of its tier, its worker's own when it
        names one (``meta["worker"]``)."""
        return self.stream(item.level, item.tier, item.meta.get(WORKER_META) or None)

    def result(self, request_id: str) -> str:
        return f"{self.ns}:result:{request_id}"

    def events_of(self, router: str) -> str:
        """The step-event channel of one router: a worker publishes a streamed item's events on the
        channel of the router that accepted it (``meta["events"]``), so no router receives the
        events of every stream."""
        return f"{self.ns}:events:{router}"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.ns}:hb:{worker_id}"

    def request(self, request_id: str) -> str:
        return f"{self.ns}:req:{request_id}"
