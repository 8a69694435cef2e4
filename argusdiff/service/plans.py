"""Plans as JSON (published to Redis and served at ``GET /v1/plan``)."""

from __future__ import annotations

from typing import Any

from argusdiff.domain import Plan, Strategy

__all__ = ["plan_from_dict", "plan_to_dict"]


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "version": plan.version,
        "created_s": plan.created_s,
        "strategy": plan.strategy.value,
        "levels": list(plan.levels),
        "assignment": dict(plan.assignment),
        "counts": dict(zip(plan.levels, plan.counts(), strict=True)),
        "share": list(plan.share),
        "pasm": [list(row) for row in plan.pasm],
        "predicted_qpm": plan.predicted_qpm,
        "expected_quality": plan.expected_quality,
        "saturated": plan.saturated,
        "shortfall_qpm": plan.shortfall_qpm,
        "moved_workers": plan.moved_workers,
        "thresholds": dict(plan.thresholds),
        "batch_sizes": dict(plan.batch_sizes),
        "margin": plan.margin,
        "policy": plan.policy,
        "notes": list(plan.notes),
        "preload": {w: list(lvs) for w, lvs in plan.preload.items()},
        "tier_pasm": {t: [list(row) for row in rows] for t, rows in plan.tier_pasm.items()},
        "cascades": dict(plan.cascades),
        "reserved": dict(plan.reserved),
        "latency_scale": dict(plan.latency_scale),
    }


def plan_from_dict(data: dict[str, Any]) -> Plan:
    return Plan(
        version=int(data["version"]),
        created_s=float(data["created_s"]),
        strategy=Strategy(data["strategy"]),
        levels=tuple(data["levels"]),
        assignment={str(k): v for k, v in data["assignment"].items()},
        share=tuple(float(x) for x in data["share"]),
        pasm=tuple(tuple(float(x) for x in row) for row in data["pasm"]),
        predicted_qpm=float(data["predicted_qpm"]),
        expected_quality=float(data["expected_quality"]),
        saturated=bool(data.get("saturated", False)),
        shortfall_qpm=float(data.get("shortfall_qpm", 0.0)),
        moved_workers=int(data.get("moved_workers", 0)),
        thresholds={str(k): float(v) for k, v in (data.get("thresholds") or {}).items()},
        batch_sizes={str(k): int(v) for k, v in (data.get("batch_sizes") or {}).items()},
        margin=float(data.get("margin", 1.0)),
        policy=str(data.get("policy", "")),
        notes=tuple(data.get("notes") or ()),
        preload={str(w): tuple(lvs) for w, lvs in (data.get("preload") or {}).items()},
        tier_pasm={
            str(t): tuple(tuple(float(x) for x in row) for row in rows)
            for t, rows in (data.get("tier_pasm") or {}).items()
        },
        cascades={str(k): str(v) for k, v in (data.get("cascades") or {}).items()},
        reserved={str(k): str(v) for k, v in (data.get("reserved") or {}).items()},
        latency_scale={str(k): float(v) for k, v in (data.get("latency_scale") or {}).items()},
    )
