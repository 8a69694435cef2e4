"""ODA → PASM (ARGUS §4.3, Algorithm 1) and the Eq. 2 transport LP it approximates.

``H`` (affinity) is the share of prompts whose optimal level is v_i (from the classifier);
``F`` (share) is the share of the load each level serves (from the allocation). Levels are
ordered slowest/best first, so index 0 is v_1 and "left" means slower/better.

ODA walks the levels from the fastest to the slowest. At each level the mass of prompts now
sitting there is compared with F:

* surplus: the excess moves one level left (slower/better; no quality loss). The excess is taken
  proportionally from everything sitting there (the paper's step probability
  P(v_{i-1} | v_i) = (H - F) / H applied to the level's whole mass);
* deficit: the gap is pulled from the nearest slower levels first (v_{i-1}, v_{i-2}, ...);
  those prompts are served faster than their optimal level (a quality loss).

The composed step probabilities are kept as flows ``X[origin][served]``, so the PASM row of
origin i is ``X[i] / H[i]`` and ``H @ PASM == F`` holds by construction.

Rows of levels with no affinity (H = 0) are not determined by the flows; such a prompt, should
one arrive, is served at its own level when F > 0 there, else at the nearest slower level with
F > 0 (no quality loss), else at the nearest faster one.

Eq. 2 minimises sum_i sum_{j faster than i} P(v'_j | v_i) H(v_i) D(v'_j, v_i). ARGUS proves ODA
optimal when D grows super-linearly with the level gap; :func:`solve_eq2` solves Eq. 2 exactly
(a transport LP) so the claim can be checked. It holds for super-linear (convex) D; for
sub-linear D it fails, e.g. H = (0.5, 0.5, 0), F = (0, 0.5, 0.5): ODA moves two half-masses one
level each (cost D(1)), the LP moves one half-mass two levels (cost D(2)/2 < D(1) when
D(2) < 2 D(1)). See docs/solver.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from argusdiff.errors import ConfigError

__all__ = ["degradation_matrix", "eq2_cost", "oda", "oda_flows", "solve_eq2"]

_EPS = 1e-12


def _normalise(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or len(arr) == 0:
        raise ConfigError(f"{name}: expected a non-empty sequence of numbers")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ConfigError(f"{name}: values must be finite and >= 0, got {list(values)}")
    total = arr.sum()
    if total <= 0:
        return arr  # all zero: handled by the caller
    return arr / total


def _inputs(affinity: Sequence[float], share: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    H = _normalise("affinity", affinity)
    F = _normalise("share", share)
    if len(H) != len(F):
        raise ConfigError(f"affinity has {len(H)} levels but share has {len(F)}; they must match")
    if F.sum() <= 0:
        raise ConfigError("share: at least one level must serve load (all shares are 0)")
    if H.sum() <= 0:  # no affinity information: assume prompts want what is served
        H = F.copy()
    return H, F


def oda_flows(affinity: Sequence[float], share: Sequence[float]) -> np.ndarray:
    """Algorithm 1 as flows: ``X[i, j]`` = mass of prompts with optimal level i served at j."""
    H, F = _inputs(affinity, share)
    L = len(H)
    comp = np.diag(H)  # comp[pos, origin]: mass of each origin now sitting at pos
    tol = 1e-12
    for i in range(L - 1, -1, -1):
        mass = comp[i].sum()
        if mass > F[i] + tol and i > 0:
            frac = (mass - F[i]) / mass
            comp[i - 1] += comp[i] * frac
            comp[i] *= 1.0 - frac
        elif mass < F[i] - tol:
            gap = F[i] - mass
            m = 1
            while gap > tol and i - m >= 0:
                avail = comp[i - m].sum()
                if avail > 0:
                    take = min(avail, gap)
                    frac = take / avail
                    comp[i] += comp[i - m] * frac
                    comp[i - m] *= 1.0 - frac
                    gap -= take
                m += 1
    return comp.T.copy()


def _rows_from_flows(H: np.ndarray, F: np.ndarray, X: np.ndarray) -> tuple[tuple[float, ...], ...]:
    L = len(H)
    rows = []
    for i in range(L):
        row = np.clip(X[i], 0.0, None)
        if H[i] > _EPS and row.sum() > _EPS * H[i]:
            row = row / row.sum()
        else:
            row = np.zeros(L)
            if F[i] > 0:
                row[i] = 1.0
            else:
                slower = [j for j in range(i - 1, -1, -1) if F[j] > 0]
                faster = [j for j in range(i + 1, L) if F[j] > 0]
                row[(slower or faster)[0]] = 1.0
        rows.append(tuple(float(p) for p in row))
    return tuple(rows)


def oda(affinity: Sequence[float], share: Sequence[float]) -> tuple[tuple[float, ...], ...]:
    """The PASM: ``pasm[i][j]`` = P(served at level j | optimal level i). Rows sum to 1.

    ``affinity`` (H) and ``share`` (F) may be counts or shares; both are normalised.
    """
    H, F = _inputs(affinity, share)
    return _rows_from_flows(H, F, oda_flows(H, F))


# --- Eq. 2 ---------------------------------------------------------------------------------------


def degradation_matrix(
    n_levels: int,
    exponent: float = 2.0,
    *,
    gap: Sequence[float] | None = None,
    fn: Callable[[float], float] | None = None,
) -> np.ndarray:
    """D[i, j]: quality loss of serving a prompt whose optimal level is i at a faster level j > i.

    D = fn(gap_j - gap_i) for j > i and 0 otherwise; by default fn(d) = d ** exponent and the
    gap is the level index (pass e.g. the peak throughputs as ``gap`` for ARGUS' "speed gap").
    ``exponent > 1`` is super-linear, ``< 1`` sub-linear.
    """
    pos = np.arange(n_levels, dtype=np.float64) if gap is None else np.asarray(gap, dtype=np.float64)
    f = fn if fn is not None else (lambda d: d**exponent)
    D = np.zeros((n_levels, n_levels))
    for i in range(n_levels):
        for j in range(i + 1, n_levels):
            D[i, j] = f(float(pos[j] - pos[i]))
    return D


def eq2_cost(affinity: Sequence[float], pasm: Sequence[Sequence[float]], D: np.ndarray) -> float:
    """Eq. 2's objective for a PASM: sum over faster shifts of P(j|i) * H(i) * D(i, j)."""
    H = _normalise("affinity", affinity)
    P = np.asarray(pasm, dtype=np.float64)
    L = len(H)
    return float(sum(P[i, j] * H[i] * D[i, j] for i in range(L) for j in range(i + 1, L)))


def solve_eq2(
    affinity: Sequence[float], share: Sequence[float], D: np.ndarray, *, backend: str = "highs"
) -> tuple[float, tuple[tuple[float, ...], ...]]:
    """Eq. 2 exactly, as a transport LP over flows X[i, j] >= 0 with row sums H and column sums F.

    Returns (optimal cost, PASM). Shifts to slower levels cost nothing (Eq. 2 only sums faster ones).
    """
    from solver.backends import solve_milp

    H, F = _inputs(affinity, share)
    # masses below 1e-12 are numerical noise for an LP solver's tolerances: drop them
    H = np.where(H < 1e-12, 0.0, H)
    F = np.where(F < 1e-12, 0.0, F)
    H, F = H / H.sum(), F / F.sum()
    L = len(H)
    n = L * L
    c = np.zeros(n)
    for i in range(L):
        for j in range(i + 1, L):
            c[i * L + j] = D[i, j]
    A = np.zeros((2 * L, n))
    for i in range(L):
        A[i, i * L : (i + 1) * L] = 1.0  # sum_j X[i, j] = H[i]
        A[L + i, i::L] = 1.0  # sum_i X[i, j] = F[j]
    b = np.concatenate([H, F])
    slack = np.concatenate([np.zeros(L), np.full(L, 1e-9)])  # column sums within 1e-9 of F
    res = solve_milp(
        c,
        A,
        b - slack,
        b + slack,
        np.zeros(n),
        np.full(n, np.inf),
        np.zeros(n, dtype=bool),
        sense="min",
        backend=backend,
        # HiGHS' presolve can call a balanced transport LP with tiny masses infeasible
        retry_without_presolve=True,
    )
    if not res.ok:  # pragma: no cover - a balanced transport problem is always feasible
        raise RuntimeError(f"Eq. 2 LP failed: {res.status} {res.message}")
    X = np.clip(res.x.reshape(L, L), 0.0, None)
    cost = float(sum(X[i, j] * D[i, j] for i in range(L) for j in range(i + 1, L)))
    return cost, _rows_from_flows(H, F, X)


def is_super_linear(D: np.ndarray) -> bool:
    """True when D(i, k) >= D(i, j) + D(j, k) for all i < j < k (splitting a shift never helps)."""
    L = D.shape[0]
    return all(
        D[i, k] + 1e-12 >= D[i, j] + D[j, k] for i in range(L) for j in range(i + 1, L) for k in range(j + 1, L)
    ) and not math.isnan(float(D.sum()))
