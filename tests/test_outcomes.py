"""Decisions as values: an :class:`~argusdiff.domain.Assignment` carries its outcome and its cause
as enums, consistent with its level and refusal, and no code compares the words of a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from argusdiff.domain import Assignment, ClusterStats, Outcome, PlanTrigger, Refusal, RouteReason

ROOT = Path(__file__).resolve().parent.parent


def test_an_outcome_agrees_with_its_level_and_refusal():
    assert Assignment(level="a").outcome is Outcome.SERVED and Assignment(level="a").taken
    assert not Assignment(level=None, outcome=Outcome.KEPT).taken
    dropped = Assignment(level=None, refusal=Refusal.POLICY, outcome=Outcome.DROPPED)
    assert dropped.dropped and not dropped.taken
    with pytest.raises(ValueError):
        Assignment(level=None)  # not taken, yet served
    with pytest.raises(ValueError):
        Assignment(level="a", refusal=Refusal.POLICY, outcome=Outcome.DROPPED)  # dropped, yet a level
    with pytest.raises(ValueError):
        Assignment(level=None, outcome=Outcome.REFUSED)  # refused without a refusal
    with pytest.raises(ValueError):
        Assignment(level="a", outcome=Outcome.KEPT)


def test_a_plan_trigger_is_a_value_even_when_named():
    stats = ClusterStats(now_s=0.0, period_s=1.0, arrivals=0, workers=(), reason="loaded")
    assert stats.reason is PlanTrigger.LOADED
    assert ClusterStats(now_s=0.0, period_s=1.0, arrivals=0, workers=()).reason is PlanTrigger.PERIOD


def _sources() -> list[Path]:
    return sorted((ROOT / "argusdiff").rglob("*.py"))


# comparisons of a reason's words: ``x.reason == "..."``, ``"..." in x.reason``, ``x.reason in (...)``,
# ``reason.startswith(...)``
_COMPARE = re.compile(
    r"reason\s*[!=]=\s*[\"']|\.reason\s+(not\s+)?in\b|[\"'][^\"'\n]*[\"']\s+(not\s+)?in\s+[\w.]*reason\b"
    r"|reason\.(startswith|endswith)\("
)


def test_no_code_compares_the_words_of_a_reason():
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _COMPARE.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_every_reason_in_words_has_its_cause_as_a_value():
    """An ``Assignment(...)`` that gives ``reason=`` words gives a ``cause=`` too (explanations and
    the routed metric read the cause)."""
    missing = []
    for p in _sources():
        text = p.read_text()
        for m in re.finditer(r"\bAssignment\(", text):
            depth, k = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[k], 0)
                k += 1
            call = text[m.start() : k]
            if "reason=" in call and "cause=" not in call:
                missing.append(f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not missing, missing


def test_route_reasons_and_outcomes_name_the_metric_labels():
    """The values are the labels of ``argusdiff_routed_total`` that docs/operations.md lists."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `argusdiff_routed_total`"))
    for value in [*Outcome, *RouteReason]:
        assert f"`{value.value}`" in row, value
