"""Test fixtures for the cache area (a pytest plugin module loaded by conftest.py)."""

from __future__ import annotations
