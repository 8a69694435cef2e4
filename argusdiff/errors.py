"""Typed errors a user can act on. Each message says what is wrong and what to do."""

from __future__ import annotations


class ArgusdiffError(Exception):
    """Base of every error argusdiff raises on purpose."""


class ConfigError(ArgusdiffError, ValueError):
    """A configuration file, option or environment variable has a bad value."""


class ProfileError(ConfigError):
    """A profile file is missing or invalid; the message names the file, level and field."""
