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

from argusdiff.domain import TIER_PRIORITY

__all__ = [
    "COLUMNS",
    "format_table",
    "level_mix_lines",
    "plot_figures",
    "reading_notes",
    "summary_json",
    "write_outputs",
]

#: the comparison table's columns: (header, what it means) — the terminal table's footer and
#: report.html's legend say the same
COLUMNS: tuple[tuple[str, str], ...] = (
    (
        "policy",
        "the policy (a suffix `-x`: the policy with part x switched off; `(unified)`: argus+ planning "
        "every path of the deployment profile)",
    ),
    ("profile", "the deployment profile it ran on (its levels, latencies and quality table)"),
    ("SLO viol", "share of requests not served within their SLO; a dropped or refused request counts as violated"),
    (
        "rel.qual",
        "mean quality of the requests served within the SLO, relative to each prompt's best level of its profile",
    ),
    ("eff.qual", "the same in the quality table's raw score"),
    ("goodput", "requests served within the SLO per minute, counted in the minute they arrived"),
    ("thrpt", "requests served per minute, counted in the minute they finished"),
    ("util", "busy worker-seconds over up worker-seconds (model loads are not busy time)"),
    ("switch", "model loads started (blocking and in the background)"),
    ("p99 s", "99th percentile latency of the served requests"),
    ("dropped", "requests the policy itself dropped (DiffServe's rule: wait + runtime > 1.5 x SLO)"),
    ("refused", "requests admission refused after the policy routed them (the service's 429)"),
)
GAP_COLUMN = (
    "gap",
    "the clairvoyant bound's relative quality at the policy's violation ratio minus the policy's, in points "
    "(docs/bound.md)",
)

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
        f"{'thrpt':>8}{'util':>6}{'switch':>7}{'p99 s':>8}{'dropped':>8}{'refused':>8}"
        + (f"{'gap':>7}" if bounds else "")
    )
    lines = [head, "-" * len(head)]
    for label, row in table_rows(result):
        gap = _fmt(100 * result.summaries[label].get("bound_gap", float("nan")), "7.1f") if bounds else ""
        lines.append(
            f"{label:<{w}}{row[0]:<22}{row[1]:>9}{row[2]:>9}{row[3]:>9}{row[4]:>9}{row[5]:>8}{row[6]:>6}"
            f"{row[7]:>7}{row[8]:>8}{row[9]:>8}{row[10]:>8}{gap:>7}"
        )
    for name, b in bounds.items():
        lines.append(
            f"{BOUND_LABEL:<{w}}{name:<22}{_fmt(100 * b.min_violation, '8.1f')}%{_fmt(100 * b.quality, '8.1f')}%"
            f"{'-':>9}{'-':>9}{'-':>8}{'-':>6}{'-':>7}{'-':>8}{'-':>8}{'-':>8}{'-':>7}"
        )
    if bounds:
        lines.append(
            "clairvoyant bound: an LP that knows the whole trace (docs/bound.md): the fewest violations any "
            "schedule could have and the best relative quality at them; gap: the bound's relative quality at the "
            "policy's violation ratio minus the policy's, in points"
        )
    return "\n".join(lines + footer_lines(result))


def footer_lines(result) -> list[str]:
    """What follows the comparison table: tiers, the domination check, level mixes, how to read
    the numbers, then the run's settings."""
    lines: list[str] = []
    lines += format_tier_table(result)
    lines += format_domination(result)
    mix = level_mix_lines(result)
    if mix:
        lines += ["", "level mix (share of the served requests per level; K = denoising steps skipped from the cache):"]
        lines += [f"  {line}" for line in mix]
    notes = reading_notes(result)
    if notes:
        lines += ["", "how to read it:"]
        lines += [f"  - {n}" for n in notes]
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
        false = ", ".join(f"{k} {s.get('false_refusals', 0)}" for k, s in result.summaries.items())
        lines.append(
            f"admission: {p['admission']} (its refusals: the `refused` column); false refusals (refused requests "
            f"that would have met their SLO, as simulated): {false}"
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
    if p.get("load_times"):
        lines.append(f"model load times: {p['load_times']}; {p.get('resident_models', 2)} resident model(s) per worker")
    if p.get("faults"):
        lines.append(f"faults: {p['faults']}")
    if p.get("slo_note"):
        lines.append(f"SLOs: {p['slo_note']}")
    return lines


def table_rows(result) -> list[tuple[str, tuple[str, ...]]]:
    """The comparison table's cells per policy (after the label), formatted as printed."""
    out = []
    for label, s in result.summaries.items():
        refused = int(s.get("refused", 0))
        out.append(
            (
                label,
                (
                    str(s.get("profile")),
                    f"{_fmt(100 * s['slo_violation_ratio'], '.1f')}%",
                    f"{_fmt(100 * s['relative_quality'], '.1f')}%",
                    _fmt(s["effective_quality"], ".2f"),
                    _fmt(s["goodput_qpm"], ".1f"),
                    _fmt(s["throughput_qpm"], ".1f"),
                    f"{_fmt(100 * s['gpu_utilization'], '.0f')}%",
                    str(s["model_switches"]),
                    _fmt(s["latency_p99_s"], ".1f"),
                    str(int(s["dropped"]) - refused),
                    str(refused),
                ),
            )
        )
    return out


def level_mix_lines(result, *, least: float = 0.005) -> list[str]:
    """Each policy's level mix in its levels' order (slowest/best first): the share of its served
    requests at each level of at least ``least``, the rest summed as "other"."""
    lines = []
    for label, s in result.summaries.items():
        mix = list((s.get("level_mix") or {}).items())
        if not mix:
            continue
        shown = ", ".join(f"{lv} {100 * share:.0f}%" for lv, share in mix if share >= least)
        rest = sum(share for _lv, share in mix if share < least)
        lines.append(f"{label}: {shown}" + (f", other {100 * rest:.1f}%" if rest > 0 else ""))
    return lines


def reading_notes(result) -> list[str]:
    """Plain sentences for what the table's numbers can be mistaken for, each only when it applies."""
    s = result.summaries
    notes = []
    above = [lb for lb, v in s.items() if _num(v.get("goodput_qpm")) > _num(v.get("throughput_qpm")) + 1e-9]
    if above:
        notes.append(
            f"Goodput is above throughput for {', '.join(above)}: goodput counts a request in the minute it arrived, "
            "throughput in the minute it finished, and both average over the minutes with arrivals, so requests "
            "that finish after the trace's last minute count in goodput only. Nothing is served twice."
        )
    dropped = [lb for lb, v in s.items() if int(v.get("dropped", 0)) - int(v.get("refused", 0)) > 0]
    refused = [lb for lb, v in s.items() if int(v.get("refused", 0)) > 0]
    if dropped or refused:
        notes.append(
            "`dropped` are requests the policy itself gave up on"
            + (f" ({', '.join(dropped)})" if dropped else "")
            + " (DiffServe's own rule drops a query whose wait plus runtime exceeds 1.5 x its SLO); `refused` are "
            "requests admission turned away after the policy routed them"
            + (f" ({', '.join(refused)})" if refused else "")
            + ", as the service answers 429. Both count as SLO violations."
        )
    profiles = {str(v.get("profile")) for v in s.values()}
    synthetic = any(str(q).startswith("SYNTHETIC") for q in (result.provenance.get("quality") or {}).values())
    if len(profiles) > 1 and synthetic:
        notes.append(
            "Relative quality compares policies on the same profile. Each profile's SYNTHETIC quality table is "
            "drawn separately, so across profiles (and in the domination check, which compares every row) it "
            "compares the tables as much as the policies; a level two profiles share has the same scores in both."
        )
    return notes


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def format_domination(result) -> list[str]:
    """The domination check of argus+ (the flagship) against the other policies of the run (not its
    own variants: ``argus+ (AC)``, ablation rows): lines, when it ran."""
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
    order = {t: k for k, t in enumerate(TIER_PRIORITY)}
    tiers.sort(key=lambda t: (order.get(t, len(order)), t))
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


#: markers and line styles that, with the 20 colours of ``tab20``, tell more than 10 series apart
_MARKERS = "osD^v<>phX*P8d"
_LINES = ("-", "--", "-.", ":")


def series_styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """A colour, marker and line style per series, each (colour, marker) pair distinct for up to 140
    series: matplotlib's default cycle has 10 colours, so an 11th series would repeat the first."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]  # the 10 strong colours first, then their light twins
    return {
        label: {
            "color": cmap(order[k % 20]),
            "marker": _MARKERS[k % len(_MARKERS)],
            "linestyle": _LINES[(k // 20) % len(_LINES)],
        }
        for k, label in enumerate(labels)
    }


def plot_figures(result, out: Path) -> list[Path]:
    """PNG plots like ARGUS Fig. 16: throughput vs load, relative quality and SLO violations over
    time (one line per policy), plus a summary bar chart and the violations/quality trade-off.
    Every policy keeps one colour and marker across the three figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result.summaries)
    style = series_styles(labels)
    paths: list[Path] = []
    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    first = next(iter(result.minutes.values()))
    axes[0].plot(first["minute"], _smooth(first["offered_qpm"]), color="black", lw=2, ls="--", label="offered load")
    for label, m in result.minutes.items():
        x = m["minute"]
        st = style[label]
        every = max(1, len(x) // 12)
        kw = {"lw": 1.2, "label": label, "markevery": every, "markersize": 4, **st}
        axes[0].plot(x, _smooth(m["goodput_qpm"]), **kw)
        axes[1].plot(x, 100 * _smooth(m["relative_quality"]), **kw)
        axes[2].plot(x, 100 * _smooth(m["slo_violation_ratio"]), **kw)
    axes[0].set_ylabel("goodput (QPM)")
    axes[1].set_ylabel("relative quality (%)")
    axes[2].set_ylabel("SLO violations (%)")
    axes[2].set_xlabel("time (min), 5-min moving average")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    p = result.provenance
    fig.suptitle(f"{p['trace_name']} · {p['gpus']} workers · SLO {p['slo_s']:.1f} s", fontsize=10)
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(13, 0.8 + 0.32 * len(labels)))
    vals = [
        ([100 * result.summaries[k]["slo_violation_ratio"] for k in labels], "SLO violations (%) — lower is better"),
        (
            [100 * (result.summaries[k]["relative_quality"] or 0) for k in labels],
            "relative quality (%) — higher is better",
        ),
        ([result.summaries[k]["goodput_qpm"] for k in labels], "goodput (QPM) — higher is better"),
    ]
    colours = [style[k]["color"] for k in labels]
    for j, (ax, (v, title)) in enumerate(zip(axes, vals, strict=True)):
        ax.barh(labels, np.nan_to_num(np.asarray(v, dtype=float)), color=colours)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        if j:
            ax.set_yticklabels([])
        ax.invert_yaxis()
    fig.tight_layout()
    path = out / "summary.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, s in result.summaries.items():
        st = style[label]
        ax.scatter(
            100 * s["slo_violation_ratio"],
            100 * (s["relative_quality"] or 0),
            s=45,
            color=st["color"],
            marker=st["marker"],
            edgecolors="black",
            linewidths=0.4,
            label=label,
        )
    ax.set_xlabel("SLO violations (%) — lower is better")
    ax.set_ylabel("relative quality of requests within SLO (%) — higher is better")
    ax.grid(alpha=0.3)
    ax.annotate(
        "better: fewer violations,\nhigher quality",
        xy=(0.02, 0.98),
        xycoords="axes fraction",
        xytext=(0.22, 0.80),
        textcoords="axes fraction",
        fontsize=8,
        ha="center",
        arrowprops={"arrowstyle": "->", "color": "green"},
        color="green",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, title="policy")
    ax.set_title("trade-off: each policy one point (the upper-left corner is better)", fontsize=9)
    fig.tight_layout()
    path = out / "tradeoff.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)
    return paths


def _pretty(v: Any) -> str:
    """A provenance value as a reader wants it (HTML): numbers rounded, text as text, mappings as
    lists."""
    v = _jsonable(v)
    if v is None or v == "":
        return "&mdash;"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return html.escape(f"{v:.6g}")
    if isinstance(v, dict):
        items = "".join(f"<li>{html.escape(str(k))}: {_pretty(x)}</li>" for k, x in v.items())
        return f"<ul>{items}</ul>"
    if isinstance(v, list):
        return html.escape(", ".join(str(round(x, 6)) if isinstance(x, float) else str(x) for x in v))
    return html.escape(str(v))


def write_html(result, out: Path, images: list[Path], table: str | None = None) -> Path:
    """report.html: the comparison as an HTML table with a column legend, the notes and settings
    below it (wrapped, never clipped), the provenance and the plots. ``table`` is unused (kept for
    callers that pass the terminal table)."""
    from argusdiff.bound import BOUND_LABEL

    bounds = getattr(result, "bounds", {}) or {}
    columns = COLUMNS + ((GAP_COLUMN,) if bounds else ())
    heads = [h for h, _ in columns]
    rows = [
        (label, row + ((_fmt(100 * result.summaries[label].get("bound_gap", float("nan")), ".1f"),) if bounds else ()))
        for label, row in table_rows(result)
    ]
    for name, b in bounds.items():
        rest = ("-",) * (len(heads) - 4)
        rows.append(
            (BOUND_LABEL, (name, f"{_fmt(100 * b.min_violation, '.1f')}%", f"{_fmt(100 * b.quality, '.1f')}%", *rest))
        )
    numeric = set(heads[2:])
    cells = "".join(f"<th title='{html.escape(m)}'>{html.escape(h)}</th>" for h, m in columns)
    body = []
    for label, row in rows:
        tds = [f"<td>{html.escape(label)}</td>"] + [
            f"<td class='{'num' if h in numeric else ''}'>{html.escape(c)}</td>"
            for h, c in zip(heads[1:], row, strict=True)
        ]
        body.append("<tr>" + "".join(tds) + "</tr>")
    legend = "".join(f"<dt>{html.escape(h)}</dt><dd>{html.escape(m)}</dd>" for h, m in columns)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>argusdiff replay report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px}"
        "pre{background:#f4f4f4;padding:8px;font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}"
        "table{border-collapse:collapse}td,th{padding:2px 8px;font-size:12px;border-bottom:1px solid #ddd;"
        "vertical-align:top}th{text-align:left;background:#eee}td.num{text-align:right}"
        "dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:12px}"
        "dt{font-weight:bold}dd{margin:0}img{max-width:100%}ul{margin:0;padding-left:18px}</style></head><body>",
        "<h1>argusdiff replay</h1>",
        f"<table class='comparison'><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>",
        f"<h2>Columns</h2><dl>{legend}</dl>",
        "<h2>Notes and settings</h2>",
        f"<pre>{html.escape(chr(10).join(footer_lines(result)).strip())}</pre>",
        "<h2>Provenance</h2><table>",
    ]
    for k, v in result.provenance.items():
        parts.append(f"<tr><th>{html.escape(str(k).replace('_', ' '))}</th><td>{_pretty(v)}</td></tr>")
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
