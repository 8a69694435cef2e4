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


# --- The last lines of a run: the integration tests it skipped, and why ----------------------
# The README's test command runs on a bare machine too; without redis-server or ../shared it skips
# integration tests, and these lines, after pytest's own summary, say how many and why.

_INTEGRATION = {"run": 0, "skipped": {}}


def pytest_runtest_logreport(report):
    if "integration" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            _INTEGRATION["skipped"][reason] = _INTEGRATION["skipped"].get(reason, 0) + 1
        else:
            _INTEGRATION["run"] += 1


def integration_summary(run: int, skipped: dict[str, int]) -> list[str]:
    """The closing lines: integration tests run and skipped, grouped by reason."""
    total = sum(skipped.values())
    if not total:
        return [f"integration tests: {run} run, none skipped"] if run else []
    ci = "CI runs them all: .ci/run installs redis-server, prometheus and chromium first"
    lines = [f"integration tests: {run} run, {total} SKIPPED ({ci}):"]
    lines += [f"  {n:4d}  {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])]
    return lines


def pytest_unconfigure(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or getattr(config, "workerinput", None) is not None:
        return
    for line in integration_summary(_INTEGRATION["run"], _INTEGRATION["skipped"]):
        reporter.write_line(line, yellow="SKIPPED" in line)
