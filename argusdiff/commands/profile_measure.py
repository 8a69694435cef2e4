"""``argusdiff profile measure``: measure a profile's levels on this machine and write the profile.

Examples::

    # SD-XL from a local folder, on this machine's GPU, batch sizes 1..8
    argusdiff profile measure --profile sdxl-ac-a100 --model sdxl-base-1.0=/models/sdxl-base \\
        --batch-sizes 1,2,4,8 --gpu-name H100-80GB --out sdxl-ac-h100.toml
    # the tiny CPU models (a pipeline check)
    argusdiff profile measure --profile demo-cpu --out /tmp/demo-cpu.toml --batch-sizes 1,2 --repeats 3

It loads each model of the profile (registry names, ``[workers.models]`` overrides, ``--model``),
measures latency per level and batch size, load time and memory per model, optionally a
CLIPScore quality table, and writes a profile TOML whose ``[measured]`` table records the device,
driver, library versions and date. The written file is validated before the command succeeds.
Method: :mod:`workers.profiling`.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from argusdiff.errors import ConfigError


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile whose levels to measure: shipped name or TOML (default: settings)")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the measured profile TOML")
    parser.add_argument("--config", metavar="FILE", help="settings TOML ([workers]: device, dtype, models, models_dir)")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help="load model NAME from SOURCE (local diffusers folder, single checkpoint file or hub id); repeatable",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: [workers] device)")
    parser.add_argument(
        "--dtype", choices=("auto", "float16", "bfloat16", "float32"), help="weights dtype (default: [workers] dtype)"
    )
    parser.add_argument("--models-dir", help="where demo models are built (default: [workers] models_dir)")
    parser.add_argument("--batch-sizes", type=_sizes, default="1,2,4", help="batch sizes to time, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per level and batch size (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    parser.add_argument("--load-repeats", type=int, default=3, help="loads per model (median)")
    parser.add_argument("--torch-threads", type=int, help="torch intra-op threads (default: [workers] torch_threads)")
    parser.add_argument("--prompts", default="builtin", help="prompt set for the batches and the quality table")
    parser.add_argument("--n-prompts", type=int, default=8, help="prompts used")
    parser.add_argument("--quality-out", metavar="CSV", help="also score every level (CLIPScore) into this table")
    parser.add_argument("--clip-model", default="ViT-B-32", help="open_clip architecture or model-config JSON")
    parser.add_argument("--clip-weights", help="local open_clip weights (without them: random weights, a path check)")
    parser.add_argument("--name", help="name of the written profile (default: the input's)")
    parser.add_argument("--gpu-name", help="its `gpu` field (default: the measured device's name)")
    parser.add_argument("--note", action="append", default=[], help="extra header comment line; repeatable")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-measurement lines")
    parser.set_defaults(run=run)


def _check(args: argparse.Namespace) -> None:
    for option, value, least in (
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
        ("--load-repeats", args.load_repeats, 1),
        ("--n-prompts", args.n_prompts, 1),
        ("--torch-threads", args.torch_threads, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{option}: must be >= {least}, got {value}")
    if args.quality_out and args.n_prompts < 2:
        raise ConfigError("--n-prompts: the quality table needs >= 2 prompts (AC levels resume from another prompt)")


def _overrides(args: argparse.Namespace, settings) -> dict:
    models = {name: dict(over) for name, over in settings.workers.models.items()}
    for item in args.model:
        name, sep, source = item.partition("=")
        if not sep or not name.strip() or not source.strip():
            raise ConfigError(f"--model: expected NAME=SOURCE, got {item!r}")
        models.setdefault(name.strip(), {})["source"] = source.strip()
    return models


def _gpu_label(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(torch.device(device).index or 0)


def run(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from argusdiff.profile import load_profile

    _check(args)
    settings = load_settings(args.config)
    profile = load_profile(args.profile or settings.profile)
    overrides = _overrides(args, settings)
    workers = settings.workers
    device = args.device or workers.device
    dtype = args.dtype or workers.dtype
    models_dir = args.models_dir or workers.models_dir
    threads = args.torch_threads or workers.torch_threads
    from traces.prompts import load_prompts

    pset = load_prompts(args.prompts)
    prompts = list(pset.prompts[: args.n_prompts])

    import torch

    from workers.errors import UnknownModel
    from workers.registry import ModelRegistry, resolve_device

    if threads:
        torch.set_num_threads(threads)
    try:
        device = resolve_device(device)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--device: {device} asked for, but torch sees no CUDA device")

        def registry_factory() -> ModelRegistry:
            return ModelRegistry(overrides=overrides, device=device, dtype=dtype, models_dir=models_dir, max_loaded=1)

        probe = registry_factory()
        for level in profile.levels:
            probe.spec(level.model)
    except UnknownModel as exc:
        raise ConfigError(f"--profile/--model: {exc}") from None
    from workers.profiling import measure_profile, provenance, steps_of, write_profile

    bar, step, log = _progress(
        args,
        steps_of(profile, args.batch_sizes, args.repeats, args.warmup, args.load_repeats)
        + (len(profile.levels) * len(prompts) if args.quality_out else 0),
    )
    info = provenance(device, probe.torch_dtype_name(), threads)
    log(f"measuring {profile.name} on {info['device']}, {probe.torch_dtype_name()}, {info['date']}")
    try:
        latencies, models, memory_kind = measure_profile(
            profile,
            registry_factory,
            batch_sizes=args.batch_sizes,
            prompts=prompts,
            repeats=args.repeats,
            warmup=args.warmup,
            load_repeats=args.load_repeats,
            step=step,
            log=log,
        )
        quality = {lv.id: lv.quality for lv in profile.levels}
        quality_note = "kept from the input profile (--quality-out measures it)"
        if args.quality_out:
            quality, quality_note = _quality(args, profile, registry_factory(), prompts, pset, info, step)
    finally:
        if bar is not None:
            bar.close()
    measurement = _measurement(args, settings, latencies, models, memory_kind, info, quality_note)
    header = [
        *args.note,
        f"Measured by `argusdiff profile measure` from {profile.name} on {info['device']}, {info['date']}.",
        f"torch {info['torch']}, diffusers {info['diffusers']}, {info['dtype']}; driver {info['driver']}.",
        "latency_s and load_time_s are measured (method and memory in [measured] below); quality: " + quality_note,
    ]
    out = write_profile(
        profile,
        measurement,
        quality,
        args.out,
        name=args.name,
        gpu=args.gpu_name or _gpu_label(device),
        header=header,
    )
    from argusdiff.errors import ProfileError

    try:
        checked = load_profile(out)  # the written file must validate
    except ProfileError as exc:
        print(
            f"wrote {out}, but it does not validate (noisy timing? rerun with more --repeats): {exc}", file=sys.stderr
        )
        return 1
    _print_written(out, checked, models, memory_kind)
    return 0


def _progress(args: argparse.Namespace, total: int):
    """``(bar, step, log)``: a progress bar of ``total`` runs on a terminal (None elsewhere), the
    callback each run calls, and how a line is logged (above the bar, or plain to stderr unless
    ``--quiet``)."""
    bar = None
    if not args.quiet and sys.stderr.isatty():  # a progress bar on a terminal; plain lines otherwise
        from tqdm import tqdm

        bar = tqdm(total=total, desc="measure", unit="run", file=sys.stderr, dynamic_ncols=True)

    def step(what: str) -> None:
        if bar is not None:
            bar.set_description(what[:32])
            bar.update(1)

    def log(line: str) -> None:
        if bar is not None:
            bar.write(line, file=sys.stderr)
        elif not args.quiet:
            print(line, file=sys.stderr, flush=True)

    return bar, step, log


def _measurement(args, settings, latencies, models, memory_kind, info, quality_note):
    """The ``[measured]`` record of a run: what was measured, how, and with which command."""
    from workers.profiling import Measurement

    memory_note = {
        "cuda": "GPU memory per model: allocated by the loaded pipeline, and peak allocated per batch size",
        "rss": "CPU run, GPU memory not measured: whole-process resident memory (RSS) after each load and its "
        "peak per batch size",
    }.get(memory_kind, "not measured (no /proc on this system)")
    command = "argusdiff " + shlex.join(getattr(args, "argv", ("profile", "measure")))
    return Measurement(
        latencies=latencies,
        models=models,
        memory_kind=memory_kind,
        provenance=info,
        settings={
            "command": command,
            "input_profile": args.profile or settings.profile,
            "batch_sizes": list(args.batch_sizes),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "load_repeats": args.load_repeats,
            "latency": "median per batch: denoise + decode; AC K > 0 resumed from step K (no cache retrieval)",
            "load_time": "median from_pretrained/from_single_file in a fresh registry, after one warm-up load",
            "memory": memory_note,
            "quality": quality_note,
        },
    )


def _print_written(out, checked, models, memory_kind) -> None:
    """The written profile's summary: each level's latency at batch 1 (and its ratio to the first
    level's), load time and memory."""
    print(f"wrote {out}: {checked.name} on {checked.gpu}, {len(checked.levels)} levels")
    base = checked.levels[0].latency(1)
    for lv in checked.levels:
        model = models[lv.model]
        kind = "GPU" if memory_kind == "cuda" else "process RSS"
        mem = "" if model.memory_gib is None else f", {kind} {model.memory_gib:.2f} GiB"
        print(
            f"  {lv.id:<16} b=1 {lv.latency(1) * 1000:8.1f} ms ({lv.latency(1) / base:.2f}x)  "
            f"load {lv.load_time_s:.2f} s{mem}"
        )


def _quality(args, profile, registry, prompts, pset, info, step):
    import numpy as np

    from classifiers.scorers import make_scorer
    from traces.quality import QualityTable
    from workers.profiling import measure_quality, monotone_quality

    scorer = make_scorer("clipscore", args.clip_model, args.clip_weights, device=registry.device)
    scores = measure_quality(profile, registry, prompts, scorer, step=step)
    QualityTable(
        level_ids=profile.ids,
        prompt_ids=tuple(pset.ids[: len(prompts)]),
        prompts=tuple(prompts),
        scores=scores,
        metric="clipscore",
        source=f"measured with argusdiff profile measure on {info['device']}, {info['date']}"
        + ("" if args.clip_weights else " (CLIP with random weights: exercises the path only)"),
        synthetic=False,
        profile=profile.name,
    ).to_csv(args.quality_out)
    best = max(float(np.mean(scores[:, 0])), 1e-9)
    relative = {lv.id: float(np.mean(scores[:, j])) / best for j, lv in enumerate(profile.levels)}
    note = f"mean CLIPScore relative to {profile.levels[0].id} (clipped monotone), table {args.quality_out}"
    if not args.clip_weights:
        note += " (random CLIP weights: a path check, not quality)"
    return monotone_quality(profile, relative), note
