"""argusdiff: a quality-aware router for text-to-image serving (ARGUS + DiffServe and beyond)."""

__version__ = "0.1.0"
