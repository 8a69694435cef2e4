"""MILP/LP backends: HiGHS (via highspy, always available) and gurobipy (when installed and the
model fits its licence).

A problem is given in matrix form::

    optimise  c @ x          (sense "max" or "min")
    s.t.      row_lo <= A @ x <= row_hi
              col_lo <=   x   <= col_hi
              x[j] integer where integrality[j]

``backend="auto"`` uses gurobipy when it is importable and licensed, else HiGHS. The bundled
gurobipy licence refuses models over 2000 variables or 2000 constraints (GurobiError 10010): such
a solve falls back to HiGHS and the fallback is logged once per process. Raw solver errors never
leave this module: callers get a :class:`SolveResult` whose ``status`` says what happened.

highspy and gurobipy are imported lazily, on the first solve (or :func:`preload`).

Every solve is deterministic: one thread on either backend, and besides the caller's wall-clock
``time_limit_s`` a limit counted in the solver's own work (:data:`GUROBI_WORK_LIMIT`,
:data:`HIGHS_NODE_LIMIT`), which stops a solve at the same point on any machine and under any load.
A replay, whose plans must be a pure function of its inputs, solves with no wall-clock limit
(``argusdiff.replay.runs``) and stops at these alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from argusdiff.errors import ConfigError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "highs", "gurobi")
GUROBI_SIZE_LIMIT_ERROR = 10010

Status = Literal["optimal", "infeasible", "time_limit", "error"]  # "time_limit": any limit (wall clock or work)

#: Gurobi's deterministic work limit per solve (``WorkLimit``, in Gurobi's work units: "roughly one
#: second" of a typical machine's work, the same on every machine and load; with ``Threads = 1`` the
#: solve is deterministic). 5 units, the budget of the 5 s wall-clock default; the largest solve of
#: argus+'s replay measured 0.42 units (13 nodes, 1073 columns: the tiered bursty trace of
#: tests/test_replay_determinism.py stretched to 60 minutes), so the limit does not bind there.
GUROBI_WORK_LIMIT = 5.0
#: HiGHS's deterministic branch-and-bound node limit per solve (``mip_max_nodes``; HiGHS has no work
#: measure). The largest MILP of that replay on HiGHS took 11 nodes (and up to 1.6 s on a loaded
#: 2-core machine: the 5 s wall-clock limit was within 3x of binding); 10,000 leaves room for
#: instances a hundred times harder while stopping a runaway search at the same node everywhere.
HIGHS_NODE_LIMIT = 10_000
#: Gurobi's largest parameter value (GRB.INFINITY): a wall-clock limit of ``math.inf`` is passed as it
_GUROBI_INFINITY = 1e100

_lock = threading.Lock()
_state: dict[str, object] = {"gurobi": None, "gurobi_env": None, "fallback_logged": False, "highs": None}


@dataclass(frozen=True, slots=True)
class SolveResult:
    status: Status
    x: np.ndarray | None
    objective: float | None
    backend: str  # "highs" or "gurobi": the backend that produced the answer
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "time_limit") and self.x is not None


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ConfigError(f"solver backend: unknown value {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def _highspy():
    mod = _state["highs"]
    if mod is None:
        with _lock:
            if _state["highs"] is None:
                import highspy

                _quiet_first_highs(highspy)
                _state["highs"] = highspy
            mod = _state["highs"]
    return mod


def _quiet_first_highs(highspy) -> None:
    """Build one ``Highs`` with file descriptor 1 pointed at /dev/null: HiGHS prints its banner
    from C++ on the first construction in a process, before ``output_flag`` can be set, and it
    would land in the middle of a command's output (``argusdiff plan --json``)."""
    import os
    import sys

    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no usable stdout: nothing to protect
        highspy.Highs()
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def gurobi_available() -> bool:
    """True when gurobipy imports and a (possibly size-limited) licence gives an environment."""
    with _lock:
        if _state["gurobi"] is None:
            try:
                import gurobipy

                env = gurobipy.Env(empty=True)
                env.setParam("OutputFlag", 0)
                env.start()
                _state["gurobi"] = gurobipy
                _state["gurobi_env"] = env
            except Exception as exc:  # not installed, or no licence at all
                log.info("gurobipy unavailable (%s); using HiGHS", exc)
                _state["gurobi"] = False
        return _state["gurobi"] is not False


def preload() -> None:
    """Import and warm the backends (a tiny solve each) so the first control period is not slow."""
    c = np.array([1.0, 1.0])
    a = np.array([[1.0, 2.0]])
    for name in ("highs", "gurobi"):
        if name == "gurobi" and not gurobi_available():
            continue
        solve_milp(
            c,
            a,
            np.array([-np.inf]),
            np.array([4.0]),
            np.zeros(2),
            np.array([4.0, 4.0]),
            np.array([True, False]),
            sense="max",
            backend=name,
        )


def _log_fallback(reason: str) -> None:
    with _lock:
        if not _state["fallback_logged"]:
            _state["fallback_logged"] = True
            log.warning(
                "gurobipy cannot solve this model (%s); falling back to HiGHS (logged once per process)", reason
            )


def solve_milp(
    c: np.ndarray,
    A,
    row_lo: np.ndarray,
    row_hi: np.ndarray,
    col_lo: np.ndarray,
    col_hi: np.ndarray,
    integrality: np.ndarray,
    *,
    sense: Literal["max", "min"] = "max",
    backend: str = "auto",
    time_limit_s: float = 5.0,
    presolve: bool = True,
    retry_without_presolve: bool = False,
    gurobi_params: Mapping[str, float] | None = None,
) -> SolveResult:
    """Solve one MILP (or LP when no column is integral) on the chosen backend.

    ``presolve=False`` turns HiGHS' presolve off (it can misjudge LPs whose data spans many
    orders of magnitude as infeasible); ``retry_without_presolve=True`` solves once more on HiGHS
    with presolve off when the first solve finds no solution (for problems known to be feasible).
    ``gurobi_params``: Gurobi parameters set on the model besides this module's (e.g. the unified
    plan's :data:`solver.unified_search.GUROBI_PARAMS`); HiGHS ignores them.
    """
    res = _solve_once(
        c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, backend, time_limit_s, presolve, gurobi_params
    )
    if not res.ok and retry_without_presolve and presolve:
        res = _solve_once(c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, "highs", time_limit_s, False)
    return res


def _solve_once(
    c,
    A,
    row_lo,
    row_hi,
    col_lo,
    col_hi,
    integrality,
    sense,
    backend: str,
    time_limit_s: float,
    presolve: bool,
    gurobi_params: Mapping[str, float] | None = None,
) -> SolveResult:
    check_backend(backend)
    if backend in ("auto", "gurobi") and gurobi_available():
        try:
            res = _solve_gurobi(c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, time_limit_s, gurobi_params)
        except Exception as exc:  # never surface raw solver errors; HiGHS answers instead
            _log_fallback(f"gurobipy failed: {exc!r}")
            res = None
        if res is not None:
            return res
    elif backend == "gurobi":
        _log_fallback("gurobipy is not installed or has no licence")
    try:
        return _solve_highs(c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, time_limit_s, presolve)
    except Exception as exc:  # never surface raw solver errors: the caller sees status "error"
        log.warning("HiGHS failed: %r", exc)
        return SolveResult("error", None, None, "highs", f"HiGHS failed: {exc}")


def _as_csc(A):
    from scipy import sparse

    return sparse.csc_matrix(A)


def highs_lp(c, A, row_lo, row_hi, col_lo, col_hi, sense: str):
    """A ``highspy.HighsLp`` of the matrix-form problem (see the module doc)."""
    hs = _highspy()
    m = _as_csc(A)
    lp = hs.HighsLp()
    lp.num_col_ = len(c)
    lp.num_row_ = m.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=np.float64)
    lp.col_lower_ = np.asarray(col_lo, dtype=np.float64)
    lp.col_upper_ = np.asarray(col_hi, dtype=np.float64)
    lp.row_lower_ = np.asarray(row_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(row_hi, dtype=np.float64)
    lp.a_matrix_.format_ = hs.MatrixFormat.kColwise
    lp.a_matrix_.start_ = m.indptr.astype(np.int32)
    lp.a_matrix_.index_ = m.indices.astype(np.int32)
    lp.a_matrix_.value_ = m.data.astype(np.float64)
    lp.sense_ = hs.ObjSense.kMaximize if sense == "max" else hs.ObjSense.kMinimize
    return lp


def _solve_highs(
    c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, time_limit_s, presolve: bool = True
) -> SolveResult:
    hs = _highspy()
    lp = highs_lp(c, A, row_lo, row_hi, col_lo, col_hi, sense)
    integ = np.asarray(integrality, dtype=bool)
    if integ.any():
        lp.integrality_ = [hs.HighsVarType.kInteger if v else hs.HighsVarType.kContinuous for v in integ]
    h = hs.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_max_nodes", HIGHS_NODE_LIMIT)
    h.setOptionValue("mip_rel_gap", 1e-9)
    if not presolve:
        h.setOptionValue("presolve", "off")
    try:
        h.passModel(lp)
        h.run()
    except Exception as exc:  # pragma: no cover - defensive: never surface raw solver errors
        return SolveResult("error", None, None, "highs", f"HiGHS failed: {exc}")
    status = h.getModelStatus()
    S = hs.HighsModelStatus
    if status == S.kOptimal:
        st: Status = "optimal"
    elif status in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return SolveResult("infeasible", None, None, "highs", h.modelStatusToString(status))
    elif status in (S.kTimeLimit, S.kSolutionLimit, S.kIterationLimit):  # kSolutionLimit: mip_max_nodes
        st = "time_limit"
    else:
        return SolveResult("error", None, None, "highs", h.modelStatusToString(status))
    sol = h.getSolution()
    if not sol.value_valid:
        return SolveResult("time_limit" if st == "time_limit" else "error", None, None, "highs", "no solution")
    x = np.asarray(sol.col_value, dtype=np.float64)
    return SolveResult(st, x, float(h.getInfo().objective_function_value), "highs")


def _solve_gurobi(
    c, A, row_lo, row_hi, col_lo, col_hi, integrality, sense, time_limit_s, params: Mapping[str, float] | None = None
) -> SolveResult | None:
    gp = _state["gurobi"]
    env = _state["gurobi_env"]
    GRB = gp.GRB
    from scipy import sparse

    m = sparse.csr_matrix(A)
    try:
        model = gp.Model(env=env)
        model.Params.OutputFlag = 0
        model.Params.Threads = 1
        model.Params.TimeLimit = min(float(time_limit_s), _GUROBI_INFINITY)
        model.Params.WorkLimit = GUROBI_WORK_LIMIT
        model.Params.MIPGap = 1e-9
        for name, value in (params or {}).items():
            model.setParam(name, value)
        vtype = np.where(np.asarray(integrality, dtype=bool), GRB.INTEGER, GRB.CONTINUOUS)
        lo = np.where(np.isfinite(col_lo), col_lo, -GRB.INFINITY)
        hi = np.where(np.isfinite(col_hi), col_hi, GRB.INFINITY)
        x = model.addMVar(len(c), lb=lo, ub=hi, vtype=vtype)
        rlo = np.asarray(row_lo, dtype=np.float64)
        rhi = np.asarray(row_hi, dtype=np.float64)
        eq = np.isfinite(rlo) & np.isfinite(rhi) & (rlo == rhi)
        up = np.isfinite(rhi) & ~eq
        dn = np.isfinite(rlo) & ~eq
        # one call, the rows in the order of three (equalities, then <=, then >=: the same model)
        order = np.concatenate([np.flatnonzero(eq), np.flatnonzero(up), np.flatnonzero(dn)])
        if len(order):
            n_eq, n_up = int(eq.sum()), int(up.sum())
            senses = np.array(["="] * n_eq + ["<"] * n_up + [">"] * (len(order) - n_eq - n_up))
            model.addMConstr(m[order], x, senses, np.concatenate([rlo[eq], rhi[up], rlo[dn]]))
        model.setObjective(np.asarray(c, dtype=np.float64) @ x, GRB.MAXIMIZE if sense == "max" else GRB.MINIMIZE)
        model.optimize()
    except gp.GurobiError as exc:
        if getattr(exc, "errno", None) == GUROBI_SIZE_LIMIT_ERROR:
            _log_fallback(f"GurobiError {GUROBI_SIZE_LIMIT_ERROR}: model too large for the licence")
        else:
            _log_fallback(f"GurobiError {getattr(exc, 'errno', '?')}: {exc}")
        return None
    status = model.Status
    if status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
        return SolveResult("infeasible", None, None, "gurobi", "infeasible")
    limits = (GRB.TIME_LIMIT, GRB.WORK_LIMIT, GRB.NODE_LIMIT, GRB.ITERATION_LIMIT)
    if model.SolCount == 0:
        return SolveResult(
            "time_limit" if status in limits else "error", None, None, "gurobi", f"gurobi status {status}"
        )
    st: Status = "optimal" if status == GRB.OPTIMAL else "time_limit"
    return SolveResult(st, np.asarray(x.X, dtype=np.float64), float(model.ObjVal), "gurobi")
