"""Errors of the classifiers package (all :class:`argusdiff.errors.ArgusdiffError`: CLI exit 2)."""

from __future__ import annotations

from argusdiff.errors import ArgusdiffError, ConfigError

__all__ = ["ClassifierInputError", "ModelFormatError", "ModelMismatchError", "TrainingDataError"]


class ModelFormatError(ArgusdiffError):
    """A saved model directory is missing, incomplete, or of an unknown format version."""


class ModelMismatchError(ArgusdiffError):
    """A saved model was trained for other levels (or another profile) than the ones it is used with."""


class ClassifierInputError(ArgusdiffError, ValueError):
    """An input to a classifier or scorer is unusable (e.g. an empty prompt when empty prompts are errors)."""


class TrainingDataError(ConfigError):
    """Training data is unusable (too few prompts, one class only, unreadable images...)."""
