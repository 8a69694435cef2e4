"""Fault injection for the simulator: workers off for an interval, workers slower than their
profile for an interval, cache store down for an interval.

Spec grammar (``--faults``), items separated by ``;``:

* ``gpus:N@START+DURATION`` — N workers (the highest-numbered up ones) off from START for DURATION;
  ``N`` may be ``half``;
* ``cache@START+DURATION`` — the latent cache store is down (lookups fail after the timeout);
* ``slow:NxF@START+DURATION`` — N workers (the lowest-numbered; ``half`` allowed) run every batch
  that starts in the interval F times slower than the profile says (e.g. ``slow:halfx2@10m+10m``:
  thermal throttling, a noisy neighbour, a slower card than profiled);
* ``argus`` — ARGUS §5.6: half the workers off for 40 min twice (at 25% and 60% of the trace).

Times take a unit: ``s``, ``m`` or ``h`` (plain numbers are seconds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from argusdiff.errors import ConfigError

__all__ = ["Fault", "parse_duration", "parse_faults"]


@dataclass(frozen=True)
class Fault:
    kind: str  # "gpus" | "cache" | "slow"
    start_s: float
    duration_s: float
    count: int = 0  # workers off (kind "gpus") or slowed (kind "slow")
    factor: float = 1.0  # kind "slow": batch time multiplier

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str, *, option: str = "--faults") -> float:
    m = _DUR.match(str(text))
    if not m:
        raise ConfigError(f"{option}: bad duration {text!r} (use e.g. 90s, 40m, 2h)")
    value = float(m.group(1))
    unit = m.group(2) or "s"
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[unit]


def parse_faults(spec: str | None, *, gpus: int, duration_s: float, option: str = "--faults") -> list[Fault]:
    """Faults from a spec string (see module doc); ``duration_s`` is the trace length."""
    if not spec:
        return []
    faults: list[Fault] = []
    for raw in spec.split(";"):
        item = raw.strip()
        if not item:
            continue
        if item == "argus":
            half = max(1, gpus // 2)
            for frac in (0.25, 0.60):
                faults.append(Fault("gpus", round(duration_s * frac / 60.0) * 60.0, 2400.0, half))
            continue
        head, sep, when = item.partition("@")
        if not sep or "+" not in when:
            raise ConfigError(
                f"{option}: bad fault {item!r}; expected gpus:N@START+DURATION, slow:NxF@START+DURATION "
                "or cache@START+DURATION"
            )
        start_txt, _, dur_txt = when.partition("+")
        start = parse_duration(start_txt, option=option)
        dur = parse_duration(dur_txt, option=option)
        if dur <= 0:
            raise ConfigError(f"{option}: fault {item!r} has a non-positive duration")
        if head == "cache":
            faults.append(Fault("cache", start, dur))
        elif head.startswith("slow:"):
            n_txt, x, f_txt = head[5:].partition("x")
            try:
                factor = float(f_txt) if x else math.nan
            except ValueError:
                factor = math.nan
            if not (math.isfinite(factor) and factor > 0):
                raise ConfigError(f"{option}: fault {item!r}: expected slow:NxF with a factor F > 0, e.g. slow:halfx2")
            n = _count(n_txt, gpus, item, option)
            faults.append(Fault("slow", start, dur, n, factor))
        elif head.startswith("gpus:"):
            faults.append(Fault("gpus", start, dur, _count(head[5:], gpus, item, option)))
        else:
            raise ConfigError(
                f"{option}: unknown fault kind {head!r} in {item!r} (use gpus:N, slow:NxF, cache or argus)"
            )
    return faults


def _count(n_txt: str, gpus: int, item: str, option: str) -> int:
    if n_txt == "half":
        return max(1, gpus // 2)
    try:
        n = int(n_txt)
    except ValueError:
        raise ConfigError(f"{option}: fault {item!r}: worker count {n_txt!r} is not an integer") from None
    if not 1 <= n <= gpus:
        raise ConfigError(f"{option}: fault {item!r}: worker count must be 1..{gpus}, got {n}")
    return n
