"""Per-minute and whole-run metrics of a simulation (ARGUS §5 / DiffServe §4 definitions).

* offered load: arrivals per minute (QPM); throughput: completions per minute;
* SLO violation ratio: share of requests (by arrival minute) not served within *their own* SLO
  (per-request deadline, or the deployment SLO × the request's tier multiplier) — a dropped
  request counts as violated; ``summarize`` also splits it per tier;
* effective quality: mean quality of the requests served within the SLO; relative quality: the
  same over each prompt's quality at the best level of its profile;
* goodput: requests served within the SLO per minute;
* GPU utilization: busy worker-seconds over up worker-seconds (model loads are not busy time);
* model switches: model loads started (blocking and background preloads); level mix: share of served requests per level.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from argusdiff.simulator.engine import DROPPED, SERVED, SimResult

__all__ = ["minute_metrics", "summarize", "tier_breakdown"]


def tier_breakdown(res: SimResult, ok: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per tier: requests, within SLO, dropped, best effort, violation ratio, median SLO."""
    out: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(res.tier_names):
        sel = res.tier == k
        n = int(sel.sum())
        if n == 0:
            continue
        good = int(np.sum(ok & sel))
        out[name] = {
            "requests": n,
            "within_slo": good,
            "dropped": int(np.sum(sel & (res.status == DROPPED))),
            "best_effort": int(np.sum(sel & res.best_effort)),
            "slo_violation_ratio": 1.0 - good / n,
            "slo_s": float(np.median(res.req_slo_s[sel])),
        }
    return out


def _spread(intervals: list[tuple[int, float, float]] | list, minutes: int) -> np.ndarray:
    """Seconds of the given (worker, start, end) intervals falling in each minute."""
    out = np.zeros(minutes, dtype=np.float64)
    if not intervals:
        return out
    arr = np.asarray([(s, e) for _, s, e, *_ in intervals], dtype=np.float64)
    s, e = arr[:, 0], arr[:, 1]
    ms = np.floor(s / 60.0).astype(np.int64)
    me = np.floor(np.maximum(e - 1e-9, s) / 60.0).astype(np.int64)
    same = ms == me
    ok = same & (ms < minutes)
    np.add.at(out, ms[ok], (e - s)[ok])
    for a, b, m0, m1 in zip(s[~same], e[~same], ms[~same], me[~same], strict=True):
        for m in range(int(m0), min(int(m1), minutes - 1) + 1):
            lo, hi = max(a, m * 60.0), min(b, (m + 1) * 60.0)
            if hi > lo:
                out[m] += hi - lo
    return out


def minute_metrics(res: SimResult) -> dict[str, np.ndarray]:
    wl = res.workload
    arr = wl.arrivals_s
    minutes = max(1, math.ceil(max(res.end_s, float(arr[-1]) if len(arr) else 0.0) / 60.0 + 1e-9))
    served = res.status == SERVED
    latency = np.where(served, res.finish_s - arr, np.inf)
    ok = served & (latency <= res.req_slo_s + 1e-9)
    am = np.minimum((arr // 60).astype(np.int64), minutes - 1)
    offered = np.bincount(am, minlength=minutes).astype(np.float64)
    good = np.bincount(am[ok], minlength=minutes).astype(np.float64)
    dropped = np.bincount(am[res.status == DROPPED], minlength=minutes).astype(np.float64)
    fm = np.minimum((np.nan_to_num(res.finish_s[served], nan=0.0) // 60).astype(np.int64), minutes - 1)
    throughput = np.bincount(fm, minlength=minutes).astype(np.float64)
    qsum = np.bincount(am[ok], weights=res.quality[ok], minlength=minutes)
    rsum = np.bincount(am[ok], weights=res.relative[ok], minlength=minutes)
    hits = np.bincount(am[res.cache_hit], minlength=minutes).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        violation = np.where(offered > 0, 1.0 - good / offered, 0.0)
        eff_q = np.where(good > 0, qsum / good, np.nan)
        rel_q = np.where(good > 0, rsum / good, np.nan)
    busy = _spread(res.busy, minutes)
    up = _spread(res.up_intervals, minutes)
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(up > 0, np.minimum(busy / up, 1.0), 0.0)
    switches = np.zeros(minutes)
    for _, s, _, _ in res.loads:
        m = min(int(s // 60), minutes - 1)
        switches[m] += 1
    out: dict[str, np.ndarray] = {
        "minute": np.arange(minutes, dtype=np.int64),
        "offered_qpm": offered,
        "throughput_qpm": throughput,
        "goodput_qpm": good,
        "dropped": dropped,
        "slo_violation_ratio": violation,
        "effective_quality": eff_q,
        "relative_quality": rel_q,
        "gpu_utilization": util,
        "model_switches": switches,
        "cache_hits": hits,
    }
    lv = res.level
    for k, level_id in enumerate(res.level_ids):
        out[f"mix:{level_id}"] = np.bincount(am[served & (lv == k)], minlength=minutes).astype(np.float64)
    return out


def summarize(res: SimResult, minutes: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    m = minutes if minutes is not None else minute_metrics(res)
    wl = res.workload
    arr = wl.arrivals_s
    n = len(arr)
    served = res.status == SERVED
    latency = np.where(served, res.finish_s - arr, np.inf)
    ok = served & (latency <= res.req_slo_s + 1e-9)
    n_ok = int(ok.sum())
    lat_served = latency[served]
    mix = {lv: int(np.sum(served & (res.level == k))) for k, lv in enumerate(res.level_ids)}
    total_served = max(1, int(served.sum()))
    busy_s = float(sum(e - s for _, s, e in res.busy))
    up_s = float(sum(e - s for _, s, e in res.up_intervals))
    active = m["offered_qpm"] > 0
    return {
        "policy": res.policy,
        "profile": res.description.get("profile"),
        "delivery": res.description.get("delivery"),  # the policy's (argusdiff.domain.Delivery)
        "classifier": res.description.get("classifier", "none"),
        "requests": n,
        "served": int(served.sum()),
        "within_slo": n_ok,
        "dropped": int(np.sum(res.status == DROPPED)),
        "refused": int(res.refused.sum()) if res.refused is not None else 0,  # by admission (in dropped)
        # refused although they would have met their SLO queued at their level (the simulator's estimate)
        "false_refusals": int(res.false_refused.sum()) if res.false_refused is not None else 0,
        "best_effort": int(res.best_effort.sum()),
        "deferred": int(res.deferred.sum()),
        "slo_s": res.slo_s,
        "slo_violation_ratio": 1.0 - n_ok / n if n else 0.0,
        "effective_quality": float(res.quality[ok].mean()) if n_ok else float("nan"),
        "relative_quality": float(res.relative[ok].mean()) if n_ok else float("nan"),
        "goodput_qpm": float(m["goodput_qpm"][active].mean()) if active.any() else 0.0,
        "throughput_qpm": float(m["throughput_qpm"][active].mean()) if active.any() else 0.0,
        "offered_qpm": float(m["offered_qpm"][active].mean()) if active.any() else 0.0,
        "gpu_utilization": busy_s / up_s if up_s > 0 else 0.0,
        "model_switches": len(res.loads),
        "cache_hit_ratio": float(res.cache_hit[served].mean()) if served.any() else 0.0,
        # requests routed to an AC level with K > 0 (a cache lookup), those that missed and ran
        # at K = 0, and how many of the misses violated the SLO
        "cache_lookups": int(np.sum(served & (res.cache_hit | res.cache_miss))),
        "cache_misses": int(np.sum(served & res.cache_miss)),
        "miss_violations": int(np.sum(served & res.cache_miss & ~ok)),
        "latency_p50_s": float(np.median(lat_served)) if len(lat_served) else float("nan"),
        "latency_p99_s": float(np.quantile(lat_served, 0.99)) if len(lat_served) else float("nan"),
        "level_mix": {lv: c / total_served for lv, c in mix.items() if c},
        "tiers": tier_breakdown(res, ok),
        "slo_note": wl.slo_note,
        "plans": len(res.plans),
        "wall_s": res.wall_s,
        "quality_source": wl.quality_source,
        "similarity_source": wl.similarity_source,
    }
