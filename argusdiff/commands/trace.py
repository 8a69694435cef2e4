"""``argusdiff trace list|show|gen|convert``: arrival traces."""

from __future__ import annotations

import argparse
import json

from argusdiff.errors import ConfigError

_SPEC_HELP = (
    "a trace file (DiffServe arrival_ms,prompt_idx; Proteus start_ms,qos_level,deadline_ms; Azure Functions "
    "per-minute or hourly CSV; argusdiff CSV) or a generator spec, e.g. bursty:low=60,high=480,period=5m,duration=40m"
)


def _add_load_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help=_SPEC_HELP)
    p.add_argument(
        "--trace-format",
        choices=("argusdiff", "diffserve", "proteus", "azure-minute", "azure-hourly"),
        help="file format (default: detected from the content)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of generators and of assigned prompts")
    p.add_argument("--low", type=float, help="Azure shapes: scale so the minimum rate is LOW QPM (with --high)")
    p.add_argument("--high", type=float, help="Azure shapes: scale so the maximum rate is HIGH QPM (with --low)")
    p.add_argument("--peak", type=float, help="Azure shapes: scale multiplicatively so the peak is PEAK QPM")
    p.add_argument("--mean-qpm", type=float, help="stretch time so the mean load is this many QPM")
    p.add_argument(
        "--window",
        nargs=2,
        type=float,
        metavar=("START_S", "END_S"),
        help="keep only this time window (after --mean-qpm)",
    )
    p.add_argument("--prompts", type=int, metavar="N", help="assign prompt indices in [0, N) when the trace has none")
    p.add_argument("--order", choices=("random", "sequential"), default=None, help="how prompts are assigned")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="generator kinds and shipped shapes", description="generator kinds and shapes")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(run=run_list)
    show = sub.add_parser("show", help="summarize a trace (load per minute)", description="summarize a trace")
    _add_load_options(show)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--per-minute", action="store_true", help="also print the offered load of every minute")
    show.set_defaults(run=run_show)
    for verb, help_text in (
        ("gen", "generate a trace from a spec (or read a file) and write it in the argusdiff CSV format"),
        ("convert", "convert a trace file to the argusdiff CSV format (same options as gen)"),
    ):
        gen = sub.add_parser(verb, help=help_text, description=help_text)
        _add_load_options(gen)
        gen.add_argument("--out", "-o", required=True, help="output file (argusdiff CSV)")
        gen.add_argument("--json", action="store_true", help="print the summary as JSON")
        gen.set_defaults(run=run_gen)


def _load(args: argparse.Namespace):
    from argusdiff.config import load_settings
    from traces.formats import load_trace

    scaling = {k: getattr(args, k) for k in ("low", "high", "peak") if getattr(args, k) is not None}
    order = args.order or load_settings().traces.prompt_order
    trace = load_trace(
        args.trace, seed=args.seed, format=args.trace_format, n_prompts=args.prompts, order=order, **scaling
    )
    if args.mean_qpm is not None:
        if args.mean_qpm <= 0:
            raise ConfigError(f"--mean-qpm: must be > 0, got {args.mean_qpm:g}")
        trace = trace.rescale(mean_qpm=args.mean_qpm)
    if args.window:
        start, end = args.window
        if end <= start:
            raise ConfigError(f"--window: END_S ({end:g}) must be greater than START_S ({start:g})")
        trace = trace.window(start, end)
    return trace


def run_list(args: argparse.Namespace) -> int:
    from traces.formats import FORMATS
    from traces.generators import list_traces

    items = list_traces()
    if args.json:
        print(json.dumps({"generators": items, "file_formats": list(FORMATS)}, indent=2))
        return 0
    width = max(len(i["name"]) for i in items)
    for i in items:
        print(f"{i['name']:<{width}}  {i['help']}")
        print(f"{'':<{width}}  e.g. {i['example']}")
    print(f"file formats (detected from the content): {', '.join(FORMATS)}")
    print("every spec also takes seed=, prompts=N, order=random|sequential; durations take s/m/h")
    return 0


def _sparkline(values) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(values) if len(values) else 0
    if top <= 0:
        return ""
    return "".join(bars[min(8, round(8 * v / top))] for v in values)


def _print_summary(trace) -> None:
    s = trace.summary()
    print(f"{s['name'] or '(unnamed)'}  [{s['format']}]  source: {s['source']}")
    print(
        f"requests {s['requests']}, duration {s['duration_s'] / 60:.1f} min, load mean {s['mean_qpm']:.1f} QPM, "
        f"per-minute min {s['min_qpm']:.0f} / peak {s['peak_qpm']:.0f} QPM"
    )
    extras = []
    if s["has_prompts"]:
        extras.append(f"prompt indices ({s['distinct_prompts']} distinct)")
    if s["has_slo"]:
        extras.append("per-request SLOs")
    if s["has_tier"]:
        extras.append("tiers")
    if extras:
        print("carries: " + ", ".join(extras))


def run_show(args: argparse.Namespace) -> int:
    trace = _load(args)
    per_min = trace.qpm(60.0)
    if args.json:
        out = trace.summary()
        if args.per_minute:
            out["qpm_per_minute"] = [float(x) for x in per_min]
        print(json.dumps(out, indent=2))
        return 0
    _print_summary(trace)
    if len(per_min) > 1:
        step = max(1, len(per_min) // 100)
        coarse = [float(per_min[i : i + step].mean()) for i in range(0, len(per_min), step)]
        print(f"load over time ({step} min per mark): {_sparkline(coarse)}")
    if args.per_minute:
        for i, q in enumerate(per_min):
            print(f"{i:>6} min  {q:8.1f} QPM")
    return 0


def run_gen(args: argparse.Namespace) -> int:
    from traces.formats import write_trace

    trace = _load(args)
    try:
        write_trace(trace, args.out)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {args.out}: {exc.strerror}") from None
    if args.json:
        print(json.dumps({**trace.summary(), "out": args.out}, indent=2))
    else:
        _print_summary(trace)
        print(f"wrote {len(trace)} requests to {args.out}")
    return 0
