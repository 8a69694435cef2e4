"""Outputs of a replay: comparison table, ``metrics.csv``, ``summary.json``, PNG plots, ``report.html``.

``metrics.csv`` (long format, one row per policy and minute): ``policy,minute,offered_qpm,
throughput_qpm,goodput_qpm,dropped,slo_violation_ratio,effective_quality,relative_quality,
gpu_utilization,model_switches,cache_hits,level_mix`` where ``level_mix`` is
``level=count;...`` of the requests that arrived in that minute and were served.

``summary.json``: ``{"provenance": {...}, "policies": {label: summary}}`` (see
:func:`argusdiff.simulator.summarize` for the summary fields).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["format_table", "plot_figures", "summary_json", "write_outputs"]

METRIC_COLUMNS = (
    "offered_qpm",
    "throughput_qpm",
    "goodput_qpm",
    "dropped",
    "slo_violation_ratio",
    "effective_quality",
    "relative_quality",
    "gpu_utilization",
    "model_switches",
    "cache_hits",
)


def _fmt(x: float, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def format_table(result) -> str:
    """The comparison table (plain text, one row per policy, then the clairvoyant bound of each
    profile: a yardstick, not a policy; ``gap``: each policy's distance to it in points)."""
    from argusdiff.bound import BOUND_LABEL

    bounds = getattr(result, "bounds", {}) or {}
    w = max(19, 2 + max((len(label) for label in result.summaries), default=0), 2 + len(BOUND_LABEL) if bounds else 0)
    head = (
        f"{'policy':<{w}}{'profile':<22}{'SLO viol':>9}{'rel.qual':>9}{'eff.qual':>9}{'goodput':>9}"
        f"{'thrpt':>8}{'util':>6}{'switch':>7}{'p99 s':>8}{'dropped':>8}" + (f"{'gap':>7}" if bounds else "")
    )
    lines = [head, "-" * len(head)]
    for label, s in result.summaries.items():
        gap = _fmt(100 * s.get("bound_gap", float("nan")), "7.1f") if bounds else ""
        lines.append(
            f"{label:<{w}}{s.get('profile')!s:<22}{_fmt(100 * s['slo_violation_ratio'], '8.1f')}%"
            f"{_fmt(100 * s['relative_quality'], '8.1f')}%{_fmt(s['effective_quality'], '9.2f')}"
            f"{_fmt(s['goodput_qpm'], '9.1f')}{_fmt(s['throughput_qpm'], '8.1f')}"
            f"{_fmt(100 * s['gpu_utilization'], '5.0f')}%{s['model_switches']:>7d}"
            f"{_fmt(s['latency_p99_s'], '8.1f')}{s['dropped']:>8d}{gap:>7}"
        )
    for name, b in bounds.items():
        lines.append(
            f"{BOUND_LABEL:<{w}}{name:<22}{_fmt(100 * b.min_violation, '8.1f')}%{_fmt(100 * b.quality, '8.1f')}%"
            f"{'-':>9}{'-':>9}{'-':>8}{'-':>6}{'-':>7}{'-':>8}{'-':>8}{'-':>7}"
        )
    if bounds:
        lines.append(
            "clairvoyant bound: an LP that knows the whole trace (docs/bound.md): the fewest violations any "
            "schedule could have and the best relative quality at them; gap: the bound's relative quality at the "
            "policy's violation ratio minus the policy's, in points"
        )
    lines += format_tier_table(result)
    lines += format_domination(result)
    p = result.provenance
    lines.append("")
    lines.append(
        f"trace: {p['trace_name']} ({p['requests']} requests, {p['duration_min']:.0f} min, "
        f"mean {p['mean_qpm']:.0f} QPM, "
        f"peak {p['peak_qpm']:.0f} QPM); {p['gpus']} workers; SLO {p['slo_s']:.1f} s; seed {p['seed']}"
    )
    if p.get("load_scaling"):
        lines.append(f"load: {p['load_scaling']}")
    if p.get("predictor"):
        lines.append(f"demand predictor: {p['predictor']}")
    if p.get("admission"):
        refused = ", ".join(
            f"{k} {s.get('refused', 0)} ({s.get('false_refusals', 0)})" for k, s in result.summaries.items()
        )
        lines.append(
            f"admission: {p['admission']}; refused (in dropped; in brackets the false refusals, which "
            f"would have met their SLO, as simulated): {refused}"
        )
    if p.get("static_peak"):
        lines.append(f"peak: {p['static_peak']}")
    lines.append(f"classifier: {p['classifier']}")
    drift = [(label, s["drift"]) for label, s in result.summaries.items() if s.get("drift")]
    if drift:
        d0 = drift[0][1]
        runs = ", ".join(f"{label} {d['retrains']} (of {d['windows']} windows)" for label, d in drift)
        lines.append(
            f"drift retraining (ARGUS §4.1: ~7 in 800 min): retrains {runs}; window {d0['window']}, "
            f"history {d0['history']}, tolerance {d0['tolerance']:g}, min prompts {d0['min_samples']}, "
            f"sample {d0['sample']:g}"
        )
    synthetic = [k for k, v in p["quality"].items() if v.startswith("SYNTHETIC")]
    other = {k: v for k, v in p["quality"].items() if k not in synthetic}
    if synthetic:
        lines.append(f"quality: SYNTHETIC (traces.synthetic, not measured) for {', '.join(synthetic)}")
    for k, v in other.items():
        lines.append(f"quality of {k}: {v}")
    prefill = p.get("cache_prefill", 0)
    lines.append(f"cache similarity: {p['cache_similarity']}; cache prefilled with {prefill:.0%} of the prompts")
    if p.get("faults"):
        lines.append(f"faults: {p['faults']}")
    if p.get("slo_note"):
        lines.append(f"SLOs: {p['slo_note']}")
    return "\n".join(lines)


def format_domination(result) -> list[str]:
    """The domination check of argus+ (unified) against the other policies of the run (not its own
    ablation rows): lines, when it ran."""
    from argusdiff.replay import UNIFIED_LABEL, domination

    s = result.summaries
    if UNIFIED_LABEL not in s:
        return []
    field = [lb for lb in s if not lb.startswith(UNIFIED_LABEL)]
    dom = domination(s, UNIFIED_LABEL, among=field)
    me = s[UNIFIED_LABEL]
    if not dom:
        return ["", f"domination check: {UNIFIED_LABEL} is not dominated by {', '.join(field) or 'any policy'}"]
    parts = [
        f"{d} ({100 * s[d]['slo_violation_ratio']:.1f}% vs {100 * me['slo_violation_ratio']:.1f}% violations, "
        f"{100 * s[d]['relative_quality']:.1f}% vs {100 * me['relative_quality']:.1f}% relative quality)"
        for d in dom
    ]
    return ["", f"domination check: {UNIFIED_LABEL} is DOMINATED by " + "; ".join(parts)]


def format_tier_table(result) -> list[str]:
    """SLO violations per tier (lines), when the trace has per-request tiers or SLOs."""
    tiers: list[str] = []
    for s in result.summaries.values():
        for t in s.get("tiers") or {}:
            if t not in tiers:
                tiers.append(t)
    if not result.provenance.get("per_request_slo") or not tiers:
        return []
    order = {"interactive": 0, "standard": 1, "batch": 2}
    tiers.sort(key=lambda t: (order.get(t, 3), t))
    head = f"{'policy':<19}" + "".join(f"{t[:14]:>16}" for t in tiers)
    lines = ["", "SLO violations per tier (requests; SLO s)", head, "-" * len(head)]
    for label, s in result.summaries.items():
        row = f"{label:<19}"
        for t in tiers:
            d = (s.get("tiers") or {}).get(t)
            row += f"{'-':>16}" if d is None else f"{_fmt(100 * d['slo_violation_ratio'], '15.1f')}%"
        lines.append(row)
    first = next(iter(result.summaries.values()), {})
    info = ", ".join(
        f"{t}: {first['tiers'][t]['requests']} req, {first['tiers'][t]['slo_s']:.1f} s"
        for t in tiers
        if t in (first.get("tiers") or {})
    )
    lines.append(info)
    return lines


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating | float):
        v = float(x)
        return None if math.isnan(v) or math.isinf(v) else v
    return x


def summary_json(result) -> dict[str, Any]:
    bounds = {name: b.as_dict() for name, b in getattr(result, "bounds", {}).items()}
    return _jsonable({"provenance": result.provenance, "policies": result.summaries, "bounds": bounds})


def write_metrics_csv(result, path: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["policy", "minute", *METRIC_COLUMNS, "level_mix"])
    for label, m in result.minutes.items():
        mix_keys = [k for k in m if k.startswith("mix:")]
        for k in range(len(m["minute"])):
            mix = ";".join(f"{key[4:]}={int(m[key][k])}" for key in mix_keys if m[key][k] > 0)
            row = [label, int(m["minute"][k])]
            for col in METRIC_COLUMNS:
                v = float(m[col][k])
                row.append("" if math.isnan(v) else f"{v:.6g}")
            row.append(mix)
            w.writerow(row)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _smooth(y: np.ndarray, k: int = 5) -> np.ndarray:
    if len(y) < k:
        return y
    y = np.asarray(y, dtype=float)
    mask = ~np.isnan(y)
    num = np.convolve(np.where(mask, y, 0.0), np.ones(k), mode="same")
    den = np.convolve(mask.astype(float), np.ones(k), mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def plot_figures(result, out: Path) -> list[Path]:
    """PNG plots like ARGUS Fig. 16: throughput vs load, relative quality and SLO violations over
    time (one line per policy), plus a summary bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    first = next(iter(result.minutes.values()))
    axes[0].plot(first["minute"], _smooth(first["offered_qpm"]), color="black", lw=2, ls="--", label="offered load")
    for label, m in result.minutes.items():
        x = m["minute"]
        axes[0].plot(x, _smooth(m["goodput_qpm"]), lw=1.2, label=label)
        axes[1].plot(x, 100 * _smooth(m["relative_quality"]), lw=1.2, label=label)
        axes[2].plot(x, 100 * _smooth(m["slo_violation_ratio"]), lw=1.2, label=label)
    axes[0].set_ylabel("goodput (QPM)")
    axes[1].set_ylabel("relative quality (%)")
    axes[2].set_ylabel("SLO violations (%)")
    axes[2].set_xlabel("time (min), 5-min moving average")
    axes[0].legend(fontsize=7, ncol=3)
    p = result.provenance
    fig.suptitle(f"{p['trace_name']} · {p['gpus']} workers · SLO {p['slo_s']:.1f} s", fontsize=10)
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

    labels = list(result.summaries)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    vals = [
        ([100 * result.summaries[k]["slo_violation_ratio"] for k in labels], "SLO violations (%)"),
        ([100 * (result.summaries[k]["relative_quality"] or 0) for k in labels], "relative quality (%)"),
        ([result.summaries[k]["goodput_qpm"] for k in labels], "goodput (QPM)"),
    ]
    for ax, (v, title) in zip(axes, vals, strict=True):
        ax.barh(labels, np.nan_to_num(np.asarray(v, dtype=float)))
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    fig.tight_layout()
    path = out / "summary.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(6, 5))
    for label, s in result.summaries.items():
        ax.scatter(100 * s["slo_violation_ratio"], 100 * (s["relative_quality"] or 0), s=30)
        ax.annotate(label, (100 * s["slo_violation_ratio"], 100 * (s["relative_quality"] or 0)), fontsize=7)
    ax.set_xlabel("SLO violations (%)")
    ax.set_ylabel("relative quality of requests within SLO (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "tradeoff.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)
    return paths


def write_html(result, out: Path, images: list[Path], table: str) -> Path:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>argusdiff replay report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}pre{background:#f4f4f4;padding:8px;"
        "font-size:12px;overflow-x:auto}td,th{padding:2px 8px;font-size:12px}</style></head><body>",
        "<h1>argusdiff replay</h1>",
        f"<pre>{html.escape(table)}</pre>",
        "<h2>Provenance</h2><table>",
    ]
    for k, v in result.provenance.items():
        parts.append(
            f"<tr><th align=left>{html.escape(str(k))}</th><td>{html.escape(json.dumps(_jsonable(v)))}</td></tr>"
        )
    parts.append("</table>")
    for img in images:
        data = base64.b64encode(img.read_bytes()).decode("ascii")
        parts.append(
            f"<h2>{html.escape(img.stem)}</h2><img alt='{html.escape(img.stem)}' src='data:image/png;base64,{data}'>"
        )
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_outputs(result, out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = format_table(result)
    files: dict[str, Path] = {}
    write_metrics_csv(result, out / "metrics.csv")
    files["metrics"] = out / "metrics.csv"
    (out / "summary.json").write_text(json.dumps(summary_json(result), indent=2), encoding="utf-8")
    files["summary"] = out / "summary.json"
    (out / "table.txt").write_text(table + "\n", encoding="utf-8")
    files["table"] = out / "table.txt"
    images = plot_figures(result, out) if plots else []
    for img in images:
        files[img.name] = img
    files["report"] = write_html(result, out, images, table)
    return files
