"""Trace generators, the spec language that names them, and rate shapes.

Generators are named by a spec string ``kind:key=value,...`` (see :data:`GENERATORS`), e.g.
``bursty:low=60,high=480,period=5m,duration=40m`` or ``diagonal:start=50,end=600,duration=800m``.

Durations accept ``s``/``m``/``h`` suffixes (bare numbers are seconds); rates are QPM (a
``qps`` suffix converts). Every spec also takes ``seed=``, ``prompts=N`` (assign prompt indices
in ``[0, N)``), ``order=random|sequential`` (sequential walks through the prompt set, which
avoids the near-duplicate cache hits of drawing uniformly from a small set) and ``tiers=I/S/B``
(shares of the interactive/standard/batch tiers).

Every generator draws Poisson arrivals from a rate curve (:func:`rate_curve_trace`).
Shape-preserving scaling maps a rate curve affinely so its minimum becomes ``low`` and its
maximum ``high`` QPM (DiffServe scales the Azure Functions trace this way); ``peak=`` instead
multiplies the curve so its maximum is ``peak`` QPM.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.trace import MAX_REQUESTS, PROMPT_ORDERS, Trace, TraceError, assign_prompts, assign_tiers

__all__ = [
    "COMMON_KEYS",
    "GENERATORS",
    "SHAPES",
    "apply_common_keys",
    "bursty",
    "diagonal",
    "diurnal",
    "duration_reader",
    "generate",
    "is_spec",
    "list_traces",
    "load_shape",
    "parse_duration",
    "parse_rate",
    "parse_spec",
    "poisson",
    "rate_curve_trace",
    "rate_reader",
    "scale_shape",
    "spec_value",
]

DATA_DIR = Path(__file__).parent / "data"
#: Shipped rate shapes (see traces/data/SOURCES.md).
SHAPES: dict[str, Path] = {"azure": DATA_DIR / "azure_functions_2019_hourly.csv"}

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


def spec_value(params: Mapping[str, str], key: str, default=None, *, kind: str, conv=float):
    """``params[key]`` read by ``conv`` (``default`` when absent; required when that is None),
    a bad value raising :class:`TraceError` that names the spec ``kind`` and the key."""
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


def rate_reader(key: str) -> Callable[[str], float]:
    """A ``conv`` for :func:`spec_value` that reads a rate in QPM (:func:`parse_rate`)."""
    return lambda v: parse_rate(v, key)


def duration_reader(key: str) -> Callable[[str], float]:
    """A ``conv`` for :func:`spec_value` that reads a duration in seconds (:func:`parse_duration`)."""
    return lambda v: parse_duration(v, key)


def _gen_poisson(p, seed):
    qpm = spec_value(p, "qpm", kind="poisson", conv=rate_reader("qpm"))
    dur = spec_value(p, "duration", 600.0, kind="poisson", conv=duration_reader("duration"))
    return poisson(qpm, dur, seed=seed, name=f"poisson:qpm={qpm:g},duration={dur:g}s")


def _gen_bursty(p, seed):
    low = spec_value(p, "low", 60.0, kind="bursty", conv=rate_reader("low"))
    high = spec_value(p, "high", 480.0, kind="bursty", conv=rate_reader("high"))
    period = spec_value(p, "period", 300.0, kind="bursty", conv=duration_reader("period"))
    hp = spec_value(p, "high_period", period, kind="bursty", conv=duration_reader("high_period"))
    dur = spec_value(p, "duration", 2400.0, kind="bursty", conv=duration_reader("duration"))
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
    start = spec_value(p, "start", 50.0, kind="diagonal", conv=rate_reader("start"))
    end = spec_value(p, "end", 600.0, kind="diagonal", conv=rate_reader("end"))
    dur = spec_value(p, "duration", 48000.0, kind="diagonal", conv=duration_reader("duration"))
    return diagonal(start, end, dur, seed=seed, name=f"diagonal:start={start:g},end={end:g},duration={dur:g}s")


def _gen_diurnal(p, seed, default_shape="azure"):
    shape = p.get("shape", default_shape)
    peak = spec_value(p, "peak", -1.0, kind="diurnal", conv=rate_reader("peak"))
    low = spec_value(p, "low", 50.0, kind="diurnal", conv=rate_reader("low"))
    high = spec_value(p, "high", 600.0, kind="diurnal", conv=rate_reader("high"))
    dur = spec_value(p, "duration", -1.0, kind="diurnal", conv=duration_reader("duration")) if "duration" in p else None
    point = spec_value(p, "point", 60.0, kind="diurnal", conv=duration_reader("point"))
    start = spec_value(p, "start", 0, kind="diurnal", conv=int)
    length = spec_value(p, "length", -1, kind="diurnal", conv=int)
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


COMMON_KEYS = ("seed", "prompts", "order", "tiers")


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
GENERATORS["constant"] = _Generator(
    "the same as poisson: Poisson arrivals at a constant rate",
    "constant:qpm=120,duration=30m",
    _gen_poisson,
    GENERATORS["poisson"].keys,
)
GENERATORS["azure"] = _Generator(
    "the Azure Functions 2019 hourly shape (shipped), scaled to a QPM range",
    "azure:low=50,high=600,duration=800m",
    lambda p, seed: _gen_diurnal(p, seed, "azure"),
    GENERATORS["diurnal"].keys,
)


def apply_common_keys(
    trace: Trace, params: Mapping[str, str], kind: str, n_prompts: int | None, order: str | None, seed: int
) -> Trace:
    """``trace`` with the keys every spec (and a file's ``@`` options) takes applied: ``prompts=``
    and ``order=`` assign prompt indices, ``tiers=I/S/B`` assigns tiers, where the trace has none."""
    if "prompts" in params:
        try:
            n_prompts = int(params["prompts"])
        except ValueError:
            raise TraceError(f"trace spec {kind!r}: prompts={params['prompts']!r} is not an integer") from None
    order = params.get("order", order)
    if order is not None and order not in PROMPT_ORDERS:
        raise TraceError(f"trace spec {kind!r}: order must be one of {', '.join(PROMPT_ORDERS)}; got {order!r}")
    if "tiers" in params and trace.tier is None:
        trace = trace.replace(tier=assign_tiers(len(trace), _parse_tiers(params["tiers"], kind), seed=seed))
    if n_prompts is not None and trace.prompt_idx is None:
        if n_prompts < 1:
            raise TraceError(f"trace spec {kind!r}: prompts must be >= 1")
        trace = trace.replace(prompt_idx=assign_prompts(len(trace), n_prompts, order=order, seed=seed))
    return trace


def generate(spec: str, *, seed: int = 0, n_prompts: int | None = None, order: str | None = None) -> Trace:
    """A generated trace from a spec string ``kind:key=value,...``."""
    kind, params = parse_spec(spec)
    gen = GENERATORS.get(kind)
    if gen is None:
        raise TraceError(f"unknown trace generator {kind!r} (known: {', '.join(sorted(GENERATORS))})")
    allowed = set(gen.keys) | set(COMMON_KEYS)
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
    trace = gen.build({k: v for k, v in params.items() if k not in COMMON_KEYS}, seed)
    trace = trace.replace(source=spec)
    return apply_common_keys(trace, params, kind, n_prompts, order, seed)


def is_spec(text: str) -> bool:
    """Whether ``text`` names a generator (``kind:...``) rather than an existing file."""
    kind = text.partition(":")[0].strip().lower()
    return kind in GENERATORS and not Path(text).exists()


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
