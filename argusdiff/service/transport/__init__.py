"""The transports between router, control loop and workers: work queues, result stores and the
control store (plan, heartbeats), in one process or over Redis.

* :mod:`~argusdiff.service.transport.protocol` — the protocols and the shared result wait;
* :mod:`~argusdiff.service.transport.memory` — embedded mode (threads, one process);
* :mod:`~argusdiff.service.transport.redis_streams` — the work queue on Redis Streams (one stream
  per level and SLO tier), results and step events;
* :mod:`~argusdiff.service.transport.redis_control` — the plan, the deployment and worker
  heartbeats in Redis.

Only the protocols are imported here, so importing the package never imports ``redis``.
"""

from argusdiff.service.transport.protocol import ControlStore, ResultStore, WorkQueue, summarize, wait_result

__all__ = ["ControlStore", "ResultStore", "WorkQueue", "summarize", "wait_result"]
