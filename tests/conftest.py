"""Shared test fixtures. Area fixtures live in ``tests/fixtures_*.py`` plugin modules."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["fixtures_cache", "fixtures_workers", "fixtures_service"]

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout (third-party data); tests using it skip without it."""
    if not (SHARED / "data").is_dir():
        pytest.skip("../shared/data is not beside this checkout (third-party data is not vendored)")
    return SHARED


# The shipped profiles the policy and simulator tests run on (frozen values: safe to share).
@pytest.fixture(scope="session")
def ac():
    from argusdiff.profile import load_profile

    return load_profile("sdxl-ac-a100")


@pytest.fixture(scope="session")
def sm():
    from argusdiff.profile import load_profile

    return load_profile("sm-a100")


@pytest.fixture(scope="session")
def cascade():
    from argusdiff.profile import load_profile

    return load_profile("cascade-sdxlltn-sdxl")


@pytest.fixture(scope="session")
def profiles(ac, sm, cascade):
    return {"ac": ac, "sm": sm, "cascade": cascade}
