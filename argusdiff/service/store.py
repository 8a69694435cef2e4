"""The control store's protocol and embedded implementation under the name the control loop imports.

:class:`ControlStore` is defined in :mod:`argusdiff.service.transport.protocol`,
:class:`LocalControlStore` in :mod:`argusdiff.service.transport.memory` and the Redis one,
``RedisControlStore``, in :mod:`argusdiff.service.transport.redis_control`.
"""

from __future__ import annotations

from argusdiff.service.transport.memory import LocalControlStore
from argusdiff.service.transport.protocol import ControlStore

__all__ = ["ControlStore", "LocalControlStore"]
