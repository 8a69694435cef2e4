"""Typed errors of the workers: each names what is wrong and what to do."""

from __future__ import annotations

from argusdiff.errors import ArgusdiffError, ConfigError

__all__ = [
    "LatentMismatch",
    "ModelLoadError",
    "UnknownModel",
    "UnsupportedScheduler",
    "WorkerError",
]


class WorkerError(ArgusdiffError):
    """A request could not be executed by a worker."""


class UnknownModel(WorkerError, ConfigError):
    """A level names a model the registry does not know."""


class ModelLoadError(WorkerError):
    """A registry model could not be loaded (missing files, offline hub, bad folder)."""


class UnsupportedScheduler(WorkerError, ConfigError):
    """Approximate caching was asked of a scheduler that cannot resume exactly from step K."""


class LatentMismatch(WorkerError):
    """A cached latent was made with another model, scheduler, N or shape than the level runs."""
