"""Request arrival traces: readers, generators, spec strings and the native file format.

A :class:`Trace` is a sorted array of arrival times (seconds from the trace start), optional
prompt indices (0-based, into whatever prompt set the replay uses), and optional per-request SLO
(seconds) and tier. Traces come from:

* files, format detected from the content (or named explicitly):

  - ``argusdiff`` — the native CSV written by :func:`write_trace`: optional ``# key: value``
    metadata lines, a header ``arrival_s[,prompt_idx][,slo_s][,tier]``, one row per request;
  - ``diffserve`` — the DiffServe artifact's ``arrival_ms,prompt_idx`` (prompt_idx 1-based);
  - ``proteus`` — Proteus' Twitter-derived ``start_ms,qos_level,deadline_ms`` (deadline → SLO);
  - ``azure-minute`` — an Azure Functions 2019 per-minute invocation CSV
    (``HashOwner,HashApp,HashFunction,Trigger,1,...,1440``): rows are summed per minute;
  - ``azure-hourly`` — an hourly aggregate shape (``,hour,invocations``), scaled to a QPM range;

* generators named by a spec string ``kind:key=value,...`` (see :data:`GENERATORS`), e.g.
  ``bursty:low=60,high=480,period=5m,duration=40m`` or ``diagonal:start=50,end=600,duration=800m``.

Durations accept ``s``/``m``/``h`` suffixes (bare numbers are seconds); rates are QPM (a
``qps`` suffix converts). Every spec also takes ``seed=``, ``prompts=N`` (assign prompt indices
in ``[0, N)``) and ``order=random|sequential`` (sequential walks through the prompt set, which
avoids the near-duplicate cache hits of drawing uniformly from a small set).

Shape-preserving scaling maps a rate curve affinely so its minimum becomes ``low`` and its
maximum ``high`` QPM (DiffServe scales the Azure Functions trace this way); ``peak=`` instead
multiplies the curve so its maximum is ``peak`` QPM.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from argusdiff.errors import ConfigError

__all__ = [
    "FORMATS",
    "GENERATORS",
    "SHAPES",
    "Trace",
    "TraceError",
    "assign_prompts",
    "assign_tiers",
    "bursty",
    "default_prompt_order",
    "detect_format",
    "diagonal",
    "diurnal",
    "list_traces",
    "load_shape",
    "load_trace",
    "parse_duration",
    "parse_spec",
    "poisson",
    "rate_curve_trace",
    "read_trace",
    "scale_shape",
    "write_trace",
]

DATA_DIR = Path(__file__).parent / "data"
FORMATS = ("argusdiff", "diffserve", "proteus", "azure-minute", "azure-hourly")
PROMPT_ORDERS = ("random", "sequential")
MAX_REQUESTS = 50_000_000  # a generated trace larger than this is a typo, not a workload
#: Shipped rate shapes (see traces/data/SOURCES.md).
SHAPES: dict[str, Path] = {"azure": DATA_DIR / "azure_functions_2019_hourly.csv"}


class TraceError(ConfigError):
    """A trace file, spec string or generator parameter is invalid (the message says where)."""


# ---------------------------------------------------------------------------------------------
# The Trace type


@dataclass(frozen=True, eq=False)
class Trace:
    """Arrival times (seconds, sorted) of ``len(trace)`` requests, with optional per-request data."""

    arrivals_s: np.ndarray
    prompt_idx: np.ndarray | None = None  # int64, 0-based
    slo_s: np.ndarray | None = None  # float64 per-request SLO (e.g. Proteus deadlines)
    tier: tuple[str, ...] | None = None
    name: str = ""
    source: str = ""
    format: str = ""
    duration: float | None = None  # nominal length (s); default: the last arrival
    _meta: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.arrivals_s, dtype=np.float64).reshape(-1)
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0):
            raise TraceError(f"trace {self.name!r}: arrival times must be finite and >= 0")
        order = None
        if arr.size > 1 and np.any(np.diff(arr) < 0):
            order = np.argsort(arr, kind="stable")
            arr = arr[order]
        object.__setattr__(self, "arrivals_s", arr)
        n = arr.size
        if self.prompt_idx is not None:
            idx = np.asarray(self.prompt_idx, dtype=np.int64).reshape(-1)
            if idx.size != n:
                raise TraceError(f"trace {self.name!r}: {idx.size} prompt indices for {n} arrivals")
            if idx.size and idx.min() < 0:
                raise TraceError(f"trace {self.name!r}: prompt indices must be >= 0")
            object.__setattr__(self, "prompt_idx", idx if order is None else idx[order])
        if self.slo_s is not None:
            slo = np.asarray(self.slo_s, dtype=np.float64).reshape(-1)
            if slo.size != n:
                raise TraceError(f"trace {self.name!r}: {slo.size} SLOs for {n} arrivals")
            if slo.size and (not np.all(np.isfinite(slo)) or slo.min() <= 0):
                raise TraceError(f"trace {self.name!r}: per-request SLOs must be finite and > 0")
            object.__setattr__(self, "slo_s", slo if order is None else slo[order])
        if self.tier is not None:
            tier = tuple(str(t) for t in self.tier)
            if len(tier) != n:
                raise TraceError(f"trace {self.name!r}: {len(tier)} tiers for {n} arrivals")
            if order is not None:
                tier = tuple(tier[i] for i in order)
            object.__setattr__(self, "tier", tier)
        if self.duration is not None and (not math.isfinite(self.duration) or self.duration < 0):
            raise TraceError(f"trace {self.name!r}: duration must be finite and >= 0")

    def __len__(self) -> int:
        return int(self.arrivals_s.size)

    @property
    def duration_s(self) -> float:
        """Nominal length: the generator's duration, else the last arrival time."""
        last = float(self.arrivals_s[-1]) if len(self) else 0.0
        return max(self.duration or 0.0, last)

    @property
    def mean_qpm(self) -> float:
        d = self.duration_s
        return 60.0 * len(self) / d if d > 0 else 0.0

    def qpm(self, bin_s: float = 60.0) -> np.ndarray:
        """Offered load per bin of ``bin_s`` seconds, in QPM (one value per bin)."""
        if bin_s <= 0:
            raise TraceError("bin_s must be > 0")
        nbins = max(1, math.ceil(self.duration_s / bin_s)) if len(self) else 0
        if nbins == 0:
            return np.zeros(0)
        bins = np.minimum((self.arrivals_s // bin_s).astype(np.int64), nbins - 1)
        return np.bincount(bins, minlength=nbins).astype(np.float64) * (60.0 / bin_s)

    @property
    def peak_qpm(self) -> float:
        per_min = self.qpm(60.0)
        return float(per_min.max()) if per_min.size else 0.0

    def prompt_indices(
        self, n_prompts: int, *, order: str | None = None, seed: int = 0, wrap: bool = False
    ) -> np.ndarray:
        """The trace's prompt indices checked against a set of ``n_prompts`` prompts; when the
        trace carries none, indices are assigned (``order`` random or sequential, ``seed``).
        Indices beyond the set fail unless ``wrap`` (then taken modulo ``n_prompts``)."""
        if n_prompts < 1:
            raise TraceError("the prompt set is empty")
        if self.prompt_idx is None:
            return assign_prompts(len(self), n_prompts, order=order, seed=seed)
        idx = self.prompt_idx
        if idx.size and idx.max() >= n_prompts:
            if not wrap:
                raise TraceError(
                    f"trace {self.name!r} refers to prompt index {int(idx.max())} but the prompt set has "
                    f"{n_prompts} prompts (use a larger set, or wrap indices)"
                )
            idx = idx % n_prompts
        return idx

    def with_prompts(self, n_prompts: int, *, order: str | None = None, seed: int = 0, wrap: bool = False) -> Trace:
        return self._replace(prompt_idx=self.prompt_indices(n_prompts, order=order, seed=seed, wrap=wrap))

    def window(self, start_s: float, end_s: float | None = None) -> Trace:
        """Requests arriving in ``[start_s, end_s)``, times shifted so the window starts at 0."""
        end = math.inf if end_s is None else end_s
        lo = int(np.searchsorted(self.arrivals_s, start_s, side="left"))
        hi = int(np.searchsorted(self.arrivals_s, end, side="left"))
        sel = slice(lo, hi)
        dur = (end - start_s) if end_s is not None else max(0.0, self.duration_s - start_s)
        return Trace(
            arrivals_s=self.arrivals_s[sel] - start_s,
            prompt_idx=None if self.prompt_idx is None else self.prompt_idx[sel],
            slo_s=None if self.slo_s is None else self.slo_s[sel],
            tier=None if self.tier is None else self.tier[sel],
            name=self.name,
            source=self.source,
            format=self.format,
            duration=dur,
        )

    def rescale(
        self, *, mean_qpm: float | None = None, peak_qpm: float | None = None, factor: float | None = None
    ) -> Trace:
        """The same arrival pattern at another load: time is stretched (or compressed) so the mean
        (or the peak per-minute) rate becomes the target, or every inter-arrival gap is divided by
        ``factor`` (factor 2 = twice the load). Per-request SLOs are kept."""
        given = [x is not None for x in (mean_qpm, peak_qpm, factor)]
        if sum(given) != 1:
            raise TraceError("rescale needs exactly one of mean_qpm, peak_qpm, factor")
        if factor is None:
            target, current = (mean_qpm, self.mean_qpm) if mean_qpm is not None else (peak_qpm, self.peak_qpm)
            if current <= 0:
                raise TraceError(f"trace {self.name!r} is empty: cannot rescale")
            factor = float(target) / current
        if not math.isfinite(factor) or factor <= 0:
            raise TraceError(f"rescale factor must be finite and > 0, got {factor}")
        return self._replace(
            arrivals_s=self.arrivals_s / factor,
            duration=None if self.duration is None else self.duration / factor,
        )

    def _replace(self, **changes) -> Trace:
        fields = {
            "arrivals_s": self.arrivals_s,
            "prompt_idx": self.prompt_idx,
            "slo_s": self.slo_s,
            "tier": self.tier,
            "name": self.name,
            "source": self.source,
            "format": self.format,
            "duration": self.duration,
        }
        fields.update(changes)
        return Trace(**fields)

    def summary(self) -> dict:
        per_min = self.qpm(60.0)
        return {
            "name": self.name,
            "source": self.source,
            "format": self.format,
            "requests": len(self),
            "duration_s": round(self.duration_s, 3),
            "mean_qpm": round(self.mean_qpm, 3),
            "peak_qpm": round(float(per_min.max()), 3) if per_min.size else 0.0,
            "min_qpm": round(float(per_min.min()), 3) if per_min.size else 0.0,
            "has_prompts": self.prompt_idx is not None,
            "distinct_prompts": int(np.unique(self.prompt_idx).size) if self.prompt_idx is not None else 0,
            "has_slo": self.slo_s is not None,
            "has_tier": self.tier is not None,
        }


def default_prompt_order() -> str:
    """``[traces] prompt_order`` (``ARGUSDIFF_TRACES__PROMPT_ORDER``), ``sequential`` by default."""
    from argusdiff.config import load_settings

    return load_settings().traces.prompt_order


def assign_prompts(n: int, n_prompts: int, *, order: str | None = None, seed: int = 0) -> np.ndarray:
    """Prompt indices for ``n`` requests over a set of ``n_prompts``: uniform draws (``random``)
    or a walk through the set in order, wrapping around (``sequential``); ``None``: the
    configured :func:`default_prompt_order`."""
    if n_prompts < 1:
        raise TraceError("prompts must be >= 1")
    if order is None:
        order = default_prompt_order()
    if order == "random":
        # a stream of its own, independent of the arrival times drawn with the same seed
        return np.random.default_rng([seed, 0x9E37]).integers(0, n_prompts, size=n, dtype=np.int64)
    if order == "sequential":
        return np.arange(n, dtype=np.int64) % n_prompts
    raise TraceError(f"order must be one of {', '.join(PROMPT_ORDERS)}; got {order!r}")


# ---------------------------------------------------------------------------------------------
# Parsing helpers

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ms|s|sec|m|min|h|hr|d)?\s*$")
_UNIT_S = {None: 1.0, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0, "d": 86400.0}


def parse_duration(value: str | float, name: str = "duration") -> float:
    """``"5m"`` → 300.0; bare numbers are seconds."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise TraceError(f"{name}: cannot read {value!r} as a duration (e.g. 300, 300s, 5m, 2h)")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise TraceError(f"{name}: duration must be finite and >= 0, got {value!r}")
    return seconds


def parse_rate(value: str | float, name: str) -> float:
    """A rate in QPM; a ``qps`` suffix converts from queries per second."""
    text = str(value).strip().lower()
    factor = 1.0
    if text.endswith("qps"):
        factor, text = 60.0, text[:-3]
    elif text.endswith("qpm"):
        text = text[:-3]
    try:
        rate = float(text) * factor
    except ValueError:
        raise TraceError(f"{name}: cannot read {value!r} as a rate in QPM (e.g. 120 or 2qps)") from None
    if not math.isfinite(rate) or rate < 0:
        raise TraceError(f"{name}: rate must be finite and >= 0, got {value!r}")
    return rate


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"bursty:low=60,high=480"`` → ``("bursty", {"low": "60", "high": "480"})``."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    params: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise TraceError(f"trace spec {spec!r}: expected key=value, got {part!r}")
        key = key.strip().lower()
        if key in params:
            raise TraceError(f"trace spec {spec!r}: {key!r} given twice")
        params[key] = value.strip()
    return kind, params


# ---------------------------------------------------------------------------------------------
# Rate curves → arrivals (non-homogeneous Poisson by time rescaling)


def rate_curve_trace(
    times_s: np.ndarray,
    rates_qpm: np.ndarray,
    *,
    seed: int = 0,
    name: str = "",
    source: str = "",
    step: bool = False,
) -> Trace:
    """Poisson arrivals whose rate follows ``rates_qpm`` at ``times_s`` (linear between points,
    or held constant until the next point when ``step``); the trace ends at ``times_s[-1]``.

    Exact for the given curve: the number of arrivals is Poisson(Λ(T)) and their cumulative
    intensities are sorted uniforms on [0, Λ(T)], mapped back through Λ⁻¹."""
    t = np.asarray(times_s, dtype=np.float64)
    r = np.asarray(rates_qpm, dtype=np.float64) / 60.0  # per second
    if t.ndim != 1 or t.size < 2 or t.size != r.size:
        raise TraceError("a rate curve needs at least two (time, rate) points")
    if np.any(np.diff(t) <= 0) or np.any(r < 0) or not np.all(np.isfinite(r)):
        raise TraceError("rate curve times must increase and rates must be finite and >= 0")
    dt = np.diff(t)
    seg = r[:-1] * dt if step else 0.5 * (r[:-1] + r[1:]) * dt
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    total = float(cum[-1])
    if total > MAX_REQUESTS:
        raise TraceError(
            f"trace {name or 'generator'!r} would have ~{total:,.0f} requests (limit {MAX_REQUESTS:,}); "
            "lower the rate or the duration"
        )
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(total)) if total > 0 else 0
    u = np.sort(rng.uniform(0.0, total, size=n))
    # invert Λ segment by segment
    k = np.clip(np.searchsorted(cum, u, side="right") - 1, 0, len(dt) - 1)
    rem = u - cum[k]
    r0 = r[k]
    if step:
        arrivals = t[k] + np.divide(rem, r0, out=np.zeros_like(rem), where=r0 > 0)
    else:
        slope = (r[k + 1] - r0) / dt[k]
        # solve r0*x + slope*x^2/2 = rem for x in [0, dt]
        lin = np.divide(rem, r0, out=np.zeros_like(rem), where=r0 > 0)
        disc = np.maximum(r0 * r0 + 2.0 * slope * rem, 0.0)
        quad = np.divide(2.0 * rem, r0 + np.sqrt(disc), out=lin.copy(), where=(r0 + np.sqrt(disc)) > 0)
        x = np.where(np.abs(slope) > 1e-15, quad, lin)
        arrivals = t[k] + np.clip(x, 0.0, dt[k])
    arrivals = np.sort(arrivals) - t[0]
    return Trace(arrivals_s=arrivals, name=name, source=source, format="generated", duration=float(t[-1] - t[0]))


def _positive_duration(kind: str, duration_s: float) -> None:
    if not duration_s > 0:
        raise TraceError(f"{kind}: duration must be > 0, got {duration_s:g} s")


def poisson(qpm: float, duration_s: float, *, seed: int = 0, name: str = "") -> Trace:
    """Poisson arrivals at a constant rate."""
    _positive_duration("poisson", duration_s)
    return rate_curve_trace(
        np.array([0.0, duration_s]), np.array([qpm, qpm]), seed=seed, name=name or f"poisson:qpm={qpm:g}"
    )


def bursty(
    low: float,
    high: float,
    period_s: float,
    duration_s: float,
    *,
    high_period_s: float | None = None,
    seed: int = 0,
    name: str = "",
) -> Trace:
    """Interleaved low/high periods (low first) with Poisson arrivals in each (ARGUS §5)."""
    _positive_duration("bursty", duration_s)
    if period_s <= 0:
        raise TraceError("bursty: period must be > 0")
    hp = period_s if high_period_s is None else high_period_s
    if hp <= 0:
        raise TraceError("bursty: high_period must be > 0")
    times, rates = [0.0], [low]
    t, is_high = 0.0, False
    while t < duration_s:
        t = min(duration_s, t + (hp if is_high else period_s))
        times.append(t)
        is_high = not is_high
        rates.append(high if is_high else low)
    # step curve: the rate at times[i] holds until times[i+1]
    return rate_curve_trace(
        np.array(times), np.array(rates), seed=seed, step=True, name=name or f"bursty:low={low:g},high={high:g}"
    )


def diagonal(start: float, end: float, duration_s: float, *, seed: int = 0, name: str = "") -> Trace:
    """A linear ramp of the Poisson rate from ``start`` to ``end`` QPM (ARGUS: 50 → 600 over ~800 min)."""
    _positive_duration("diagonal", duration_s)
    return rate_curve_trace(
        np.array([0.0, duration_s]),
        np.array([start, end]),
        seed=seed,
        name=name or f"diagonal:start={start:g},end={end:g}",
    )


def load_shape(shape: str | Path) -> np.ndarray:
    """A rate shape (one value per point): a shipped name (``azure``) or a CSV file whose last
    numeric column is the value (e.g. ``,hour,invocations``) or a one-column file."""
    path = SHAPES.get(str(shape)) or Path(shape)
    if not Path(path).is_file():
        raise TraceError(f"shape {str(shape)!r}: not a shipped shape ({', '.join(SHAPES)}) and not a file")
    values = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8-sig").splitlines(), start=1):
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or line.startswith("#"):
            continue
        try:
            v = float(cells[-1])
        except ValueError:
            if not values:  # header
                continue
            raise TraceError(f"{path}:{lineno}: not a number: {cells[-1]!r}") from None
        if not math.isfinite(v) or v < 0:
            raise TraceError(f"{path}:{lineno}: shape values must be finite and >= 0, got {cells[-1]!r}")
        values.append(v)
    if len(values) < 2:
        raise TraceError(f"{path}: a shape needs at least two values")
    return np.array(values)


def scale_shape(
    values: np.ndarray, *, low: float | None = None, high: float | None = None, peak: float | None = None
) -> np.ndarray:
    """Shape-preserving scaling to QPM: affine min→``low``, max→``high``; or multiplicative so
    the maximum is ``peak``. With neither, the values are taken as QPM unchanged."""
    v = np.asarray(values, dtype=np.float64)
    if peak is not None:
        if low is not None or high is not None:
            raise TraceError("give either peak= or low=/high=, not both")
        vmax = float(v.max())
        if vmax <= 0:
            raise TraceError("cannot scale an all-zero shape")
        return v * (peak / vmax)
    if low is None and high is None:
        return v
    if low is None or high is None:
        raise TraceError("shape scaling needs both low= and high= (QPM)")
    if high < low:
        raise TraceError(f"high ({high:g}) must be >= low ({low:g})")
    vmin, vmax = float(v.min()), float(v.max())
    if vmax == vmin:
        return np.full_like(v, (low + high) / 2.0)
    return low + (v - vmin) * (high - low) / (vmax - vmin)


def diurnal(
    shape: str | Path = "azure",
    *,
    low: float | None = 50.0,
    high: float | None = 600.0,
    peak: float | None = None,
    duration_s: float | None = None,
    point_s: float = 60.0,
    start: int = 0,
    length: int | None = None,
    seed: int = 0,
    name: str = "",
) -> Trace:
    """Poisson arrivals following a rate shape (default: the Azure Functions 2019 hourly
    invocations), scaled to a QPM range; each shape point lasts ``point_s`` seconds unless
    ``duration_s`` stretches the selected points over that duration."""
    values = load_shape(shape)
    stop = len(values) if length is None else start + length
    if start < 0 or stop > len(values) or stop - start < 2:
        raise TraceError(f"shape has {len(values)} points; start={start}, length={length} selects fewer than 2")
    values = values[start:stop]
    if peak is not None:
        low = high = None
    rates = scale_shape(values, low=low, high=high, peak=peak)
    span = duration_s if duration_s is not None else point_s * (len(rates) - 1)
    if span <= 0:
        raise TraceError("diurnal: duration must be > 0")
    times = np.linspace(0.0, span, len(rates))
    return rate_curve_trace(times, rates, seed=seed, name=name or f"diurnal:shape={shape}", source=str(shape))


# ---------------------------------------------------------------------------------------------
# Spec strings


@dataclass(frozen=True)
class _Generator:
    help: str
    example: str
    build: Callable[[dict[str, str], int], Trace]
    keys: tuple[str, ...]


def _take(params: dict[str, str], key: str, default=None, *, kind: str, conv=float):
    if key not in params:
        if default is None:
            raise TraceError(f"trace spec {kind!r}: missing {key}=")
        return default
    raw = params[key]
    try:
        return conv(raw)
    except TraceError as exc:
        raise TraceError(f"trace spec {kind!r}: {exc}") from None
    except ValueError:
        raise TraceError(f"trace spec {kind!r}: {key}={raw!r} is not valid") from None


def _rate(key):
    return lambda v: parse_rate(v, key)


def _dur(key):
    return lambda v: parse_duration(v, key)


def _gen_poisson(p, seed):
    qpm = _take(p, "qpm", kind="poisson", conv=_rate("qpm"))
    dur = _take(p, "duration", 600.0, kind="poisson", conv=_dur("duration"))
    return poisson(qpm, dur, seed=seed, name=f"poisson:qpm={qpm:g},duration={dur:g}s")


def _gen_bursty(p, seed):
    low = _take(p, "low", 60.0, kind="bursty", conv=_rate("low"))
    high = _take(p, "high", 480.0, kind="bursty", conv=_rate("high"))
    period = _take(p, "period", 300.0, kind="bursty", conv=_dur("period"))
    hp = _take(p, "high_period", period, kind="bursty", conv=_dur("high_period"))
    dur = _take(p, "duration", 2400.0, kind="bursty", conv=_dur("duration"))
    return bursty(
        low,
        high,
        period,
        dur,
        high_period_s=hp,
        seed=seed,
        name=f"bursty:low={low:g},high={high:g},period={period:g}s,duration={dur:g}s",
    )


def _gen_diagonal(p, seed):
    start = _take(p, "start", 50.0, kind="diagonal", conv=_rate("start"))
    end = _take(p, "end", 600.0, kind="diagonal", conv=_rate("end"))
    dur = _take(p, "duration", 48000.0, kind="diagonal", conv=_dur("duration"))
    return diagonal(start, end, dur, seed=seed, name=f"diagonal:start={start:g},end={end:g},duration={dur:g}s")


def _gen_diurnal(p, seed, default_shape="azure"):
    shape = p.get("shape", default_shape)
    peak = _take(p, "peak", -1.0, kind="diurnal", conv=_rate("peak"))
    low = _take(p, "low", 50.0, kind="diurnal", conv=_rate("low"))
    high = _take(p, "high", 600.0, kind="diurnal", conv=_rate("high"))
    dur = _take(p, "duration", -1.0, kind="diurnal", conv=_dur("duration")) if "duration" in p else None
    point = _take(p, "point", 60.0, kind="diurnal", conv=_dur("point"))
    start = _take(p, "start", 0, kind="diurnal", conv=int)
    length = _take(p, "length", -1, kind="diurnal", conv=int)
    return diurnal(
        shape,
        low=None if "peak" in p else low,
        high=None if "peak" in p else high,
        peak=peak if "peak" in p else None,
        duration_s=dur,
        point_s=point,
        start=start,
        length=None if length < 0 else length,
        seed=seed,
        name="diurnal:" + ",".join(f"{k}={v}" for k, v in sorted(p.items())) if p else "diurnal:shape=azure",
    )


_COMMON_KEYS = ("seed", "prompts", "order", "tiers")
TIERS = ("interactive", "standard", "batch")  # argusdiff.domain.Tier values


def assign_tiers(n: int, shares: Sequence[float], *, seed: int = 0) -> tuple[str, ...]:
    """Per-request tiers drawn with the given shares of interactive/standard/batch."""
    w = np.asarray(shares, dtype=np.float64)
    if w.shape != (3,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise TraceError(f"tiers: need three shares >= 0 (interactive/standard/batch), got {list(shares)}")
    draw = np.random.default_rng([seed, 0x7135]).choice(3, size=n, p=w / w.sum())
    names = np.array(TIERS, dtype=object)
    return tuple(names[draw])


def _parse_tiers(raw: str, kind: str) -> tuple[float, float, float]:
    parts = raw.split("/")
    try:
        vals = tuple(float(x) for x in parts)
    except ValueError:
        vals = ()
    if len(vals) != 3:
        raise TraceError(f"trace spec {kind!r}: tiers={raw!r} must be three shares I/S/B, e.g. tiers=0.2/0.6/0.2")
    return vals  # type: ignore[return-value]


GENERATORS: dict[str, _Generator] = {
    "poisson": _Generator(
        "Poisson arrivals at a constant rate", "poisson:qpm=120,duration=30m", _gen_poisson, ("qpm", "duration")
    ),
    "bursty": _Generator(
        "interleaved low/high periods with Poisson arrivals",
        "bursty:low=60,high=480,period=5m,duration=40m",
        _gen_bursty,
        ("low", "high", "period", "high_period", "duration"),
    ),
    "diagonal": _Generator(
        "linear ramp of the Poisson rate (ARGUS stress trace)",
        "diagonal:start=50,end=600,duration=800m",
        _gen_diagonal,
        ("start", "end", "duration"),
    ),
    "diurnal": _Generator(
        "Poisson arrivals following a rate shape scaled to a QPM range (shape=azure or a file)",
        "diurnal:shape=azure,low=50,high=600,point=1m",
        _gen_diurnal,
        ("shape", "low", "high", "peak", "duration", "point", "start", "length"),
    ),
}
GENERATORS["constant"] = GENERATORS["poisson"]
GENERATORS["azure"] = _Generator(
    "the Azure Functions 2019 hourly shape (shipped), scaled to a QPM range",
    "azure:low=50,high=600,duration=800m",
    lambda p, seed: _gen_diurnal(p, seed, "azure"),
    GENERATORS["diurnal"].keys,
)


def _finish(
    trace: Trace, params: Mapping[str, str], kind: str, n_prompts: int | None, order: str | None, seed: int
) -> Trace:
    if "prompts" in params:
        try:
            n_prompts = int(params["prompts"])
        except ValueError:
            raise TraceError(f"trace spec {kind!r}: prompts={params['prompts']!r} is not an integer") from None
    order = params.get("order", order)
    if order is not None and order not in PROMPT_ORDERS:
        raise TraceError(f"trace spec {kind!r}: order must be one of {', '.join(PROMPT_ORDERS)}; got {order!r}")
    if "tiers" in params and trace.tier is None:
        trace = trace._replace(tier=assign_tiers(len(trace), _parse_tiers(params["tiers"], kind), seed=seed))
    if n_prompts is not None and trace.prompt_idx is None:
        if n_prompts < 1:
            raise TraceError(f"trace spec {kind!r}: prompts must be >= 1")
        trace = trace._replace(prompt_idx=assign_prompts(len(trace), n_prompts, order=order, seed=seed))
    return trace


def generate(spec: str, *, seed: int = 0, n_prompts: int | None = None, order: str | None = None) -> Trace:
    """A generated trace from a spec string ``kind:key=value,...``."""
    kind, params = parse_spec(spec)
    gen = GENERATORS.get(kind)
    if gen is None:
        raise TraceError(f"unknown trace generator {kind!r} (known: {', '.join(sorted(GENERATORS))})")
    allowed = set(gen.keys) | set(_COMMON_KEYS)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TraceError(
            f"trace spec {kind!r}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )
    if "seed" in params:
        try:
            seed = int(params["seed"])
        except ValueError:
            raise TraceError(f"trace spec {kind!r}: seed={params['seed']!r} is not an integer") from None
    trace = gen.build({k: v for k, v in params.items() if k not in _COMMON_KEYS}, seed)
    trace = trace._replace(source=spec)
    return _finish(trace, params, kind, n_prompts, order, seed)


# ---------------------------------------------------------------------------------------------
# File readers


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a UTF-8 text file ({exc.reason})") from None


def _first_data(lines: Sequence[str]) -> tuple[int, str] | None:
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#"):
            return i, line
    return None


def detect_format(path: str | Path) -> str:
    """The format of a trace file, judged from its first non-comment line."""
    p = Path(path)
    lines = _lines(p)
    first = _first_data(lines)
    if first is None:
        raise TraceError(f"{p}: empty trace file")
    lineno, line = first
    cells = [c.strip().lower() for c in line.split(",")]
    if cells[0] == "arrival_s":
        return "argusdiff"
    if "invocations" in cells:
        return "azure-hourly"
    if cells[0] == "hashowner" or (len(cells) > 100 and cells[-1] == "1440"):
        return "azure-minute"
    try:
        [float(c) for c in cells]
    except ValueError:
        raise TraceError(
            f"{p}:{lineno + 1}: cannot detect the trace format from {line[:80]!r} "
            f"(known formats: {', '.join(FORMATS)}; name one with --trace-format)"
        ) from None
    if len(cells) == 2:
        return "diffserve"
    if len(cells) == 3:
        return "proteus"
    raise TraceError(
        f"{p}:{lineno + 1}: {len(cells)} numeric fields; expected 2 (diffserve arrival_ms,prompt_idx) "
        f"or 3 (proteus start_ms,qos_level,deadline_ms)"
    )


def _num(p: Path, lineno: int, cell: str, what: str, *, integer: bool = False, minimum: float | None = 0.0) -> float:
    try:
        v = float(cell)
    except ValueError:
        raise TraceError(f"{p}:{lineno}: {what} is not a number: {cell!r}") from None
    if not math.isfinite(v):
        raise TraceError(f"{p}:{lineno}: {what} must be finite, got {cell!r}")
    if integer and v != int(v):
        raise TraceError(f"{p}:{lineno}: {what} must be an integer, got {cell!r}")
    if minimum is not None and v < minimum:
        raise TraceError(f"{p}:{lineno}: {what} must be >= {minimum:g}, got {cell!r}")
    return v


def _read_numeric_rows(p: Path, lines: Sequence[str], ncols: int, what: str) -> tuple[np.ndarray, list[int]]:
    rows, linenos = [], []
    for i, line in enumerate(lines, start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        cells = [c.strip() for c in s.split(",")]
        if len(cells) != ncols:
            raise TraceError(f"{p}:{i}: expected {ncols} fields ({what}), got {len(cells)}: {s[:80]!r}")
        rows.append(cells)
        linenos.append(i)
    if not rows:
        raise TraceError(f"{p}: no requests")
    return rows, linenos


def _read_diffserve(p: Path, lines: Sequence[str]) -> Trace:
    rows, linenos = _read_numeric_rows(p, lines, 2, "arrival_ms,prompt_idx")
    arr = np.empty(len(rows))
    idx = np.empty(len(rows), dtype=np.int64)
    for j, (cells, ln) in enumerate(zip(rows, linenos, strict=True)):
        arr[j] = _num(p, ln, cells[0], "arrival_ms") / 1000.0
        idx[j] = int(_num(p, ln, cells[1], "prompt_idx (1-based)", integer=True, minimum=1)) - 1
    return Trace(arrivals_s=arr, prompt_idx=idx, name=p.stem, source=str(p), format="diffserve")


def _read_proteus(p: Path, lines: Sequence[str]) -> Trace:
    rows, linenos = _read_numeric_rows(p, lines, 3, "start_ms,qos_level,deadline_ms")
    arr = np.empty(len(rows))
    slo = np.empty(len(rows))
    for j, (cells, ln) in enumerate(zip(rows, linenos, strict=True)):
        arr[j] = _num(p, ln, cells[0], "start_ms") / 1000.0
        _num(p, ln, cells[1], "qos_level", integer=True)  # validated; Proteus' classes have no T2I tier
        d = _num(p, ln, cells[2], "deadline_ms")
        if d <= 0:
            raise TraceError(f"{p}:{ln}: deadline_ms must be > 0, got {cells[2]!r}")
        slo[j] = d / 1000.0
    return Trace(arrivals_s=arr, slo_s=slo, name=p.stem, source=str(p), format="proteus")


def _read_argusdiff(p: Path, lines: Sequence[str]) -> Trace:
    meta: dict[str, str] = {}
    start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        key, _, value = lines[start].lstrip()[1:].partition(":")
        if key.strip():
            meta[key.strip()] = value.strip()
        start += 1
    header = [c.strip() for c in lines[start].split(",")]
    allowed = ("arrival_s", "prompt_idx", "slo_s", "tier")
    bad = [h for h in header if h not in allowed]
    if header[0] != "arrival_s" or bad or len(set(header)) != len(header):
        raise TraceError(f"{p}:{start + 1}: header must be arrival_s[,prompt_idx][,slo_s][,tier]; got {header}")
    col = {h: i for i, h in enumerate(header)}
    arr, idx, slo, tier = [], [], [], []
    for ln, rec in enumerate(csv.reader(io.StringIO("\n".join(lines[start + 1 :]))), start=start + 2):
        if not rec or (len(rec) == 1 and not rec[0].strip()):
            continue
        if len(rec) != len(header):
            raise TraceError(f"{p}:{ln}: expected {len(header)} fields ({','.join(header)}), got {len(rec)}")
        arr.append(_num(p, ln, rec[0], "arrival_s"))
        if "prompt_idx" in col:
            idx.append(int(_num(p, ln, rec[col["prompt_idx"]], "prompt_idx", integer=True)))
        if "slo_s" in col:
            v = _num(p, ln, rec[col["slo_s"]], "slo_s")
            if v <= 0:
                raise TraceError(f"{p}:{ln}: slo_s must be > 0, got {rec[col['slo_s']]!r}")
            slo.append(v)
        if "tier" in col:
            t = rec[col["tier"]].strip()
            if not t:
                raise TraceError(f"{p}:{ln}: empty tier")
            tier.append(t)
    if not arr:
        raise TraceError(f"{p}: no requests")
    duration = None
    if "duration_s" in meta:
        try:
            duration = float(meta["duration_s"])
        except ValueError:
            raise TraceError(f"{p}: metadata duration_s is not a number: {meta['duration_s']!r}") from None
    return Trace(
        arrivals_s=np.array(arr),
        prompt_idx=np.array(idx, dtype=np.int64) if "prompt_idx" in col else None,
        slo_s=np.array(slo) if "slo_s" in col else None,
        tier=tuple(tier) if "tier" in col else None,
        name=meta.get("name", p.stem),
        source=meta.get("source", str(p)),
        format="argusdiff",
        duration=duration,
    )


def _read_azure_minute(p: Path, lines: Sequence[str], *, seed: int, scaling: Mapping[str, float | None]) -> Trace:
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = [c.strip() for c in rows[0]]
    try:
        first_minute = header.index("1")
    except ValueError:
        raise TraceError(f"{p}:1: Azure per-minute header needs minute columns 1..1440") from None
    minutes = header[first_minute:]
    counts = np.zeros(len(minutes))
    for ln, rec in enumerate(rows[1:], start=2):
        if not rec:
            continue
        if len(rec) != len(header):
            raise TraceError(f"{p}:{ln}: expected {len(header)} fields, got {len(rec)}")
        try:
            row = np.array(rec[first_minute:], dtype=np.float64)
            ok = bool(np.all(np.isfinite(row)) and row.min() >= 0)
        except ValueError:
            ok = False
        if not ok:  # find and name the bad cell
            for j, cell in enumerate(rec[first_minute:]):
                _num(p, ln, cell, f"minute {minutes[j]} count")
        counts += row
    if not counts.any():
        raise TraceError(f"{p}: no invocations")
    if any(v is not None for v in scaling.values()):
        rates = scale_shape(counts, **scaling)
        times = np.arange(len(rates) + 1) * 60.0
        tr = rate_curve_trace(times, np.append(rates, rates[-1]), seed=seed, step=True, name=p.stem, source=str(p))
        return tr._replace(format="azure-minute")
    # unscaled: exactly the counted invocations, spread uniformly at random within each minute
    if counts.sum() > MAX_REQUESTS:
        raise TraceError(
            f"{p}: {counts.sum():,.0f} invocations (limit {MAX_REQUESTS:,}); scale the shape with "
            "low=/high= or peak= (QPM)"
        )
    rng = np.random.default_rng(seed)
    c = counts.astype(np.int64)
    base = np.repeat(np.arange(len(c)) * 60.0, c)
    arr = np.sort(base + rng.uniform(0.0, 60.0, size=base.size))
    return Trace(arrivals_s=arr, name=p.stem, source=str(p), format="azure-minute", duration=60.0 * len(c))


def read_trace(
    path: str | Path,
    *,
    format: str | None = None,
    seed: int = 0,
    low: float | None = None,
    high: float | None = None,
    peak: float | None = None,
    point_s: float = 60.0,
    duration_s: float | None = None,
) -> Trace:
    """Read a trace file (format detected unless given). ``low``/``high``/``peak`` scale Azure
    shapes (hourly shapes default to 50..600 QPM, one shape point per ``point_s``)."""
    p = Path(path)
    fmt = format or detect_format(p)
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    lines = _lines(p)
    if fmt == "diffserve":
        return _read_diffserve(p, lines)
    if fmt == "proteus":
        return _read_proteus(p, lines)
    if fmt == "argusdiff":
        return _read_argusdiff(p, lines)
    if fmt == "azure-minute":
        return _read_azure_minute(p, lines, seed=seed, scaling={"low": low, "high": high, "peak": peak})
    # azure-hourly shape
    if peak is None and low is None and high is None:
        low, high = 50.0, 600.0
    tr = diurnal(p, low=low, high=high, peak=peak, duration_s=duration_s, point_s=point_s, seed=seed, name=p.stem)
    return tr._replace(format="azure-hourly", source=str(p))


def _looks_like_spec(text: str) -> bool:
    kind = text.partition(":")[0].strip().lower()
    return kind in GENERATORS and not Path(text).exists()


_FILE_OPTIONS = (
    "format",
    "seed",
    "low",
    "high",
    "peak",
    "point",
    "mean_qpm",
    "peak_qpm",
    "start",
    "end",
    "prompts",
    "order",
)


def _file_options(text: str) -> tuple[Path, dict[str, str]] | None:
    """``path@key=value,...`` → (path, options) when ``path`` exists."""
    if "@" not in text:
        return None
    base, _, opts = text.rpartition("@")
    if not Path(base).exists():
        return None
    _, params = parse_spec("file:" + opts)
    unknown = sorted(set(params) - set(_FILE_OPTIONS))
    if unknown:
        raise TraceError(
            f"trace {text!r}: unknown option(s) {', '.join(unknown)} after '@' (allowed: {', '.join(_FILE_OPTIONS)})"
        )
    return Path(base), params


def load_trace(
    spec_or_path: str | Path,
    *,
    seed: int = 0,
    format: str | None = None,
    n_prompts: int | None = None,
    order: str | None = None,
    mean_qpm: float | None = None,
    peak_qpm: float | None = None,
    **scaling,
) -> Trace:
    """A trace from a generator spec (``bursty:low=60,...``), a file path, or a shipped name
    (``azure``); ``n_prompts`` assigns prompt indices when the trace has none; ``mean_qpm`` or
    ``peak_qpm`` rescale it in time (:meth:`Trace.rescale`).

    A file path may carry options after ``@``: ``twitter.txt@mean_qpm=100,start=0,end=300``
    (``format``, ``seed``, ``low``/``high``/``peak``/``point`` for Azure shapes, ``mean_qpm`` /
    ``peak_qpm``, a window ``start``/``end`` in seconds after rescaling, ``prompts``, ``order``);
    they override the keyword arguments."""
    text = str(spec_or_path)
    if _looks_like_spec(text):
        trace = generate(text, seed=seed, n_prompts=n_prompts, order=order)
        return _rescaled(trace, mean_qpm, peak_qpm, None, None)
    opts: dict[str, str] = {}
    p = Path(text)
    if not p.exists():
        parsed = _file_options(text)
        if parsed is None:
            raise TraceError(
                f"trace {text!r}: no such file and not a generator spec (generators: "
                f"{', '.join(sorted(GENERATORS))}; e.g. {GENERATORS['bursty'].example})"
            )
        p, opts = parsed
    where = text
    if "format" in opts:
        format = opts["format"]
    if "seed" in opts:
        seed = int(_take(opts, "seed", kind=where, conv=int))
    for key in ("low", "high", "peak"):
        if key in opts:
            scaling[key] = _take(opts, key, kind=where, conv=_rate(key))
    if "point" in opts:
        scaling["point_s"] = _take(opts, "point", kind=where, conv=_dur("point"))
    if "mean_qpm" in opts:
        mean_qpm = _take(opts, "mean_qpm", kind=where, conv=_rate("mean_qpm"))
    if "peak_qpm" in opts:
        peak_qpm = _take(opts, "peak_qpm", kind=where, conv=_rate("peak_qpm"))
    start = _take(opts, "start", kind=where, conv=_dur("start")) if "start" in opts else None
    end = _take(opts, "end", kind=where, conv=_dur("end")) if "end" in opts else None
    trace = read_trace(p, format=format, seed=seed, **scaling)
    trace = _rescaled(trace, mean_qpm, peak_qpm, start, end)
    return _finish(
        trace, {k: v for k, v in opts.items() if k in ("prompts", "order", "tiers")}, p.name, n_prompts, order, seed
    )


def _rescaled(trace: Trace, mean_qpm, peak_qpm, start, end) -> Trace:
    if mean_qpm is not None or peak_qpm is not None:
        for key, v in (("mean_qpm", mean_qpm), ("peak_qpm", peak_qpm)):
            if v is not None and not v > 0:
                raise TraceError(f"{key} must be > 0, got {v:g}")
        trace = trace.rescale(mean_qpm=mean_qpm, peak_qpm=peak_qpm)
    if start is not None or end is not None:
        a = start or 0.0
        if end is not None and end <= a:
            raise TraceError(f"trace window: end ({end:g} s) must be after start ({a:g} s)")
        trace = trace.window(a, end)
    return trace


def write_trace(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` in the native ``argusdiff`` CSV format (round-trips through ``load_trace``)."""
    buf = io.StringIO()
    buf.write(f"# name: {trace.name}\n")
    buf.write(f"# source: {trace.source.replace(chr(10), ' ')}\n")
    buf.write(f"# duration_s: {trace.duration_s!r}\n")
    cols = ["arrival_s"]
    if trace.prompt_idx is not None:
        cols.append("prompt_idx")
    if trace.slo_s is not None:
        cols.append("slo_s")
    if trace.tier is not None:
        cols.append("tier")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    n = len(trace)
    for i in range(n):
        row = [repr(float(trace.arrivals_s[i]))]
        if trace.prompt_idx is not None:
            row.append(str(int(trace.prompt_idx[i])))
        if trace.slo_s is not None:
            row.append(repr(float(trace.slo_s[i])))
        if trace.tier is not None:
            row.append(trace.tier[i])
        writer.writerow(row)
    Path(path).write_text(buf.getvalue(), encoding="utf-8")


def list_traces() -> list[dict[str, str]]:
    """The generator kinds and shipped shapes, with an example spec each."""
    out = [{"name": k, "kind": "generator", "help": g.help, "example": g.example} for k, g in GENERATORS.items()]
    for name, path in SHAPES.items():
        out.append(
            {
                "name": f"shape:{name}",
                "kind": "shape",
                "help": f"rate shape {path.name} (see traces/data/SOURCES.md)",
                "example": f"diurnal:shape={name},low=50,high=600",
            }
        )
    return out
