"""The live service: REST endpoint, router (data path), control loop (control path) and the
queues that carry work to workers, embedded in one process or distributed over Redis Streams.

Importing this package is cheap: Starlette, Redis and prometheus_client are imported by the
modules that need them, torch and diffusers only inside workers.
"""

from __future__ import annotations
