#!/usr/bin/env python
"""Profile a deployment's levels on this machine: latency per level and batch size, model load
times, and (optionally) a per-prompt QualityTable. Writes the profile TOML and QualityTable CSV
formats the rest of argusdiff reads.

    python scripts/profile_models.py --profile demo-cpu --out-profile /tmp/demo-cpu.toml \
        --batch-sizes 1,2,4 --quality-out /tmp/demo-cpu-quality.csv --n-prompts 8

On this CPU machine it runs the tiny demo models (a pipeline check); on a GPU with the real
models it produces the real tables. Method:

* load time: first ``from_pretrained`` of each model in a fresh registry (demo models are built
  beforehand, so building is not counted);
* latency of a level at batch b: median over ``--repeats`` runs (after ``--warmup``) of
  denoise + decode. AC levels with K > 0 are timed resuming from latents captured after K steps
  (cache retrieval is not included: workers add it at run time, as the shipped profiles assume);
* quality: each prompt is generated at every level and scored with CLIPScore (open_clip, via
  ``classifiers.scorers``; ``--clip-weights`` gives local weights, without them the CLIP model has
  random weights and the scores only exercise the path). An AC level resumes a prompt from the
  latent of its most similar *other* prompt in the set, as the cache would serve it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except ImportError:  # pragma: no cover
        pass
    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError):  # pragma: no cover
        pass
    return f"{os.cpu_count()}-core {platform.machine()}{mem}, no GPU"


def measure_latencies(profile, registry, batch_sizes, repeats, warmup, prompts):
    """Median time per level and batch size. Levels are timed round-robin within each repeat, so a
    burst of load on a shared machine hits every level alike and the ratios stay meaningful."""
    from workers.pipelines import generate, resume

    out: dict[str, dict[int, float]] = {level.id: {} for level in profile.levels}
    for b in batch_sizes:
        ps = [prompts[i % len(prompts)] for i in range(b)]
        seeds = list(range(b))
        runs = {}
        for level in profile.levels:
            model = registry.load(level.model)
            if level.skip:
                captured = generate(model, ps, seeds, steps=level.steps, capture=(level.skip,), decode_images=False)
                lat = captured.captured[level.skip]

                def run(lat=lat, level=level, model=model, ps=ps, seeds=seeds):
                    resume(model, ps, lat, level.skip, seeds, steps=level.steps)

            else:

                def run(level=level, model=model, ps=ps, seeds=seeds):
                    generate(model, ps, seeds, steps=level.steps)

            runs[level.id] = run
        times: dict[str, list[float]] = {lid: [] for lid in runs}
        for r in range(warmup + repeats):
            for lid, run in runs.items():
                t0 = time.perf_counter()
                run()
                if r >= warmup:
                    times[lid].append(time.perf_counter() - t0)
        for lid in runs:
            out[lid][b] = statistics.median(times[lid])
            print(f"  {lid:<16} batch {b:>3}: {out[lid][b] * 1000:9.1f} ms", flush=True)
    for table in out.values():
        # A larger batch never takes less time (profile validation); CPU noise can break that.
        prev = 0.0
        for b in sorted(table):
            table[b] = max(table[b], prev)
            prev = table[b]
    return out


def measure_load_times(profile, registry_factory, repeats: int = 3) -> dict[str, float]:
    """Median ``from_pretrained`` time per model, each in a fresh registry (after one warm-up load
    so the one-off import of the pipeline classes is not counted)."""
    models = list(dict.fromkeys(level.model for level in profile.levels))
    registry_factory().load(models[0])
    loads: dict[str, float] = {}
    for model in models:
        loads[model] = statistics.median(registry_factory().load(model).load_s for _ in range(repeats))
        print(f"  load {model:<24} {loads[model]:.3f} s", flush=True)
    return loads


def _neighbours(prompts: list[str]) -> list[int]:
    """Index of each prompt's most similar other prompt (MiniLM embeddings; word overlap fallback)."""
    try:
        from traces.embeddings import encode_prompts

        emb = np.asarray(encode_prompts(prompts), dtype=np.float32)
        sim = emb @ emb.T
    except Exception as exc:  # encoder unavailable offline: fall back to word overlap
        print(f"  (prompt encoder unavailable: {exc}; using word overlap)", flush=True)
        sets = [set(p.lower().split()) for p in prompts]
        sim = np.array([[len(a & b) / max(1, len(a | b)) for b in sets] for a in sets], dtype=np.float32)
    np.fill_diagonal(sim, -np.inf)
    return [int(i) for i in sim.argmax(axis=1)]


def measure_quality(profile, registry, prompts, ids, scorer, seed=0):
    from traces.quality import QualityTable
    from workers.pipelines import generate, resume

    nn = _neighbours(prompts)
    scores = np.zeros((len(prompts), len(profile.levels)))
    captured: dict[tuple[str, int], dict[int, object]] = {}
    for j, level in enumerate(profile.levels):
        model = registry.load(level.model)
        images = []
        for i, prompt in enumerate(prompts):
            if level.skip:
                key = (level.model, level.steps)
                if key not in captured:
                    ks = sorted({lv.skip for lv in profile.levels if lv.model == level.model and lv.skip})
                    full = generate(model, prompts, [seed] * len(prompts), steps=level.steps, capture=ks)
                    captured[key] = full.captured
                lat = captured[key][level.skip][nn[i] : nn[i] + 1]
                images.append(resume(model, [prompt], lat, level.skip, [seed], steps=level.steps).images[0])
            else:
                images.append(generate(model, [prompt], [seed], steps=level.steps).images[0])
        scores[:, j] = scorer.score(prompts, images)
        print(f"  quality {level.id:<16} mean {scores[:, j].mean():.3f}", flush=True)
    return scores, QualityTable


def write_profile(profile, latencies, loads, quality, path: Path, header: str) -> None:
    def fmt_lat(table):
        return "{ " + ", ".join(f"{b} = {t:.4g}" for b, t in sorted(table.items())) + " }"

    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [
        "",
        f'name = "{profile.name}"',
        f'gpu = "{profile.gpu}"',
        f"description = {_q(profile.description)}",
    ]
    if profile.slo_s is not None:
        lines.append(f"slo_s = {profile.slo_s:g}")
    for level in profile.levels:
        lines += [
            "",
            "[[levels]]",
            f'id = "{level.id}"',
            f'strategy = "{level.strategy.value}"',
            f'model = "{level.model}"',
            f"steps = {level.steps}",
        ]
        if level.skip:
            lines.append(f"skip = {level.skip}")
        lines += [
            f"latency_s = {fmt_lat(latencies[level.id])}   # measured",
            f"quality = {quality[level.id]:.4g}",
            f"load_time_s = {loads[level.model]:.3g}   # measured",
        ]
        if level.description:
            lines.append(f"description = {_q(level.description)}")
    c = profile.cascade
    if c is not None:
        lines += [
            "",
            "[cascade]",
            f'light = "{c.light}"',
            f'heavy = "{c.heavy}"',
            f"discriminator_latency_s = {c.discriminator_latency_s:g}",
            f"thresholds = [{', '.join(f'{t:g}' for t in c.thresholds)}]",
            f"deferral = [{', '.join(f'{f:g}' for f in c.deferral)}]",
        ]
        if c.quality is not None:
            lines.append(f"quality = [{', '.join(f'{q:g}' for q in c.quality)}]")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _monotone_quality(profile, rel: dict[str, float]) -> dict[str, float]:
    """Relative quality per level, clipped so it never increases down the ladder (profile rule)."""
    out, ceiling = {}, 1.0
    for level in profile.levels:
        q = min(ceiling, max(1e-3, rel[level.id]))
        out[level.id] = q
        ceiling = q
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="demo-cpu", help="profile name or TOML path (default demo-cpu)")
    ap.add_argument("--out-profile", required=True, help="where to write the measured profile TOML")
    ap.add_argument("--batch-sizes", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--prompts", default="builtin", help="prompt set for batches and quality (traces.prompts)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--quality-out", help="write a per-prompt QualityTable CSV here (CLIPScore)")
    ap.add_argument("--clip-model", default="ViT-B-32", help="open_clip architecture or model-config JSON")
    ap.add_argument("--clip-weights", default=None, help="local open_clip weights (without: random weights)")
    ap.add_argument("--note", action="append", default=[], help="extra header comment line (repeatable)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.torch_threads)
    from traces.prompts import load_prompts
    from workers.demo import load_demo_profile
    from workers.registry import ModelRegistry

    profile = load_demo_profile(args.profile)
    batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    pset = load_prompts(args.prompts)
    prompts = list(pset.prompts[: args.n_prompts])
    ids = list(pset.ids[: args.n_prompts])

    def registry_factory():
        return ModelRegistry(device=args.device, models_dir=args.models_dir, max_loaded=8)

    for model in dict.fromkeys(lv.model for lv in profile.levels):  # build demo models before timing loads
        registry_factory().local_path(registry_factory().spec(model))
    machine = _machine()
    date = dt.date.today().isoformat()
    print(f"profiling {profile.name} on {machine}, torch threads {args.torch_threads}, {date}", flush=True)
    loads = measure_load_times(profile, registry_factory)
    registry = registry_factory()
    latencies = measure_latencies(profile, registry, batch_sizes, args.repeats, args.warmup, prompts)

    quality = {lv.id: lv.quality for lv in profile.levels}
    qnote = "quality: kept from the input profile (run with --quality-out to measure)"
    if args.quality_out:
        from classifiers.scorers import make_scorer

        scorer = make_scorer("clipscore", args.clip_model, args.clip_weights, device=registry.device)
        scores, QualityTable = measure_quality(profile, registry, prompts, ids, scorer)
        table = QualityTable(
            level_ids=profile.ids,
            prompt_ids=tuple(ids),
            prompts=tuple(prompts),
            scores=scores,
            metric="clipscore",
            source=f"measured with scripts/profile_models.py on {machine}, {date}"
            + ("" if args.clip_weights else " (CLIP with random weights: exercises the path only)"),
            synthetic=False,
            profile=profile.name,
        )
        table.to_csv(args.quality_out)
        base = max(float(np.mean(scores[:, 0])), 1e-9)
        quality = _monotone_quality(
            profile, {lv.id: float(np.mean(scores[:, j])) / base for j, lv in enumerate(profile.levels)}
        )
        qnote = (
            f"quality: mean CLIPScore relative to {profile.levels[0].id} (clipped monotone), table {args.quality_out}"
        )
    header = "".join(f"{line}\n" for line in args.note) + (
        f"Measured by scripts/profile_models.py --profile {args.profile} on {machine}, {date}.\n"
        f"latency: median of {args.repeats} runs (denoise + decode; AC K>0 = resume from step K), "
        f"torch threads {args.torch_threads}\n{qnote}\nload time: first from_pretrained in a fresh registry"
    )
    write_profile(profile, latencies, loads, quality, Path(args.out_profile), header)
    from argusdiff.errors import ProfileError
    from argusdiff.profile import load_profile

    try:
        checked = load_profile(args.out_profile)  # the written file must validate
    except ProfileError as exc:
        print(f"wrote {args.out_profile}, but it does not validate (noisy timing? rerun with more --repeats): {exc}")
        return 1
    print(f"wrote {args.out_profile} ({len(checked.levels)} levels)", flush=True)
    for lv in checked.levels:
        ratio = lv.latency(1) / checked.levels[0].latency(1)
        print(f"  {lv.id:<16} b=1 {lv.latency(1) * 1000:8.1f} ms  ({ratio:.2f}x of {checked.levels[0].id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
