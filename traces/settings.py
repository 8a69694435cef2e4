"""The one place the trace tools read their configuration: ``[traces]`` as
:func:`argusdiff.config.load_settings` reads it (the TOML file and ``ARGUSDIFF_TRACES__*``).

The prompt set (``prompts``), the prompt order of generated traces (``prompt_order``) and the
prompt encoder (``embedding_model``, ``embedding_cache_dir``, ``embedding_batch_size``) default to
it; each reads it afresh, so a changed environment variable counts at the next call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from argusdiff.config import TracesConfig

__all__ = ["traces_settings"]


def traces_settings() -> TracesConfig:
    """``[traces]`` of the configuration (a :class:`~argusdiff.errors.ConfigError` when the
    configuration is invalid)."""
    from argusdiff.config import load_settings

    return load_settings().traces
