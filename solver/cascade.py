"""DiffServe's cascade allocation MILP (DiffServe §3.3, Eq. 1-5).

::

    maximize   t
    s.t.       e1(b1) + q1 + e2(b2) + q2 <= L              (latency, Eq. 1)
               x1 * T1(b1) >= lambda * D                    (light throughput, Eq. 2)
               x2 * T2(b2) >= lambda * D * f(t)             (heavy throughput, Eq. 3)
               x1 + x2 <= S                                 (workers, Eq. 4)
               b1, b2 in {1, 2, 4, 8, 16, 32},  t on the profiled f(t) grid, x1, x2 integer

* ``e(b)`` is the profiled batch latency; the light level's also includes the discriminator
  (``discriminator_latency_s`` per image, run on the light worker). ``T(b) = 60 b / e(b)`` QPM.
* ``q`` is the queueing delay. ``queue_model="drain"`` (default): the time the plan's workers
  need to serve the backlog ahead of a new query, q = Q e(b) / (x b) for Q queued requests on x
  workers at batch b; convex in the integer x, carried exactly by secant rows (see below); a
  backlog needs at least one worker of its model. ``queue_model="little"``: the paper's Little's
  law W = L_queue / arrival rate, the light model's rate D, the heavy model's the observed
  ``arrival_heavy_qpm`` when given, else D * f(t); a non-empty queue with no arrivals makes that
  candidate infeasible. Little's law with the few requests a lightly loaded model receives
  predicts waits of minutes for a queue of two, so light load looked infeasible; the drain time
  is bounded by what the allocated workers can serve, and is at most Little's estimate whenever
  the plan's capacity is at least the arrival rate.
* ``lambda`` is the over-provisioning factor (1.05 in DiffServe) on the EWMA demand D.

The choice of b1, b2 and t is encoded with binaries (one per batch size, one per grid point),
which makes every function of them linear: the products x*T(b) become one integer count per
batch size, and f(t), t (and Little's heavy delay) become sums over the grid binaries. The model
has about 230 columns for the 201-point grid, inside the size-limited gurobipy licence. The drain
delay adds a wait column per model, w >= secant of Q e(b) / (b k) through k and k + 1 for
k = 1..S and each batch size, relaxed by a big-M for batch sizes not chosen: exact at every
integer worker count because the function is convex.

When no threshold meets the demand, the plan is the maximum-throughput one (every worker on
the light model at the largest batch the latency bound allows, t at the bottom of the grid) with
``saturated=True`` and the shortfall in QPM; ``feasible`` is False when even that violates the
latency bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from argusdiff.domain import ApproxLevel, CascadeSpec
from argusdiff.errors import ConfigError
from solver.backends import check_backend, solve_milp

__all__ = ["BATCH_SIZES", "CascadePlan", "cascade_candidates", "solve_cascade"]

BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True, slots=True)
class CascadePlan:
    x_light: int
    x_heavy: int
    b_light: int
    b_heavy: int
    threshold: float
    deferral: float  # f(threshold)
    feasible: bool
    saturated: bool
    shortfall_qpm: float
    demand_qpm: float  # lambda * D, the demand planned for
    capacity_light_qpm: float
    capacity_heavy_qpm: float
    latency_s: float  # e1 + q1 + e2 + q2 of the plan
    solve_s: float = 0.0
    backend: str = ""
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _light_latency(light: ApproxLevel, spec: CascadeSpec, b: int) -> float:
    return light.latency(b) + spec.discriminator_latency_s * b


QUEUE_MODELS = ("drain", "little")


def _drain(queue: float, latency_s: float, batch: int, workers: int) -> float:
    """Seconds the plan's ``workers`` at ``batch`` need to drain ``queue`` queued requests, the
    wait of a query arriving behind them: queue * e(b) / (workers * b) (0 for an empty queue)."""
    if queue <= 0:
        return 0.0
    if workers <= 0:
        return math.inf
    return queue * latency_s / (workers * batch)


def _little(queue: float, rate_qpm: float) -> float:
    """Little's law W = L / lambda in seconds (0 for an empty queue)."""
    if queue <= 0:
        return 0.0
    if rate_qpm <= 1e-9:
        return math.inf
    return queue * 60.0 / rate_qpm


def cascade_candidates(
    spec: CascadeSpec,
    light: ApproxLevel,
    heavy: ApproxLevel,
    workers: int,
    demand_qpm: float,
    slo_s: float,
    *,
    queue_light: float = 0,
    queue_heavy: float = 0,
    overprovision: float = 1.05,
    arrival_heavy_qpm: float | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    queue_model: str = "drain",
):
    """Every (t, b1, b2, x1, x2, latency) meeting Eq. 1-4, by enumeration. The reference the MILP
    is tested against, and the answer it must match. Without queues (or with ``queue_model=
    "little"``) x1, x2 are the fewest workers per model; with the drain model and a backlog they
    are the split of all workers with the lowest latency (more workers drain faster)."""
    D = demand_qpm * overprovision
    q1 = _little(queue_light, demand_qpm) if queue_model == "little" else 0.0
    drain = queue_model == "drain" and (queue_light > 0 or queue_heavy > 0)
    best_split: dict[tuple, tuple[float, int, int]] = {}

    def split(b1: int, e1: float, b2: int, e2: float, n1: int, n2: int) -> tuple[float, int, int]:
        key = (b1, b2, n1, n2)
        got = best_split.get(key)
        if got is None:
            got = (math.inf, n1, n2)
            for x1 in range(n1, workers - n2 + 1):
                x2 = workers - x1
                w = _drain(queue_light, e1, b1, x1) + _drain(queue_heavy, e2, b2, x2)
                if w < got[0]:
                    got = (w, x1, x2)
            best_split[key] = got
        return got

    out = []
    for t, f in zip(spec.thresholds, spec.deferral, strict=True):
        if queue_model == "little":
            rate2 = arrival_heavy_qpm if arrival_heavy_qpm is not None else demand_qpm * f
            q2 = _little(queue_heavy, rate2)
        else:
            q2 = 0.0
        for b1 in batch_sizes:
            e1 = _light_latency(light, spec, b1)
            x1 = math.ceil(D / (60.0 * b1 / e1) - 1e-9) if D > 0 else 0
            if drain and queue_light > 0:
                x1 = max(x1, 1)
            for b2 in batch_sizes:
                e2 = heavy.latency(b2)
                x2 = math.ceil(D * f / (60.0 * b2 / e2) - 1e-9) if D * f > 0 else 0
                if drain and queue_heavy > 0:
                    x2 = max(x2, 1)
                if x1 + x2 > workers:
                    continue
                if drain:
                    wait, y1, y2 = split(b1, e1, b2, e2, x1, x2)
                    lat = e1 + e2 + wait
                else:
                    y1, y2 = x1, x2
                    lat = e1 + q1 + e2 + q2
                if lat <= slo_s + 1e-9:
                    out.append((t, b1, b2, y1, y2, lat))
    return out


def solve_cascade(
    spec: CascadeSpec,
    light: ApproxLevel,
    heavy: ApproxLevel,
    workers: int,
    demand_qpm: float,
    slo_s: float,
    *,
    queue_light: float = 0,
    queue_heavy: float = 0,
    overprovision: float = 1.05,
    backend: str = "auto",
    arrival_heavy_qpm: float | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    time_limit_s: float = 5.0,
    queue_model: str = "drain",
) -> CascadePlan:
    """Solve DiffServe's MILP for one period. See the module doc."""
    t0 = time.perf_counter()
    check_backend(backend)
    _check(
        spec,
        light,
        heavy,
        workers,
        demand_qpm,
        slo_s,
        queue_light,
        queue_heavy,
        overprovision,
        batch_sizes,
        queue_model,
    )
    inp = _Inputs.of(
        spec, light, heavy, workers, demand_qpm * overprovision, slo_s, demand_qpm, queue_light, queue_heavy,
        arrival_heavy_qpm, batch_sizes, queue_model,
    )  # fmt: skip
    c, A, lo, hi, col_lo, col_hi, integ = _milp(inp)
    res = solve_milp(c, A, lo, hi, col_lo, col_hi, integ, sense="max", backend=backend, time_limit_s=time_limit_s)
    if res.ok:
        return _solved(inp, np.rint(res.x).astype(int), res.backend, t0)
    notes: list[str] = []
    if res.status not in ("infeasible",):
        notes.append(f"{res.backend} returned {res.status} ({res.message}); planning for maximum throughput")
    return _saturated(inp, res.backend, notes, t0)


def _check(
    spec: CascadeSpec,
    light: ApproxLevel,
    heavy: ApproxLevel,
    workers: int,
    demand_qpm: float,
    slo_s: float,
    queue_light: float,
    queue_heavy: float,
    overprovision: float,
    batch_sizes: Sequence[int],
    queue_model: str,
) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"workers: must be an integer >= 0, got {workers!r}")
    if not (math.isfinite(demand_qpm) and demand_qpm >= 0):
        raise ConfigError(f"demand_qpm: must be a finite number >= 0, got {demand_qpm}")
    if not (math.isfinite(slo_s) and slo_s > 0):
        raise ConfigError(f"slo_s: must be > 0, got {slo_s}")
    if not overprovision >= 1.0:
        raise ConfigError(f"overprovision: must be >= 1, got {overprovision}")
    if queue_light < 0 or queue_heavy < 0:
        raise ConfigError("queue_light/queue_heavy: queue lengths must be >= 0")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"batch_sizes: must be positive integers, got {list(batch_sizes)}")
    if queue_model not in QUEUE_MODELS:
        raise ConfigError(f"queue_model: unknown value {queue_model!r}; choose one of {', '.join(QUEUE_MODELS)}")
    if light.id != spec.light or heavy.id != spec.heavy:
        raise ConfigError(f"cascade spec is {spec.light} -> {spec.heavy}, got levels {light.id} -> {heavy.id}")


@dataclass(frozen=True)
class _Inputs:
    """One period's MILP data: demand D (over-provisioned), the threshold grid ts and its deferral
    fs, batch sizes B with each model's batch latency e and throughput T, and the queueing delays
    (Little's law: q1, q2 per threshold; the drain model: wait columns instead)."""

    workers: int
    D: float
    slo_s: float
    ts: np.ndarray
    fs: np.ndarray
    B: list[int]
    e1: np.ndarray
    e2: np.ndarray
    T1: np.ndarray
    T2: np.ndarray
    little: bool
    q1: float
    q2: np.ndarray
    queue_light: float
    queue_heavy: float

    @classmethod
    def of(
        cls, spec, light, heavy, workers, D, slo_s, demand_qpm, queue_light, queue_heavy, arrival_heavy_qpm, B, model
    ) -> _Inputs:
        ts = np.asarray(spec.thresholds, dtype=np.float64)
        fs = np.asarray(spec.deferral, dtype=np.float64)
        B = list(B)
        e1 = np.array([_light_latency(light, spec, b) for b in B])
        e2 = np.array([heavy.latency(b) for b in B])
        little = model == "little"
        if little:
            q1 = _little(queue_light, demand_qpm)
            rate2 = np.full(len(ts), arrival_heavy_qpm) if arrival_heavy_qpm is not None else demand_qpm * fs
            q2 = np.array([_little(queue_heavy, r) for r in rate2])
            q2 = np.where(np.isfinite(q2), q2, 1e6)
        else:  # drain model: waits are columns w1, w2 bounded below by the drain time of the plan
            q1 = 0.0
            q2 = np.zeros(len(ts))
        T1 = 60.0 * np.array(B) / e1
        T2 = 60.0 * np.array(B) / e2
        return cls(workers, D, slo_s, ts, fs, B, e1, e2, T1, T2, little, q1, q2, queue_light, queue_heavy)

    @property
    def drain(self) -> bool:
        """Whether the drain model's wait columns are in the MILP (a backlog on either model)."""
        return (not self.little) and (self.queue_light > 0 or self.queue_heavy > 0)


def _milp(inp: _Inputs):
    """The MILP's (c, A, row_lo, row_hi, col_lo, col_hi, integrality). Columns: z_k (K), s1_b (nb),
    s2_b (nb), x1_b (nb), x2_b (nb) [, w1, w2 (drain model)]."""
    K, nb, workers, drain = len(inp.ts), len(inp.B), inp.workers, inp.drain
    e1, e2, B = inp.e1, inp.e2, inp.B
    iz, is1, is2, ix1, ix2 = 0, K, K + nb, K + 2 * nb, K + 3 * nb
    iw1, iw2 = K + 4 * nb, K + 4 * nb + 1
    n = K + 4 * nb + (2 if drain else 0)
    rows, lo, hi = [], [], []

    def add(coefs: dict[int, float] | Sequence[tuple[slice, object]], lo_v: float, hi_v: float) -> None:
        r = np.zeros(n)
        if isinstance(coefs, dict):
            for j, c in coefs.items():
                r[j] += c
        else:
            for sl, v in coefs:
                r[sl] = v
        rows.append(r)
        lo.append(lo_v)
        hi.append(hi_v)

    z, s1, s2 = slice(iz, iz + K), slice(is1, is1 + nb), slice(is2, is2 + nb)
    x1, x2 = slice(ix1, ix1 + nb), slice(ix2, ix2 + nb)
    add([(z, 1)], 1, 1)  # one threshold
    add([(s1, 1)], 1, 1)  # one light batch size
    add([(s2, 1)], 1, 1)  # one heavy batch size
    # Eq. 1: sum s1 e1 + q1 + sum s2 e2 + sum z q2 <= L
    waits = [(slice(iw1, iw2 + 1), 1.0)] if drain else []
    add([(s1, e1), (s2, e2), (z, inp.q2), *waits], -np.inf, inp.slo_s - inp.q1)
    add([(x1, inp.T1)], inp.D, np.inf)  # Eq. 2: sum_b x1_b T1(b) >= D
    add([(x2, inp.T2), (z, -inp.D * inp.fs)], 0, np.inf)  # Eq. 3: sum_b x2_b T2(b) - D sum_k z_k f_k >= 0
    add([(x1, 1), (x2, 1)], -np.inf, workers)  # Eq. 4
    # link counts to the chosen batch size: x_b <= S * s_b
    for j in range(nb):
        add({ix1 + j: 1.0, is1 + j: -float(workers)}, -np.inf, 0)
        add({ix2 + j: 1.0, is2 + j: -float(workers)}, -np.inf, 0)
    if drain:
        # w_m >= Q_m e_m(b) / (b x_m) for the chosen b: a convex function of the integer count, exact
        # at every integer by its secants through (k, g(k)), (k+1, g(k+1)), k = 1..S; rows of batch
        # sizes not chosen are relaxed by M_b (x_b = 0 there). A backlog needs >= 1 worker.
        for queue, ix, isb, iw, e in ((inp.queue_light, ix1, is1, iw1, e1), (inp.queue_heavy, ix2, is2, iw2, e2)):
            if queue <= 0:
                continue
            add([(slice(ix, ix + nb), 1)], 1, np.inf)
            for j in range(nb):
                cj = queue * e[j] / B[j]
                M = 2.0 * cj
                for k in range(1, workers + 1):
                    a = cj / k - cj / (k + 1)
                    # w + a x_b - M s_b >= c/k + a k - M
                    add({iw: 1.0, ix + j: a, isb + j: -M}, cj / k + a * k - M, np.inf)
    c = np.zeros(n)
    c[z] = inp.ts
    # Secondary terms, together smaller than a tenth of the grid step so they never trade away
    # threshold: the lowest latency for the same t, then the fewest workers.
    steps = np.diff(inp.ts)
    room = 0.1 * float(steps[steps > 0].min()) if np.any(steps > 0) else 1e-3
    w_lat = 0.5 * room / (float(e1.max() + e2.max()) + 1.0)
    w_wrk = 0.5 * room / (workers + 1.0)
    c[ix1 : ix1 + 2 * nb] = -w_wrk
    c[s1] -= w_lat * e1
    c[s2] -= w_lat * e2
    integ = np.ones(n, dtype=bool)
    col_hi = np.concatenate([np.ones(K + 2 * nb), np.full(2 * nb, float(workers))])
    if drain:
        c[iw1] = c[iw2] = -w_lat
        integ[iw1] = integ[iw2] = False
        col_hi = np.concatenate([col_hi, [np.inf, np.inf]])
    return c, np.vstack(rows), np.array(lo), np.array(hi), np.zeros(n), col_hi, integ


def _solved(inp: _Inputs, x: np.ndarray, backend: str, t0: float) -> CascadePlan:
    """The plan of a solved MILP (``x`` rounded); idle workers add headroom where utilisation is higher."""
    K, nb = len(inp.ts), len(inp.B)
    B, D, fs, T1, T2 = inp.B, inp.D, inp.fs, inp.T1, inp.T2
    k = int(np.argmax(x[:K]))
    j1 = int(np.argmax(x[K : K + nb]))
    j2 = int(np.argmax(x[K + nb : K + 2 * nb]))
    x1 = int(x[K + 2 * nb : K + 3 * nb].sum())
    x2 = int(x[K + 3 * nb : K + 4 * nb].sum())
    spare = inp.workers - x1 - x2
    if spare > 0:
        u1 = D / (x1 * T1[j1]) if x1 else math.inf
        u2 = D * fs[k] / (x2 * T2[j2]) if x2 else (math.inf if D * fs[k] > 0 else 0.0)
        if u2 > u1:
            x2 += spare
        else:
            x1 += spare
    e1, e2 = inp.e1, inp.e2
    if inp.little:
        lat = e1[j1] + inp.q1 + e2[j2] + inp.q2[k]
    else:
        lat = e1[j1] + _drain(inp.queue_light, e1[j1], B[j1], x1) + e2[j2] + _drain(inp.queue_heavy, e2[j2], B[j2], x2)
    return CascadePlan(
        x_light=x1,
        x_heavy=x2,
        b_light=B[j1],
        b_heavy=B[j2],
        threshold=float(inp.ts[k]),
        deferral=float(fs[k]),
        feasible=True,
        saturated=False,
        shortfall_qpm=0.0,
        demand_qpm=D,
        capacity_light_qpm=float(x1 * T1[j1]),
        capacity_heavy_qpm=float(x2 * T2[j2]),
        latency_s=float(lat),
        solve_s=time.perf_counter() - t0,
        backend=backend,
    )


def _saturated(inp: _Inputs, backend: str, notes: list[str], t0: float) -> CascadePlan:
    """Saturated: every worker on the light model, lowest threshold, largest batch meeting the SLO.
    Drain model: a heavy backlog keeps one heavy worker (accepted work is never stranded)."""
    B, D, e1, e2, T1, nb = inp.B, inp.D, inp.e1, inp.e2, inp.T1, len(inp.B)
    k = int(np.argmin(inp.fs))
    x2s = 1 if (not inp.little and inp.queue_heavy > 0 and inp.workers >= 2) else 0
    x1s = inp.workers - x2s
    if not inp.little:
        q1s = np.array([_drain(inp.queue_light, e1[j], B[j], x1s) for j in range(nb)])
        q2s = _drain(inp.queue_heavy, e2[0], B[0], x2s)
    else:
        q1s = np.full(nb, inp.q1)
        q2s = float(inp.q2[k])
    lat_ok = [j for j in range(nb) if e1[j] + q1s[j] + e2[0] + q2s <= inp.slo_s + 1e-9]
    feasible = bool(lat_ok)
    j1 = max(lat_ok, key=lambda j: T1[j]) if lat_ok else int(np.argmin(e1))
    cap1 = x1s * T1[j1]
    shortfall = max(0.0, float(D - cap1))
    saturated = bool(shortfall > 0 or not feasible)  # a Python bool: the plan is written as JSON
    if shortfall > 0:
        notes.append(f"demand {D:.1f} QPM cannot be met: light capacity {cap1:.1f} QPM at b={B[j1]}")
    if not feasible:
        notes.append(f"no batch size meets the {inp.slo_s:g} s latency bound with the observed queues")
    return CascadePlan(
        x_light=x1s,
        x_heavy=x2s,
        b_light=B[j1],
        b_heavy=B[0],
        threshold=float(inp.ts[k]),
        deferral=float(inp.fs[k]),
        feasible=feasible,
        saturated=saturated,
        shortfall_qpm=float(shortfall),
        demand_qpm=D,
        capacity_light_qpm=float(cap1),
        capacity_heavy_qpm=float(x2s * inp.T2[0]),
        latency_s=float(e1[j1] + q1s[j1] + e2[0] + q2s),
        solve_s=time.perf_counter() - t0,
        backend=backend,
        notes=tuple(notes),
    )
