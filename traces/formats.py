"""Trace file formats: detection, the readers, the native writer, and :func:`load_trace`.

Formats, detected from the content (or named explicitly):

- ``argusdiff`` — the native CSV written by :func:`write_trace`: optional ``# key: value``
  metadata lines, a header ``arrival_s[,prompt_idx][,slo_s][,tier]``, one row per request;
- ``diffserve`` — the DiffServe artifact's ``arrival_ms,prompt_idx`` (prompt_idx 1-based);
- ``proteus`` — Proteus' Twitter-derived ``start_ms,qos_level,deadline_ms`` (deadline → SLO);
- ``azure-minute`` — an Azure Functions 2019 per-minute invocation CSV
  (``HashOwner,HashApp,HashFunction,Trigger,1,...,1440``): rows are summed per minute;
- ``azure-hourly`` — an hourly aggregate shape (``,hour,invocations``), scaled to a QPM range.

:func:`load_trace` is the one entry point: a generator spec (:mod:`traces.generators`), a file
path with optional ``@key=value,...`` options, or a shipped shape's name.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from traces.generators import (
    GENERATORS,
    apply_common_keys,
    diurnal,
    duration_reader,
    generate,
    is_spec,
    parse_spec,
    rate_curve_trace,
    rate_reader,
    scale_shape,
    spec_value,
)
from traces.trace import MAX_REQUESTS, Trace, TraceError

__all__ = ["FORMATS", "detect_format", "load_trace", "read_trace", "write_trace"]

FORMATS = ("argusdiff", "diffserve", "proteus", "azure-minute", "azure-hourly")


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
        return tr.replace(format="azure-minute")
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
    return tr.replace(format="azure-hourly", source=str(p))


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
    if is_spec(text):
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
        seed = int(spec_value(opts, "seed", kind=where, conv=int))
    for key in ("low", "high", "peak"):
        if key in opts:
            scaling[key] = spec_value(opts, key, kind=where, conv=rate_reader(key))
    if "point" in opts:
        scaling["point_s"] = spec_value(opts, "point", kind=where, conv=duration_reader("point"))
    if "mean_qpm" in opts:
        mean_qpm = spec_value(opts, "mean_qpm", kind=where, conv=rate_reader("mean_qpm"))
    if "peak_qpm" in opts:
        peak_qpm = spec_value(opts, "peak_qpm", kind=where, conv=rate_reader("peak_qpm"))
    start = spec_value(opts, "start", kind=where, conv=duration_reader("start")) if "start" in opts else None
    end = spec_value(opts, "end", kind=where, conv=duration_reader("end")) if "end" in opts else None
    trace = read_trace(p, format=format, seed=seed, **scaling)
    trace = _rescaled(trace, mean_qpm, peak_qpm, start, end)
    return apply_common_keys(
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
