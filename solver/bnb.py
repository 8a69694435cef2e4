"""A small LP kept warm between solves, for branch and bound over a few integer columns.

The unified planner (:mod:`solver.unified`) solves many LPs that differ from each other only in
some column bounds and a few added columns: the nodes of a branch and bound over the worker
counts and the cascade thresholds. Rebuilding a HiGHS model for each costs ~2 ms (build and
presolve); changing the model in place and re-running the dual simplex from the last basis costs
~0.2 ms on the planner's few hundred columns. :class:`WarmLP` is that model.

Raw HiGHS errors never leave this module: :meth:`WarmLP.solve` returns a status string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.backends import _highspy, highs_lp

__all__ = ["LPResult", "WarmLP"]


@dataclass(frozen=True, slots=True)
class LPResult:
    status: str  # "optimal", "infeasible" or "error"
    x: np.ndarray | None
    objective: float
    row_dual: np.ndarray | None = None  # y: a column's reduced cost is c - Aᵀy (for "max", > 0 improves)

    @property
    def ok(self) -> bool:
        return self.status == "optimal" and self.x is not None


class WarmLP:
    """One HiGHS LP (no integrality) whose column bounds change, and which gains columns, between
    solves.

    ``sense`` is "max" or "min"; ``A`` any scipy-convertible matrix. Every solve starts from the
    basis the previous one left (HiGHS keeps it across in-place changes).
    """

    def __init__(
        self,
        c: np.ndarray,
        A,
        row_lo: np.ndarray,
        row_hi: np.ndarray,
        col_lo: np.ndarray,
        col_hi: np.ndarray,
        *,
        sense: str = "max",
    ) -> None:
        hs = _highspy()
        self._hs = hs
        lp = highs_lp(c, A, row_lo, row_hi, col_lo, col_hi, sense)
        self.n_cols = lp.num_col_
        h = hs.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        # presolve would be redone on every in-place change; the model is small and well scaled
        h.setOptionValue("presolve", "off")
        h.passModel(lp)
        self._h = h
        self.solves = 0

    def set_col_bounds(self, cols: Sequence[int], lo: Sequence[float], hi: Sequence[float]) -> None:
        idx = np.asarray(cols, dtype=np.int32)
        if len(idx):
            self._h.changeColsBounds(len(idx), idx, np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))

    def add_cols(self, costs, lo, hi, starts, index, value) -> None:
        """Append columns (compressed by column: ``starts`` into ``index``/``value`` row entries);
        they enter nonbasic, so the basis stays valid."""
        n = len(costs)
        self._h.addCols(
            n,
            np.asarray(costs, dtype=np.float64),
            np.asarray(lo, dtype=np.float64),
            np.asarray(hi, dtype=np.float64),
            len(index),
            np.asarray(starts, dtype=np.int32),
            np.asarray(index, dtype=np.int32),
            np.asarray(value, dtype=np.float64),
        )
        self.n_cols += n

    def solve(self, *, duals: bool = False) -> LPResult:
        self.solves += 1
        h = self._h
        try:
            h.run()
            status = h.getModelStatus()
        except Exception as exc:  # pragma: no cover - defensive: never surface raw solver errors
            return LPResult(f"error: {exc}", None, float("nan"))
        S = self._hs.HighsModelStatus
        if status == S.kOptimal:
            sol = h.getSolution()
            x = np.asarray(sol.col_value, dtype=np.float64)
            rd = np.asarray(sol.row_dual, dtype=np.float64) if duals else None
            return LPResult("optimal", x, float(h.getInfo().objective_function_value), rd)
        if status in (S.kInfeasible, S.kUnboundedOrInfeasible):
            return LPResult("infeasible", None, float("nan"))
        return LPResult(f"error: {h.modelStatusToString(status)}", None, float("nan"))
