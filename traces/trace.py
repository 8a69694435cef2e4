"""The request trace: the :class:`Trace` model and the per-request data assigned to it.

A :class:`Trace` is a sorted array of arrival times (seconds from the trace start), optional
prompt indices (0-based, into whatever prompt set the replay uses), and optional per-request SLO
(seconds) and tier. It validates itself, rescales in time, cuts windows and summarises its load.
:func:`assign_prompts` and :func:`assign_tiers` draw the prompt indices and tiers of a trace that
carries none.

Where traces come from: :mod:`traces.generators` (generators, spec strings ``kind:key=value,...``
and rate shapes) and :mod:`traces.formats` (the trace file formats, :func:`~traces.formats.load_trace`
and :func:`~traces.formats.write_trace`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from argusdiff.domain import TIER_PRIORITY
from argusdiff.errors import ConfigError

__all__ = [
    "MAX_REQUESTS",
    "PROMPT_ORDERS",
    "TIERS",
    "Trace",
    "TraceError",
    "assign_prompts",
    "assign_tiers",
    "default_prompt_order",
]

PROMPT_ORDERS = ("random", "sequential")
MAX_REQUESTS = 50_000_000  # a generated trace larger than this is a typo, not a workload
TIERS: tuple[str, ...] = TIER_PRIORITY  # the argusdiff.domain.Tier values, interactive first


class TraceError(ConfigError):
    """A trace file, spec string or generator parameter is invalid (the message says where)."""


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
        return self.replace(prompt_idx=self.prompt_indices(n_prompts, order=order, seed=seed, wrap=wrap))

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
        return self.replace(
            arrivals_s=self.arrivals_s / factor,
            duration=None if self.duration is None else self.duration / factor,
        )

    def replace(self, **changes) -> Trace:
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
    from traces.settings import traces_settings

    return traces_settings().prompt_order


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


def assign_tiers(n: int, shares: Sequence[float], *, seed: int = 0) -> tuple[str, ...]:
    """Per-request tiers drawn with the given shares of interactive/standard/batch."""
    w = np.asarray(shares, dtype=np.float64)
    if w.shape != (3,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise TraceError(f"tiers: need three shares >= 0 (interactive/standard/batch), got {list(shares)}")
    draw = np.random.default_rng([seed, 0x7135]).choice(3, size=n, p=w / w.sum())
    names = np.array(TIERS, dtype=object)
    return tuple(names[draw])
