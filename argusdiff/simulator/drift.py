"""ARGUS §4.1 drift retraining in the replay: the live loop's rule (:mod:`argusdiff.service.drift`)
over the simulated served-quality stream.

The served requests are taken in the order they finish, as the live dispatch sees their images;
each is sampled with probability ``sample`` (the live ``[classifier] drift_sample``; where that is
0, the live loop being off, 0.1: the rate docs/classifiers.md suggests for the live loop) and its
quality (the quality table's score of its prompt at the level that served it) feeds the same
:class:`classifiers.drift.DriftTrigger` as the live loop, which also collects its prompt. A
flagged window with ``min_samples`` distinct prompts collected since the last retrain counts one
retrain and resets the monitor, as a swapped-in classifier does live.

What is modelled is *when* the loop retrains (its count, the windows, their medians), not what a
retrained model would change: the replay's classifier is the oracle stand-in with a fixed
confusion (or a trained model read once), so routing after a retrain is routing before it. ARGUS
reports ~7 retrains over its 800-minute trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DriftReplay", "DriftSettings", "replay_drift"]


@dataclass(frozen=True)
class DriftSettings:
    """The ``[classifier] drift_*`` knobs the replay applies."""

    window: int = 500
    history: int = 5
    tolerance: float = 0.02
    min_samples: int = 500
    sample: float = 0.1

    @classmethod
    def from_config(cls, c: Any, *, sample: float | None = None) -> DriftSettings:
        return cls(
            window=c.drift_window,
            history=c.drift_history,
            tolerance=c.drift_tolerance,
            min_samples=c.drift_min_samples,
            sample=(c.drift_sample or cls.sample) if sample is None else sample,
        )


@dataclass(frozen=True)
class DriftReplay:
    retrains: int
    windows: int
    events: int  # windows flagged as drifted (a flag without enough prompts waits)
    scored: int
    retrain_at_min: tuple[float, ...]  # trace minutes of the retrains
    window_medians: tuple[float, ...] = field(repr=False)
    settings: DriftSettings = field(default_factory=DriftSettings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "retrains": self.retrains,
            "windows": self.windows,
            "events": self.events,
            "scored": self.scored,
            "retrain_at_min": [round(m, 1) for m in self.retrain_at_min],
            "window": self.settings.window,
            "history": self.settings.history,
            "tolerance": self.settings.tolerance,
            "min_samples": self.settings.min_samples,
            "sample": self.settings.sample,
        }


def replay_drift(res: Any, settings: DriftSettings | None = None, *, seed: int = 0) -> DriftReplay:
    """The drift loop over a :class:`~argusdiff.simulator.engine.SimResult`'s served requests."""
    from argusdiff.simulator.engine import SERVED
    from classifiers.drift import DriftMonitor, DriftTrigger

    s = settings or DriftSettings()
    trigger = DriftTrigger(
        DriftMonitor(window=s.window, history=s.history, tolerance=s.tolerance, min_history=min(2, s.history)),
        s.min_samples,
    )
    served = np.flatnonzero(res.status == SERVED)
    order = served[np.argsort(res.finish_s[served], kind="stable")]
    if s.sample < 1.0:
        keep = np.random.default_rng([seed, 7]).random(len(order)) < s.sample
        order = order[keep]
    prompts = res.workload.prompt_idx
    medians: list[float] = []
    at: list[float] = []
    for i in order:
        before = trigger.monitor.windows
        trigger.add(float(res.quality[i]), int(prompts[i]))
        if trigger.monitor.windows != before and trigger.last_window is not None:
            medians.append(trigger.last_window)
        if trigger.due():
            trigger.retrained()
            at.append(float(res.finish_s[i]) / 60.0)
    return DriftReplay(
        retrains=trigger.retrains,
        windows=trigger.monitor.windows,
        events=trigger.events,
        scored=len(order),
        retrain_at_min=tuple(at),
        window_medians=tuple(medians),
        settings=s,
    )
