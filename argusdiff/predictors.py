"""Predictors for the control path: the demand predictor W_t every policy plans for, and the
affinity histogram H over the last classified prompts (ARGUS §4.2).

Both are plain, deterministic objects (no clock, no I/O) shared by the simulator and the service.

**Demand.** One component, :class:`DemandPredictor`, configured by a :class:`PredictorSpec`, is
what every policy sizes capacity with, so a comparison can give every policy the same reading and
the same margin. Arrivals are counted in bins of ``bin_s`` seconds (the control path passes the
period's arrivals, split into sub-period bins when it has them); the prediction is one of

* ``ewma`` — an exponentially weighted moving average of the bin rates (the mean reading; with a
  window of ``window_s``, weights renormalised over the window as pandas' ``ewm(adjust=True)``);
* ``peak`` — the highest bin rate within the last ``window_s`` seconds (the recent peak);
* ``quantile`` — the ``q`` quantile of the bin rates within the last ``window_s`` seconds;

times ``margin`` (the headroom, ≥ 1). :data:`PREDICTORS` names the readings used in the docs,
including each baseline's source reading (``diffserve-artifact``, ``proteus-artifact``,
``argus-paper``). :meth:`DemandPredictor.state` / :meth:`DemandPredictor.from_state` export and
restore a predictor as plain JSON (e.g. to hand it to another router on failover).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from itertools import islice
from typing import Any

from argusdiff.errors import ConfigError

__all__ = [
    "DEFAULT_PREDICTOR",
    "PREDICTORS",
    "PREDICTOR_KINDS",
    "AffinityHistogram",
    "DemandPredictor",
    "EwmaDemand",
    "PredictorSpec",
    "arrival_bins",
    "bin_length_s",
    "predictor_spec",
]


class EwmaDemand:
    """Exponentially weighted moving average of the observed demand (QPM).

    ``alpha`` is the weight of the newest observation. With ``window`` set, only the last
    ``window`` observations count (weights alpha * (1 - alpha)^k, renormalised over the window),
    so a long-gone burst stops influencing the prediction after ``window`` periods. Without a
    window it is the classic recursion ``p <- alpha * x + (1 - alpha) * p`` started at the first
    observation.
    """

    def __init__(self, alpha: float = 0.5, window: int | None = None, initial_qpm: float | None = None):
        if not (0.0 < alpha <= 1.0) or math.isnan(alpha):
            raise ConfigError(f"ewma_alpha: must be in (0, 1], got {alpha}")
        if window is not None and window < 1:
            raise ConfigError(f"window: must be >= 1 periods, got {window}")
        if initial_qpm is not None and not (math.isfinite(initial_qpm) and initial_qpm >= 0):
            raise ConfigError(f"initial_qpm: must be a finite number >= 0, got {initial_qpm}")
        self.alpha = float(alpha)
        self.window = window
        self._history: deque[float] = deque(maxlen=window) if window else deque(maxlen=1)
        self._predicted: float | None = initial_qpm
        self.observations = 0

    @property
    def predicted(self) -> float:
        """The current prediction (QPM); 0 before any observation."""
        return 0.0 if self._predicted is None else self._predicted

    def update(self, observed_qpm: float) -> float:
        """Add one period's observed demand (QPM); returns the new prediction."""
        x = float(observed_qpm)
        if not (math.isfinite(x) and x >= 0):
            raise ConfigError(f"observed_qpm: must be a finite number >= 0, got {observed_qpm}")
        self.observations += 1
        if self.window:
            self._history.append(x)
            a = self.alpha
            num = den = 0.0
            for k, value in enumerate(reversed(self._history)):
                w = a * (1.0 - a) ** k
                num += w * value
                den += w
            self._predicted = num / den
        elif self._predicted is None:
            self._predicted = x
        else:
            self._predicted = self.alpha * x + (1.0 - self.alpha) * self._predicted
        return self._predicted

    def update_arrivals(self, arrivals: int, period_s: float) -> float:
        """Add one period given as an arrival count over ``period_s`` seconds."""
        if not period_s > 0:
            raise ConfigError(f"period_s: must be > 0, got {period_s}")
        return self.update(arrivals * 60.0 / period_s)


PREDICTOR_KINDS = ("ewma", "peak", "quantile")


@dataclass(frozen=True)
class PredictorSpec:
    """How demand is predicted (see the module doc). Durations in seconds, rates in QPM.

    ``window_s`` is the look-back of ``peak`` and ``quantile``; for ``ewma`` it bounds the average
    to the last ``window_s / bin_s`` bins (0: the unbounded recursion). ``skip_idle`` leaves bins
    without arrivals out of the ``ewma`` (DiffServe's controller records demand only when it is
    positive).
    """

    kind: str = "peak"
    bin_s: float = 10.0
    window_s: float = 60.0
    alpha: float = 0.5
    q: float = 0.9
    margin: float = 1.0
    skip_idle: bool = False

    def __post_init__(self) -> None:
        if self.kind not in PREDICTOR_KINDS:
            raise ConfigError(f"predictor: unknown kind {self.kind!r}; choose one of {', '.join(PREDICTOR_KINDS)}")
        if not (math.isfinite(self.bin_s) and self.bin_s > 0):
            raise ConfigError(f"predictor bin: must be > 0 s, got {self.bin_s}")
        if not (math.isfinite(self.window_s) and self.window_s >= 0):
            raise ConfigError(f"predictor window: must be >= 0 s, got {self.window_s}")
        if self.kind != "ewma" and self.window_s < self.bin_s:
            raise ConfigError(f"predictor window: must hold at least one bin ({self.bin_s:g} s), got {self.window_s:g}")
        if not (0.0 < self.alpha <= 1.0):
            raise ConfigError(f"predictor alpha: must be in (0, 1], got {self.alpha}")
        if not (0.0 <= self.q <= 1.0):
            raise ConfigError(f"predictor q: must be in [0, 1], got {self.q}")
        if not (math.isfinite(self.margin) and self.margin >= 1.0):
            raise ConfigError(f"predictor margin: must be >= 1, got {self.margin}")

    @property
    def window_bins(self) -> int:
        """Bins the reading looks back over (0: unbounded, ``ewma`` only)."""
        return max(1, round(self.window_s / self.bin_s)) if self.window_s > 0 else 0

    def describe(self) -> str:
        """One line for reports, e.g. ``peak of 10 s rates over 60 s``."""
        if self.kind == "ewma":
            what = f"EWMA (alpha {self.alpha:.3g}) of {self.bin_s:g} s rates"
            if self.window_s > 0:
                what += f" over {self.window_bins} bins"
            if self.skip_idle:
                what += ", idle bins skipped"
        elif self.kind == "peak":
            what = f"peak of {self.bin_s:g} s rates over {self.window_s:g} s"
        else:
            what = f"q{self.q:g} of {self.bin_s:g} s rates over {self.window_s:g} s"
        return what + (f" x {self.margin:g}" if self.margin != 1.0 else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PredictorSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"predictor: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**dict(data))


#: Named readings. ``peak`` is the default (docs/results.md, "Demand predictor", has the evidence).
PREDICTORS: dict[str, PredictorSpec] = {
    # the recent peak: the highest 10 s rate of the last minute
    "peak": PredictorSpec(kind="peak", bin_s=10.0, window_s=60.0),
    # an upper quantile: the 90th percentile of the 10 s rates of the last 5 minutes
    "quantile": PredictorSpec(kind="quantile", bin_s=10.0, window_s=300.0, q=0.9),
    # the mean: EWMA (alpha 0.5) of per-minute rates
    "ewma": PredictorSpec(kind="ewma", bin_s=60.0, window_s=0.0, alpha=0.5),
    # ARGUS §4.2 says only "the expected workload W_t ... using the past workload"; read as the
    # mean reading over the paper's 1-minute solve period
    "argus-paper": PredictorSpec(kind="ewma", bin_s=60.0, window_s=0.0, alpha=0.5),
    # DiffServe artifact, src/controller/controller.py: demand refreshed every 1 s, pandas
    # ewm(com=2.1) over the last 20 positive samples (EWMA_WINDOW, DEFAULT_EWMA_DECAY); the
    # over-provisioning factor is the paper's lambda = 1.05 (§3.3; the controller code uses 1.2)
    "diffserve-artifact": PredictorSpec(
        kind="ewma", bin_s=1.0, window_s=20.0, alpha=1.0 / 3.1, margin=1.05, skip_idle=True
    ),
    # Proteus artifact, configs/*/proteus.json and core/simulator.py: 1 s demand samples, pandas
    # ewm(com=ewma_decay = 1.6) over a 20-sample window, beta = 1.05 capacity over demand
    "proteus-artifact": PredictorSpec(kind="ewma", bin_s=1.0, window_s=20.0, alpha=1.0 / 2.6, margin=1.05),
    # Sommelier as the Proteus artifact configures it (configs/*/sommelier.json): the same EWMA,
    # beta = 1.5
    "sommelier-artifact": PredictorSpec(kind="ewma", bin_s=1.0, window_s=20.0, alpha=1.0 / 2.6, margin=1.5),
}
DEFAULT_PREDICTOR = "peak"

_KEYS = {"bin": "bin_s", "window": "window_s", "alpha": "alpha", "q": "q", "margin": "margin", "skip_idle": "skip_idle"}


def _seconds(key: str, text: str) -> float:
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 0.001
    elif t.endswith("s"):
        t = t[:-1]
    elif t.endswith("m"):
        t, scale = t[:-1], 60.0
    elif t.endswith("h"):
        t, scale = t[:-1], 3600.0
    try:
        return float(t) * scale
    except ValueError:
        raise ConfigError(f"predictor {key}: {text!r} is not a duration (e.g. 10s, 1m)") from None


def predictor_spec(value: PredictorSpec | str | Mapping[str, Any] | None) -> PredictorSpec:
    """A spec from a name in :data:`PREDICTORS`, a ``kind:key=value,...`` string (keys ``bin``,
    ``window``, ``alpha``, ``q``, ``margin``, ``skip_idle``; a named reading may stand for the
    kind: ``peak:margin=1.2``), a mapping of :class:`PredictorSpec` fields, or None (the default)."""
    if value is None:
        return PREDICTORS[DEFAULT_PREDICTOR]
    if isinstance(value, PredictorSpec):
        return value
    if isinstance(value, Mapping):
        return PredictorSpec.from_dict(value)
    if not isinstance(value, str):
        raise ConfigError(f"predictor: expected a name or a spec string, got {value!r}")
    head, _, rest = value.strip().partition(":")
    head = head.strip()
    base = PREDICTORS.get(head)  # every kind has a named reading of its own name
    if base is None:
        raise ConfigError(f"predictor: unknown reading {head!r}; named readings: {', '.join(PREDICTORS)}")
    changes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise ConfigError(f"predictor: bad option {part!r}; keys: {', '.join(_KEYS)}")
        if key in ("bin", "window"):
            changes[_KEYS[key]] = _seconds(key, val)
        elif key == "skip_idle":
            changes["skip_idle"] = val.strip().lower() in ("1", "true", "yes", "on")
        else:
            try:
                changes[_KEYS[key]] = float(val)
            except ValueError:
                raise ConfigError(f"predictor {key}: {val!r} is not a number") from None
    return replace(base, **changes) if changes else base


#: the longest sub-period bin the control path counts arrivals in (a reading's own bins, when
#: shorter, are used instead: :func:`bin_length_s`)
MAX_ARRIVAL_BIN_S = 1.0


def bin_length_s(spec: PredictorSpec) -> float:
    """The bin the control path counts a period's arrivals in for ``spec``: the longest whole
    fraction of the reading's bin that is at most 1 s (1 s for 10 s or 60 s bins, 0.833 s for
    2.5 s bins, the reading's own bin when shorter than 1 s), so that the reading's bins are made
    of whole counting bins."""
    return spec.bin_s / max(1, math.ceil(spec.bin_s / MAX_ARRIVAL_BIN_S - 1e-9))


def arrival_bins(
    times: Iterable[float], start_s: float, span_s: float, bin_s: float = MAX_ARRIVAL_BIN_S
) -> tuple[tuple[int, ...], float]:
    """The arrival times of the period ``[start_s, start_s + span_s)`` counted in consecutive
    bins aligned to the period's start (oldest first), and the bin length: ``round(span / bin_s)``
    bins of equal length. A time before the start counts in the first bin and one at or after
    the end in the last, so the bins always sum to the period's arrivals. The simulator and the
    live control loop both bin with this function, by each arrival's own time."""
    if not (math.isfinite(span_s) and span_s > 0):
        raise ConfigError(f"span_s: must be > 0, got {span_s}")
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ConfigError(f"bin_s: must be > 0, got {bin_s}")
    nb = max(1, round(span_s / bin_s))
    scale = nb / span_s
    last = nb - 1
    bins = [0] * nb
    for t in times:
        k = math.floor((t - start_s) * scale)
        bins[0 if k < 0 else last if k > last else k] += 1
    return tuple(bins), span_s / nb


class DemandPredictor:
    """The demand W_t (QPM) a policy plans for, from the arrivals observed so far.

    ``observe(arrivals, period_s, bins=, bin_s=)`` adds one control period; ``bins`` (counts of
    consecutive sub-periods of ``bin_s`` seconds, oldest first) let a reading with bins shorter
    than the period see the rate within it. Without them the period is one observation. Arrivals
    of an incomplete bin wait for the rest of it. ``predicted`` is the reading times the margin;
    ``estimate`` the reading alone.
    """

    def __init__(self, spec: PredictorSpec | str | Mapping[str, Any] | None = None) -> None:
        self.spec = predictor_spec(spec)
        s = self.spec
        keep = s.window_bins if s.window_bins else 1
        self._bins: deque[float] = deque(maxlen=keep)  # completed bin rates (QPM), oldest first
        self._ewma = EwmaDemand(alpha=s.alpha, window=s.window_bins or None) if s.kind == "ewma" else None
        self._pending = [0.0, 0.0]  # arrivals and seconds of the incomplete bin
        self.observations = 0

    # -- observing ---------------------------------------------------------------------------

    def _close(self, count: float, seconds: float) -> None:
        rate = count * 60.0 / seconds
        if self._ewma is not None:
            if self.spec.skip_idle and count <= 0:
                return
            self._ewma.update(rate)
        self._bins.append(rate)

    def _add(self, count: float, seconds: float) -> None:
        """``count`` arrivals over ``seconds``, split into bins of ``bin_s``."""
        b = self.spec.bin_s
        p = self._pending
        if seconds >= b and p[1] <= 1e-9:
            # a whole observation of at least one bin: as many full bins as fit, evenly
            n = int(seconds // b + 1e-9)
            rest = seconds - n * b
            per = count * (b / seconds)
            for _ in range(n):
                self._close(per, b)
            if rest > 1e-9:
                p[0], p[1] = count - per * n, rest
            return
        p[0] += count
        p[1] += seconds
        if p[1] >= b - 1e-9:
            self._close(p[0], p[1])
            p[0] = p[1] = 0.0

    def observe(self, arrivals: float, period_s: float, bins: Sequence[float] = (), bin_s: float = 0.0) -> float:
        """Add one period (``arrivals`` over ``period_s`` seconds); returns :attr:`predicted`."""
        if not (math.isfinite(period_s) and period_s > 0):
            raise ConfigError(f"period_s: must be > 0, got {period_s}")
        if not (math.isfinite(arrivals) and arrivals >= 0):
            raise ConfigError(f"arrivals: must be a finite number >= 0, got {arrivals}")
        self.observations += 1
        if (
            bins
            and bin_s > 0
            and bin_s <= self.spec.bin_s * 1.01  # live bins are the period split evenly: ~1 s, not exactly
            and abs(len(bins) * bin_s - period_s) < 1e-6 * period_s + 1e-9
        ):
            # a live period is a few microseconds off its nominal length, so are its bins: a bin
            # within 1 % of a whole fraction of the reading's bin counts as exactly that fraction
            # (else a 0.9999999 s bin leaves the 1 s bin open and the next bin's arrivals join it)
            k = max(1, round(self.spec.bin_s / bin_s))
            exact = self.spec.bin_s / k
            step = exact if abs(bin_s - exact) <= 0.01 * exact else bin_s
            for c in bins:
                self._add(float(c), step)
        else:
            self._add(float(arrivals), float(period_s))
        return self.predicted

    def observe_stats(self, stats: Any) -> float:
        """Add the period a :class:`argusdiff.domain.ClusterStats` describes."""
        return self.observe(stats.arrivals, stats.period_s, stats.arrival_bins, stats.bin_s)

    def peek(self, stats: Any) -> float:
        """The :attr:`estimate` (QPM) this predictor would read had it observed ``stats`` (a
        period so far: :attr:`argusdiff.domain.PlanTrigger.CHECK`), without observing it."""
        probe = DemandPredictor.__new__(DemandPredictor)
        probe.spec = self.spec
        probe._bins = deque(self._bins, maxlen=self._bins.maxlen)
        probe._ewma = None
        if self._ewma is not None:
            e = self._ewma
            probe._ewma = EwmaDemand(alpha=e.alpha, window=e.window)
            probe._ewma._predicted = e._predicted
            probe._ewma._history.extend(e._history)
            probe._ewma.observations = e.observations
        probe._pending = list(self._pending)
        probe.observations = self.observations
        probe.observe_stats(stats)
        return probe.estimate

    # -- reading -----------------------------------------------------------------------------

    @property
    def estimate(self) -> float:
        """The reading (QPM) without the margin; before a full bin, the rate seen so far."""
        s = self.spec
        if not self._bins:
            p = self._pending
            return p[0] * 60.0 / p[1] if p[1] > 0 else 0.0
        if s.kind == "ewma":
            assert self._ewma is not None
            return self._ewma.predicted
        if s.kind == "peak":
            return max(self._bins)
        values = sorted(self._bins)
        pos = s.q * (len(values) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(values) - 1)
        return values[lo] + (values[hi] - values[lo]) * (pos - lo)

    @property
    def predicted(self) -> float:
        """The demand to plan for (QPM): the reading times the margin."""
        return self.estimate * self.spec.margin

    def describe(self) -> str:
        return self.spec.describe()

    # -- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the predictor knows, as plain JSON types (:meth:`from_state` restores it)."""
        out: dict[str, Any] = {
            "spec": self.spec.to_dict(),
            "bins": list(self._bins),
            "pending": list(self._pending),
            "observations": self.observations,
        }
        if self._ewma is not None:
            e = self._ewma
            out["ewma"] = {"predicted": e._predicted, "history": list(e._history), "observations": e.observations}
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> DemandPredictor:
        try:
            p = cls(PredictorSpec.from_dict(state["spec"]))
            p._bins.extend(float(x) for x in state.get("bins", ()))
            pending = state.get("pending", (0.0, 0.0))
            p._pending = [float(pending[0]), float(pending[1])]
            p.observations = int(state.get("observations", 0))
            ew = state.get("ewma")
            if p._ewma is not None and ew is not None:
                p._ewma._predicted = None if ew.get("predicted") is None else float(ew["predicted"])
                p._ewma._history.extend(float(x) for x in ew.get("history", ()))
                p._ewma.observations = int(ew.get("observations", 0))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"predictor state: malformed ({exc})") from None
        return p


class AffinityHistogram:
    """H(v): how many of the last ``window`` classified prompts had each optimal level."""

    def __init__(self, level_ids: Sequence[str], window: int = 1000):
        ids = list(level_ids)
        if not ids:
            raise ConfigError("level_ids: at least one level is required")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"level_ids: duplicate ids in {ids}")
        if window < 1:
            raise ConfigError(f"affinity_window: must be >= 1, got {window}")
        self.level_ids = tuple(ids)
        self.window = int(window)
        self._recent: deque[str] = deque(maxlen=self.window)
        self._counts: Counter[str] = Counter()

    @classmethod
    def from_config(cls, level_ids: Sequence[str], config) -> AffinityHistogram:
        return cls(level_ids, window=config.affinity_window)

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, level_id: str) -> None:
        """Record one classified prompt's optimal level."""
        if level_id not in self._counts and level_id not in self.level_ids:
            raise ConfigError(f"unknown level id {level_id!r}; levels: {', '.join(self.level_ids)}")
        if len(self._recent) == self.window:
            old = self._recent[0]
            self._counts[old] -= 1
        self._recent.append(level_id)
        self._counts[level_id] += 1

    def extend(self, level_ids: Iterable[str]) -> None:
        for lv in level_ids:
            self.add(lv)

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Record a period's classified prompts given as counts per optimal level (what
        ``ClusterStats.affinity`` carries: the order within the period is not kept).

        The prompts are recorded interleaved in proportion to the counts (each level's j-th of c
        at position (j + 1/2) / c of the period), so the window's oldest entries, when a later
        period pushes them out, are a proportional slice of their period. Recorded level by
        level instead, the window would drop one period's first-listed (slowest) levels and keep
        its fastest ones, and H would over-weight the fastest levels whenever a period holds more
        than the window's share of prompts (ARGUS's routing then sends too few prompts to the
        fastest level and too many to the slower ones; docs/baselines.md)."""
        unknown = [lv for lv, c in counts.items() if c and lv not in self.level_ids]
        if unknown:
            raise ConfigError(f"unknown level id {unknown[0]!r}; levels: {', '.join(self.level_ids)}")
        slots: list[tuple[float, int, str]] = []
        for k, lv in enumerate(self.level_ids):
            c = int(counts.get(lv, 0))
            slots += [((j + 0.5) / c, k, lv) for j in range(c)]
        self._add_many([lv for _pos, _k, lv in sorted(slots)])

    def _add_many(self, level_ids: list[str]) -> None:
        """The state that :meth:`add` of each of ``level_ids`` (known levels) in turn leaves, in one
        step: the oldest entries that many adds push out leave the counts, the levels take their
        keys in the order of their first add, and the newest ``window`` enter."""
        recent, counts, window = self._recent, self._counts, self.window
        out = len(recent) + len(level_ids) - window
        if out > 0:
            for old in islice(recent, min(out, len(recent))):
                counts[old] -= 1
        for lv in dict.fromkeys(level_ids):
            if lv not in counts:
                counts[lv] = 0
        kept = level_ids[-window:] if len(level_ids) > window else level_ids
        recent.extend(kept)
        counts.update(kept)

    def counts(self) -> tuple[int, ...]:
        return tuple(self._counts[lv] for lv in self.level_ids)

    def as_mapping(self) -> dict[str, int]:
        """Counts per level id (the shape of :attr:`argusdiff.domain.ClusterStats.affinity`)."""
        return {lv: self._counts[lv] for lv in self.level_ids}

    def shares(self) -> tuple[float, ...]:
        """H as shares summing to 1; uniform before the first prompt (no information yet)."""
        n = len(self._recent)
        if n == 0:
            return tuple(1.0 / len(self.level_ids) for _ in self.level_ids)
        return tuple(c / n for c in self.counts())

    @staticmethod
    def shares_of(counts: Mapping[str, int], level_ids: Sequence[str]) -> tuple[float, ...]:
        """Shares from a counts mapping (e.g. ``ClusterStats.affinity``), uniform when empty."""
        total = sum(max(0, counts.get(lv, 0)) for lv in level_ids)
        if total == 0:
            return tuple(1.0 / len(level_ids) for _ in level_ids)
        return tuple(max(0, counts.get(lv, 0)) / total for lv in level_ids)
