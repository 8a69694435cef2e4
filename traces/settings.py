"""The one place the trace tools read their configuration (``[traces]``): from the source the
application installs with :func:`use_source`, else :data:`DEFAULTS`.

:mod:`argusdiff.config` installs ``load_settings().traces`` (the TOML file and
``ARGUSDIFF_TRACES__*``) when it is imported, so ``traces/`` reads the configuration without
importing it. The prompt set (``prompts``), the prompt order of generated traces
(``prompt_order``) and the prompt encoder (``embedding_model``, ``embedding_cache_dir``,
``embedding_batch_size``) default to it; each call asks the source afresh, so a changed
environment variable counts at the next call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DEFAULTS", "TracesDefaults", "TracesSettings", "traces_settings", "use_source"]


class TracesSettings(Protocol):
    """What the trace tools read of ``[traces]``."""

    @property
    def prompts(self) -> str: ...
    @property
    def prompt_order(self) -> str: ...
    @property
    def embedding_model(self) -> str | None: ...
    @property
    def embedding_cache_dir(self) -> str | None: ...
    @property
    def embedding_batch_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TracesDefaults:
    """The defaults of ``[traces]`` that the trace tools read (``argusdiff.config.TracesConfig``
    takes its defaults from these)."""

    prompts: str = "diffusiondb"
    prompt_order: str = "sequential"
    embedding_model: str | None = None
    embedding_cache_dir: str | None = None
    embedding_batch_size: int = 64


DEFAULTS = TracesDefaults()

_source: Callable[[], TracesSettings] | None = None


def use_source(source: Callable[[], TracesSettings] | None) -> None:
    """Read ``[traces]`` from ``source`` from now on (None: :data:`DEFAULTS`)."""
    global _source
    _source = source


def traces_settings() -> TracesSettings:
    """``[traces]`` from the installed source (which may raise
    :class:`~argusdiff.errors.ConfigError` when the configuration is invalid), else
    :data:`DEFAULTS`."""
    return DEFAULTS if _source is None else _source()
