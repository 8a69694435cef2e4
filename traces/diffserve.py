"""DiffServe's real measurements (artifact github.com/qizhengyang98/DiffServe): discriminator
confidences, deferral fractions f(t) and batch runtimes, for the cascade policies.

Files (the raw artifact files, as in ``../shared/data/diffserve/``; the package ships the small
ones it needs at run time in ``traces/data``, see ``traces/data/SOURCES.md``):

* ``dist_{sdturbo,sdxs,sdxlltn}.txt`` — 5,000 queries × 4 images of the light model, one
  discriminator P(fake) per line; a query's confidence is P(real) = 1 − the mean of its group of
  four. Which prompt a query was is not recorded. f(t) is exactly the share of queries whose
  confidence is below t (checked in the tests). Shipped as per-query confidences in
  ``diffserve_light_confidence.csv`` (``query,sdturbo,sdxs,sdxlltn``).
* ``confidence_scores.csv`` — ``content_id,sdturbo,sdv15``: confidence of the SD-Turbo image and of
  the SDv1.5 image of the same query (a different discriminator run; its light confidences are
  much higher than those behind f(t)). Shipped unchanged.
* ``f_t_grid.csv`` (``t,f_sdturbo_sdv15,f_sdxs_sdv15``, 201 points) and ``f_t_sdturbo_sdv15.csv``
  (``,t,f_t``, 21 points). ``f_t_grid.csv`` shipped unchanged.
* ``stable_diffusion_runtimes_{pair}.csv`` — batch latencies (ms) on A100; only the
  ``onnxruntime_cpu`` rows are read (the artifact duplicates them per accelerator); 100000 ms
  means infeasible and is dropped.

Cascade pairs: ``sdturbo`` (SD-Turbo → SDv1.5), ``sdxs`` (SDXS → SDv1.5), ``sdxlltn``
(SDXL-Lightning → SDXL; the artifact reuses the SDXS f(t) grid for it).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from argusdiff.errors import ConfigError

__all__ = [
    "PAIRS",
    "Confidences",
    "DiffServeDataError",
    "deferral_from_confidence",
    "load_confidences",
    "load_ft",
    "load_light_confidence",
    "load_runtimes",
    "pair_confidences",
    "routing_confidence",
]

DATA_DIR = Path(__file__).parent / "data"
PAIRS = ("sdturbo", "sdxs", "sdxlltn")
_HEAVY = {"sdturbo": "sdv15", "sdxs": "sdv15", "sdxlltn": "sdxl"}
_FT_COLUMN = {"sdturbo": "f_sdturbo_sdv15", "sdxs": "f_sdxs_sdv15", "sdxlltn": "f_sdxs_sdv15"}
INFEASIBLE_MS = 100000.0
#: the pair whose light and heavy images ``confidence_scores.csv`` scores (``content_id,sdturbo,sdv15``)
SCORED_PAIR = "sdturbo"


class DiffServeDataError(ConfigError):
    """A DiffServe data file is missing or malformed (the message names the file and line)."""


def _pair(pair: str) -> str:
    if pair not in PAIRS:
        raise DiffServeDataError(f"unknown cascade pair {pair!r} (known: {', '.join(PAIRS)})")
    return pair


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DiffServeDataError(f"{path}: not found") from None


def _float(path: Path, lineno: int, cell: str, what: str) -> float:
    try:
        v = float(cell)
    except ValueError:
        raise DiffServeDataError(f"{path}:{lineno}: {what} is not a number: {cell!r}") from None
    if not math.isfinite(v):
        raise DiffServeDataError(f"{path}:{lineno}: {what} must be finite")
    return v


@dataclass(frozen=True, eq=False)
class Confidences:
    """Per-query discriminator confidences P(real) of a cascade's light (and heavy) images."""

    pair: str
    light: np.ndarray
    heavy: np.ndarray | None
    source: str

    def __len__(self) -> int:
        return int(self.light.size)

    def deferral(self, threshold: float | np.ndarray) -> float | np.ndarray:
        """Share of queries sent to the heavy model at threshold t (confidence < t)."""
        srt = np.sort(self.light)
        return np.searchsorted(srt, threshold, side="left") / srt.size

    def light_wins(self) -> float:
        """Share of queries whose light image is judged at least as real as the heavy one."""
        if self.heavy is None:
            raise DiffServeDataError(f"{self.source}: no heavy-model confidences")
        return float(np.mean(self.light >= self.heavy))


def load_light_confidence(pair: str = "sdturbo", path: str | Path | None = None) -> Confidences:
    """Per-query light confidence from a raw ``dist_<pair>.txt`` (``path``) or the shipped
    ``diffserve_light_confidence.csv``."""
    _pair(pair)
    if path is not None and Path(path).suffix == ".txt":
        p = Path(path)
        vals = []
        for lineno, line in enumerate(_read(p).splitlines(), start=1):
            if line.strip():
                v = _float(p, lineno, line.strip(), "P(fake)")
                if not 0.0 <= v <= 1.0:
                    raise DiffServeDataError(f"{p}:{lineno}: P(fake) must be in [0, 1], got {v}")
                vals.append(v)
        if not vals or len(vals) % 4:
            raise DiffServeDataError(f"{p}: expected groups of 4 images per query, got {len(vals)} lines")
        conf = 1.0 - np.array(vals).reshape(-1, 4).mean(axis=1)
        return Confidences(pair, conf, None, str(p))
    p = Path(path) if path is not None else DATA_DIR / "diffserve_light_confidence.csv"
    return _light_csv(str(p), pair)


@lru_cache(maxsize=8)
def _light_csv(path: str, pair: str) -> Confidences:
    p = Path(path)
    rows = list(csv.reader(io.StringIO(_read(p))))
    header = rows[0]
    if pair not in header:
        raise DiffServeDataError(f"{p}:1: no column {pair!r} in {header}")
    col = header.index(pair)
    conf = np.array([_float(p, i, r[col], pair) for i, r in enumerate(rows[1:], start=2) if r])
    return Confidences(pair, conf, None, str(p))


@lru_cache(maxsize=4)
def _scores_csv(path: str) -> Confidences:
    p = Path(path)
    rows = list(csv.reader(io.StringIO(_read(p))))
    if not rows or [h.strip() for h in rows[0][:3]] != ["content_id", "sdturbo", "sdv15"]:
        raise DiffServeDataError(f"{p}:1: header must be content_id,sdturbo,sdv15")
    light, heavy = [], []
    for i, r in enumerate(rows[1:], start=2):
        if not r:
            continue
        if len(r) < 3:
            raise DiffServeDataError(f"{p}:{i}: expected 3 fields, got {len(r)}")
        light.append(_float(p, i, r[1], "sdturbo"))
        heavy.append(_float(p, i, r[2], "sdv15"))
    return Confidences("sdturbo", np.array(light), np.array(heavy), str(p))


def load_confidences(path: str | Path | None = None) -> Confidences:
    """Per-query confidences of SD-Turbo and SDv1.5 images (``confidence_scores.csv``)."""
    return _scores_csv(str(Path(path) if path is not None else DATA_DIR / "confidence_scores.csv"))


def pair_confidences(pair: str) -> Confidences | None:
    """The light and the heavy image's confidences of the same queries, where the artifact measured
    them for ``pair`` (``confidence_scores.csv``: the ``sdturbo`` pair only), else None."""
    return load_confidences() if _pair(pair) == SCORED_PAIR else None


def load_ft(pair: str = "sdturbo", path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The profiled f(t) of a pair: ``(thresholds, deferral)`` from ``f_t_grid.csv`` (default,
    shipped) or a ``,t,f_t`` file such as ``f_t_sdturbo_sdv15.csv``."""
    _pair(pair)
    p = Path(path) if path is not None else DATA_DIR / "f_t_grid.csv"
    rows = [r for r in csv.reader(io.StringIO(_read(p)))]
    header = [h.strip() for h in rows[0]]
    if "t" not in header:
        raise DiffServeDataError(f"{p}:1: no 't' column in {header}")
    tcol = header.index("t")
    fcol = (
        header.index(_FT_COLUMN[pair])
        if _FT_COLUMN[pair] in header
        else (header.index("f_t") if "f_t" in header else None)
    )
    if fcol is None:
        raise DiffServeDataError(f"{p}:1: no f(t) column for {pair!r} in {header}")
    ts, fs = [], []
    for i, r in enumerate(rows[1:], start=2):
        if not r:
            continue
        ts.append(_float(p, i, r[tcol], "t"))
        fs.append(_float(p, i, r[fcol], "f(t)"))
    t, f = np.array(ts), np.array(fs)
    if np.any(np.diff(t) <= 0) or np.any(np.diff(f) < -1e-12) or f.min() < 0 or f.max() > 1:
        raise DiffServeDataError(f"{p}: thresholds must increase and f(t) must be non-decreasing in [0, 1]")
    return t, f


def deferral_from_confidence(conf: Confidences, thresholds: np.ndarray) -> np.ndarray:
    """f(t) measured from per-query confidences."""
    return np.asarray(conf.deferral(np.asarray(thresholds, dtype=float)), dtype=float)


def load_runtimes(path: str | Path) -> dict[str, dict[int, float]]:
    """``{model: {batch: seconds}}`` from a ``stable_diffusion_runtimes_<pair>.csv``
    (``onnxruntime_cpu`` rows; infeasible 100000 ms entries dropped). The artifact names the
    light model ``sdturbo`` and the heavy one ``sdv15`` in every pair's file."""
    p = Path(path)
    rows = list(csv.reader(io.StringIO(_read(p))))
    header = [h.strip() for h in rows[0]]
    need = ("Model", "Accel", "batchsize", "avg_runtime")
    if not all(n in header for n in need):
        raise DiffServeDataError(f"{p}:1: header needs {', '.join(need)}; got {header}")
    c = {n: header.index(n) for n in need}
    out: dict[str, dict[int, float]] = {}
    for i, r in enumerate(rows[1:], start=2):
        if not r or r[c["Accel"]].strip() != "onnxruntime_cpu":
            continue
        ms = _float(p, i, r[c["avg_runtime"]], "avg_runtime")
        if ms >= INFEASIBLE_MS:
            continue
        if ms <= 0:
            raise DiffServeDataError(f"{p}:{i}: avg_runtime must be > 0")
        b = int(_float(p, i, r[c["batchsize"]], "batchsize"))
        out.setdefault(r[c["Model"]].strip(), {})[b] = ms / 1000.0
    if not out:
        raise DiffServeDataError(f"{p}: no onnxruntime_cpu rows")
    return out


def routing_confidence(
    query_idx: int | np.ndarray,
    *,
    pair: str = "sdturbo",
    source: str = "dist",
    path: str | Path | None = None,
) -> np.ndarray:
    """Light-image confidence of each query, for the cascade's deferral decision
    (defer when confidence < t). ``query_idx`` (0-based) wraps modulo the 5,000 measured queries.
    ``source="dist"``: the per-query confidences behind f(t) (any pair); ``"scores"``: the
    ``confidence_scores.csv`` run (``sdturbo`` only)."""
    if source == "dist":
        conf = load_light_confidence(pair, path)
    elif source == "scores":
        if _pair(pair) != SCORED_PAIR:
            raise DiffServeDataError("confidence_scores.csv has SD-Turbo/SDv1.5 confidences only (pair sdturbo)")
        conf = load_confidences(path)
    else:
        raise DiffServeDataError(f"source must be 'dist' or 'scores', got {source!r}")
    idx = np.asarray(query_idx, dtype=np.int64)
    if idx.size and idx.min() < 0:
        raise DiffServeDataError("query indices must be >= 0")
    return conf.light[idx % len(conf)]
