"""Latencies learned online: each level's measured batch time against its profile.

Workers report how long each batch ran (the service: a result's timings; the simulator: the batch
it ran). :class:`LatencyEstimator` keeps, per level, the last ``window`` ratios *measured /
profiled* (the profile's ``latency(b)`` for the batch's size) and estimates the level's speed as
their mean, clipped per sample to ``[1/CLIP, CLIP]`` so that one stalled batch cannot swing it.
With fewer than ``min_samples`` measurements the profile stands (the prior: ratio 1), and the
estimate moves towards the measurements as they come in (``min_samples`` of them count as much as
the prior). :meth:`scales` is the snapshot the control path hands the policy
(``ClusterStats.latency_scale``); a policy that plans with it (argus+) publishes it with the plan
(``Plan.latency_scale``), so its routing and admission judge deadlines with the same latencies.
Under several routers each measures the results that come back to it; every router's heartbeat
carries its windows (:meth:`LatencyEstimator.windows`: per level the sum and number of its ratios),
and the leader plans on the mean over all of them (:meth:`LatencyEstimator.scales` with ``peers``),
so the measured latencies are the cluster's as the tier mix and hit rate are.

A windowed mean, not a quantile: the plan sizes capacity, which follows the mean batch time, and
when part of a level's workers are slow the mean is the level's speed. Pure; no clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CLIP", "LatencyEstimator", "scaled_profile"]

#: a single measurement counts at most this many times slower (or faster) than the profile
CLIP = 5.0


@dataclass
class LatencyEstimator:
    """Per level, the mean of the last ``window`` measured/profiled ratios, with the profile as the
    prior (``min_samples`` pseudo-measurements at ratio 1)."""

    window: int = 32
    min_samples: int = 4
    _ratios: dict[str, deque] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_samples < 0:
            raise ValueError(f"window must be >= 1 and min_samples >= 0, got {self.window}, {self.min_samples}")

    def observe(self, level_id: str, measured_s: float, profiled_s: float) -> None:
        """One batch of ``level_id`` ran ``measured_s`` where the profile says ``profiled_s``."""
        if not (math.isfinite(measured_s) and math.isfinite(profiled_s)) or measured_s <= 0 or profiled_s <= 0:
            return
        ratio = min(CLIP, max(1.0 / CLIP, measured_s / profiled_s))
        q = self._ratios.get(level_id)
        if q is None:
            q = self._ratios[level_id] = deque(maxlen=self.window)
        q.append(ratio)

    def scale(self, level_id: str) -> float:
        """The level's estimated latency / profiled latency (1.0: as profiled, or not measured)."""
        q = self._ratios.get(level_id)
        if not q:
            return 1.0
        return (sum(q) + self.min_samples) / (len(q) + self.min_samples)

    def count(self, level_id: str) -> int:
        q = self._ratios.get(level_id)
        return len(q) if q else 0

    def windows(self) -> dict[str, tuple[float, int]]:
        """Per measured level, the sum of its window's ratios and their number: what another
        router pools with its own (:meth:`scales`' ``peers``)."""
        return {lv: (sum(q), len(q)) for lv, q in self._ratios.items() if q}

    def scales(self, peers: Iterable[Mapping[str, Sequence[float]]] = ()) -> dict[str, float]:
        """Every measured level's scale (levels never measured are as profiled and left out). With
        ``peers``, other routers' :meth:`windows`: the mean over this window's ratios and theirs,
        with the one prior (the cluster's estimate)."""
        pooled = {lv: [sum(q), len(q)] for lv, q in self._ratios.items() if q}
        for window in peers:
            for lv, (total, n) in window.items():
                if n > 0:
                    acc = pooled.setdefault(lv, [0.0, 0])
                    acc[0] += float(total)
                    acc[1] += int(n)
        return {lv: (total + self.min_samples) / (n + self.min_samples) for lv, (total, n) in pooled.items()}


def scaled_profile(profile, scale: Mapping[str, float]):
    """``profile`` with each level's batch latencies (and a peak throughput override) multiplied by
    its ``scale`` (levels without one unchanged): the profile a plan sizes capacity with."""
    import dataclasses

    if not scale or all(abs(scale.get(lv.id, 1.0) - 1.0) < 1e-9 for lv in profile.levels):
        return profile
    levels = []
    for lv in profile.levels:
        s = float(scale.get(lv.id, 1.0))
        if abs(s - 1.0) < 1e-9:
            levels.append(lv)
            continue
        peak = lv.peak_qpm_override / s if lv.peak_qpm_override is not None else None
        levels.append(
            dataclasses.replace(lv, latency_s={b: t * s for b, t in lv.latency_s.items()}, peak_qpm_override=peak)
        )
    return dataclasses.replace(profile, levels=tuple(levels))
