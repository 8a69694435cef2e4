"""The allocation model every formulation shares: the levels as plain tuples (:class:`LevelData`,
built by :func:`level_data`), the best loads for given worker counts (:func:`greedy_loads`), the
cost of moving workers between plans (:func:`switch_cost`) and the tolerance :data:`EPS`.

:mod:`solver.exact` (branch and bound) and :mod:`solver.allocate` (the MILP formulations and the
entry point) both build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from argusdiff.domain import ApproxLevel

__all__ = ["EPS", "LevelData", "greedy_loads", "level_data", "switch_cost"]

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class LevelData:
    """What the allocator needs of each level, in the caller's level order."""

    quality: tuple[float, ...]
    peak: tuple[float, ...]  # P_th(v), QPM per worker
    load_time: tuple[float, ...]
    model: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.quality)


def level_data(levels: Sequence[ApproxLevel]) -> LevelData:
    return LevelData(
        quality=tuple(float(lv.quality) for lv in levels),
        peak=tuple(float(lv.peak_qpm) for lv in levels),
        load_time=tuple(float(lv.load_time_s) for lv in levels),
        model=tuple(lv.model for lv in levels),
    )


def greedy_loads(data: LevelData, counts: Sequence[int], demand: float) -> tuple[list[float], float]:
    """Best loads for fixed counts: fill the best-quality levels first. Returns (loads, value)."""
    order = sorted(range(len(data)), key=lambda v: (-data.quality[v], -data.peak[v]))
    loads = [0.0] * len(data)
    rem = demand
    value = 0.0
    for v in order:
        if rem <= 0:
            break
        take = min(rem, counts[v] * data.peak[v])
        loads[v] = take
        value += take * data.quality[v]
        rem -= take
    return loads, value


def switch_cost(data: LevelData, counts: Sequence[int], current: Sequence[int]) -> tuple[float, int]:
    """(cost, moved) of moving from ``current`` to ``counts`` workers per level.

    ``moved`` is the number of workers that get a new level (each worker arriving at a level it
    was not running, including previously idle ones). ``cost`` is 1 per moved worker plus the
    model load time of each worker that must load a different model; a worker moving between
    levels of the same model (e.g. AC levels of one SD-XL) loads nothing. Workers are matched
    within a model first, which is the cheapest assignment for given counts.
    """
    moved = 0
    gain: dict[str, int] = {}
    lt: dict[str, float] = {}
    for v in range(len(data)):
        moved += max(0, counts[v] - current[v])
        m = data.model[v]
        gain[m] = gain.get(m, 0) + counts[v] - current[v]
        lt[m] = max(lt.get(m, 0.0), data.load_time[v])
    cost = float(moved) + sum(lt[m] * g for m, g in gain.items() if g > 0)
    return cost, moved
