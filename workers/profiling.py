"""Measuring a profile on this machine: latency per level and batch size, model load time and
memory, and (optionally) per-prompt quality; writing the result as a profile TOML with the
provenance of every number. ``argusdiff profile measure`` is the command line.

Method:

* **load time**: ``from_pretrained`` (or ``from_single_file``) of each model in a fresh registry,
  the median of ``load_repeats`` loads; one warm-up load beforehand so the one-off import of the
  pipeline classes is not counted (demo models are built before that, so building is not either);
* **latency** of a level at batch b: the median of ``repeats`` runs (after ``warmup``) of denoise
  + decode; AC levels with K > 0 are timed resuming from latents captured after K steps (cache
  retrieval is not included: workers add it at run time, as the shipped profiles assume). One
  model is loaded at a time; its levels are timed round-robin within each repeat, so a burst of
  load on a shared machine hits them alike and their ratios stay meaningful. A larger batch is
  never recorded as faster than a smaller one (profile rule; noise can break it);
* **memory**, per model. On CUDA: ``gpu_memory_gib``, what the loaded pipeline allocates
  (``torch.cuda.memory_allocated`` after the load minus before, nothing else loaded), and per
  batch size ``gpu_peak_gib``, the most allocated while running the model's levels
  (``max_memory_allocated``), plus ``gpu_reserved_peak_gib`` (the caching allocator's peak, what
  the device sees apart from the CUDA context). On a CPU there is no GPU memory to measure: the
  numbers are the whole process's resident memory, ``rss_gib`` after the load and
  ``rss_peak_gib`` per batch size (Linux ``VmRSS`` / ``VmHWM``), labelled as such;
* **feature caches**: a level with a ``feature_cache`` is timed with its hook applied, and the
  share of attention work the hook skipped (:mod:`workers.feature_cache`) is recorded per level
  (``feature_cache_hit_rate`` in the model's ``[measured.models.NAME]`` table);
* **quality** (``quality_out``): each prompt generated at every level and scored with CLIPScore;
  an AC level resumes a prompt from the latent of its most similar *other* prompt in the set, as
  the cache would serve it.

torch and diffusers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.domain import Profile

__all__ = [
    "Measurement",
    "ModelMeasurement",
    "measure_profile",
    "measure_quality",
    "monotone_quality",
    "provenance",
    "write_profile",
]

GIB = 2**30
Step = Callable[[str], None]


@dataclass
class ModelMeasurement:
    """What was measured for one model (memory numbers in GiB; see the module doc for their kind)."""

    name: str
    load_s: float
    load_runs: list[float]
    memory_gib: float | None = None  # CUDA: allocated by the loaded pipeline; CPU: process RSS after the load
    peak_gib: dict[int, float] = field(default_factory=dict)  # batch size -> peak while running its levels
    reserved_peak_gib: float | None = None  # CUDA only: the caching allocator's peak
    # feature-cache levels: level id -> share of attention work the cache skipped (mean over timed runs)
    feature_cache_hit_rate: dict[str, float] = field(default_factory=dict)


@dataclass
class Measurement:
    latencies: dict[str, dict[int, float]]  # level id -> batch size -> seconds
    models: dict[str, ModelMeasurement]
    memory_kind: str  # "cuda" or "rss"
    provenance: dict[str, Any]
    settings: dict[str, Any]  # how it was measured (repeats, batch sizes, threads...)


# -- memory -------------------------------------------------------------------------------------


class _Memory:
    kind = "none"

    def current(self) -> float | None:  # bytes
        return None

    def reset_peak(self) -> None:
        pass

    def peak(self) -> float | None:
        return None

    def reserved_peak(self) -> float | None:
        return None

    def sync(self) -> None:
        pass

    def free(self) -> None:
        gc.collect()


class _CudaMemory(_Memory):
    kind = "cuda"

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)

    def current(self) -> float:
        return float(self.torch.cuda.memory_allocated(self.device))

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> float:
        return float(self.torch.cuda.max_memory_allocated(self.device))

    def reserved_peak(self) -> float:
        return float(self.torch.cuda.max_memory_reserved(self.device))

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def free(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()


class _RssMemory(_Memory):
    """Whole-process resident memory from /proc/self/status (Linux)."""

    kind = "rss"

    @staticmethod
    def _status(key: str) -> float | None:
        try:
            text = Path("/proc/self/status").read_text()
        except OSError:
            return None
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
        return None if m is None else float(m[1]) * 1024

    def current(self) -> float | None:
        return self._status("VmRSS")

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError):  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> float | None:
        return self._status("VmHWM")


def _memory(device: str) -> _Memory:
    if device.startswith("cuda"):
        return _CudaMemory(device)
    return _RssMemory() if Path("/proc/self/status").exists() else _Memory()


# -- provenance ---------------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    try:
        import pynvml  # nvidia-ml-py, when installed

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # not installed, or no NVML: ask nvidia-smi
        pass
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(device: str, dtype: str, torch_threads: int | None) -> dict[str, Any]:
    """Where and with what the numbers were measured: device, driver, library versions, date."""
    import diffusers
    import torch
    import transformers

    from argusdiff import __version__

    out: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "argusdiff": __version__,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dtype": dtype,
        "torch_threads": torch_threads if torch_threads is not None else torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        out.update(
            {
                "device": f"{props.name} (cuda:{index})",
                "device_memory_gib": round(props.total_memory / GIB, 2),
                "gpus_visible": torch.cuda.device_count(),
                "driver": _nvidia_driver(),
                "cuda": str(torch.version.cuda),
                "cudnn": str(torch.backends.cudnn.version()),
            }
        )
    else:
        mem = None
        with contextlib.suppress(ValueError, OSError):
            mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
        out.update(
            {
                "device": f"cpu: {_cpu_name()}, {os.cpu_count()} cores",
                "device_memory_gib": None if mem is None else round(mem, 1),
                "driver": "none (CPU run, no GPU)",
            }
        )
    return {k: v for k, v in out.items() if v is not None}


# -- latency, load time, memory -----------------------------------------------------------------


def _models(profile: Profile) -> list[str]:
    return list(dict.fromkeys(level.model for level in profile.levels))


def measure_profile(
    profile: Profile,
    registry_factory: Callable[[], Any],
    *,
    batch_sizes: Sequence[int],
    prompts: Sequence[str],
    repeats: int = 5,
    warmup: int = 1,
    load_repeats: int = 3,
    step: Step | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict[int, float]], dict[str, ModelMeasurement], str]:
    """Latency per level and batch size, and load time and memory per model (module doc).

    ``registry_factory()`` gives a fresh :class:`workers.registry.ModelRegistry`; ``step(what)``
    is called once per timed unit of work (progress bars); ``log`` gets one line per result.
    Returns (latencies, models, memory kind)."""
    tick = step or (lambda what: None)
    say = log or (lambda line: None)
    models = _models(profile)
    first = registry_factory()
    for name in models:  # build demo models (not timed)
        first.local_path(first.spec(name))
    memory = _memory(first.device)
    first.load(models[0])  # warm-up: imports and first-use costs are not load time
    del first
    memory.free()

    latencies: dict[str, dict[int, float]] = {level.id: {} for level in profile.levels}
    out: dict[str, ModelMeasurement] = {}
    for name in models:
        runs: list[float] = []
        registry = None
        loaded = None
        before = after = None
        for _ in range(max(1, load_repeats)):
            registry = loaded = None
            memory.free()
            registry = registry_factory()
            before = memory.current()
            loaded = registry.load(name)
            memory.sync()
            after = memory.current()
            runs.append(loaded.load_s)
            tick(f"load {name}")
        assert registry is not None and loaded is not None
        if memory.kind == "cuda" and before is not None and after is not None:
            weights = (after - before) / GIB
        else:
            weights = None if after is None else after / GIB
        result = ModelMeasurement(name=name, load_s=statistics.median(runs), load_runs=runs, memory_gib=weights)
        say(f"  load {name:<24} {result.load_s:.3f} s" + (f", {weights:.2f} GiB" if weights is not None else ""))
        levels = [lv for lv in profile.levels if lv.model == name]
        reserved = 0.0
        for b in batch_sizes:
            ps = [prompts[i % len(prompts)] for i in range(b)]
            seeds = list(range(b))
            memory.reset_peak()
            jobs = {level.id: _timed_run(loaded, level, ps, seeds) for level in levels}
            times: dict[str, list[float]] = {lid: [] for lid in jobs}
            rates: dict[str, list[float]] = {}
            for r in range(warmup + repeats):
                for lid, job in jobs.items():
                    memory.sync()
                    t0 = time.perf_counter()
                    gen = job()
                    memory.sync()
                    if r >= warmup:
                        times[lid].append(time.perf_counter() - t0)
                        if getattr(gen, "feature_cache_hit_rate", None) is not None:
                            rates.setdefault(lid, []).append(gen.feature_cache_hit_rate)
                    tick(f"{lid} batch {b}")
            for lid, values in rates.items():
                result.feature_cache_hit_rate[lid] = statistics.fmean(values)
                say(f"  {lid:<16} batch {b:>3}: feature cache skipped {statistics.fmean(values):.1%} of attention")
            for lid, ts in times.items():
                latencies[lid][b] = statistics.median(ts)
                say(f"  {lid:<16} batch {b:>3}: {latencies[lid][b] * 1000:9.1f} ms")
            peak = memory.peak()
            if peak is not None:
                result.peak_gib[b] = peak / GIB
            reserved = max(reserved, memory.reserved_peak() or 0.0)
        if memory.kind == "cuda":
            result.reserved_peak_gib = reserved / GIB
        out[name] = result
        registry = loaded = jobs = None
        memory.free()
    for table in latencies.values():
        previous = 0.0
        for b in sorted(table):
            table[b] = max(table[b], previous)
            previous = table[b]
    return latencies, out, memory.kind


def _timed_run(loaded: Any, level: Any, prompts: list[str], seeds: list[int]) -> Callable[[], Any]:
    """One run of ``level`` at this batch: all N steps, or (AC, K > 0) a resume from latents
    captured after K steps, captured here once (not timed)."""
    from workers.pipelines import generate, resume

    if not level.skip:
        return partial(generate, loaded, prompts, seeds, steps=level.steps, feature_cache=level.feature_cache)
    captured = generate(loaded, prompts, seeds, steps=level.steps, capture=(level.skip,), decode_images=False)
    return partial(resume, loaded, prompts, captured.captured[level.skip], level.skip, seeds, steps=level.steps)


def steps_of(profile: Profile, batch_sizes: Sequence[int], repeats: int, warmup: int, load_repeats: int) -> int:
    """How many times :func:`measure_profile` calls ``step`` (the progress bar's total)."""
    return len(_models(profile)) * max(1, load_repeats) + len(profile.levels) * len(batch_sizes) * (warmup + repeats)


# -- quality ------------------------------------------------------------------------------------


def _neighbours(prompts: list[str]) -> list[int]:
    """Index of each prompt's most similar other prompt (MiniLM embeddings; word overlap fallback)."""
    try:
        from traces.embeddings import encode_prompts

        emb = np.asarray(encode_prompts(prompts), dtype=np.float32)
        sim = emb @ emb.T
    except Exception:  # encoder unavailable offline: fall back to word overlap
        sets = [set(p.lower().split()) for p in prompts]
        sim = np.array([[len(a & b) / max(1, len(a | b)) for b in sets] for a in sets], dtype=np.float32)
    np.fill_diagonal(sim, -np.inf)
    return [int(i) for i in sim.argmax(axis=1)]


def measure_quality(
    profile: Profile, registry: Any, prompts: list[str], scorer: Any, *, seed: int = 0, step: Step | None = None
) -> np.ndarray:
    """Scores (prompts × levels): every prompt at every level, AC levels resumed from the latent of
    the prompt's nearest other prompt."""
    from workers.ac import ac_capture_ks
    from workers.pipelines import generate, resume

    tick = step or (lambda what: None)
    nn = _neighbours(prompts)
    scores = np.zeros((len(prompts), len(profile.levels)))
    captured: dict[tuple[str, int], dict[int, Any]] = {}
    for j, level in enumerate(profile.levels):
        model = registry.load(level.model)
        images = []
        for i, prompt in enumerate(prompts):
            if level.skip:
                key = (level.model, level.steps)
                if key not in captured:
                    ks = ac_capture_ks(profile, level)
                    full = generate(model, prompts, [seed] * len(prompts), steps=level.steps, capture=ks)
                    captured[key] = full.captured
                lat = captured[key][level.skip][nn[i] : nn[i] + 1]
                images.append(resume(model, [prompt], lat, level.skip, [seed], steps=level.steps).images[0])
            else:
                gen = generate(model, [prompt], [seed], steps=level.steps, feature_cache=level.feature_cache)
                images.append(gen.images[0])
            tick(f"quality {level.id}")
        scores[:, j] = scorer.score(prompts, images)
    return scores


def monotone_quality(profile: Profile, relative: dict[str, float]) -> dict[str, float]:
    """Relative quality per level, clipped so it never increases down the ladder (profile rule)."""
    out, ceiling = {}, 1.0
    for level in profile.levels:
        q = min(ceiling, max(1e-3, relative[level.id]))
        out[level.id] = q
        ceiling = q
    return out


# -- writing ------------------------------------------------------------------------------------

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
#: Memory numbers of a model in the ``[measured.models.NAME]`` table: (attribute, key, comment).
_MEMORY_KEYS = {
    "cuda": (
        ("memory_gib", "gpu_memory_gib", "allocated by the loaded pipeline"),
        ("peak_gib", "gpu_peak_gib", "batch size = peak allocated"),
        ("reserved_peak_gib", "gpu_reserved_peak_gib", ""),
    ),
    "rss": (
        ("memory_gib", "rss_gib", "whole-process RSS after the load (CPU run)"),
        ("peak_gib", "rss_peak_gib", "batch size = peak process RSS (VmHWM)"),
    ),
}


def _key(name: str) -> str:
    return name if _BARE.match(name) else _str(name)


def _str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return _str(str(value))


def write_profile(
    profile: Profile,
    measurement: Measurement,
    quality: dict[str, float],
    path: str | Path,
    *,
    name: str | None = None,
    gpu: str | None = None,
    header: Sequence[str] = (),
) -> Path:
    """The measured profile as TOML: the input's levels (ids, strategies, steps, K, cascade) with
    measured ``latency_s`` and ``load_time_s``, ``quality`` from ``quality``, and a ``[measured]``
    table (provenance, method, per-model memory) that the planner does not read."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [
        "",
        f"name = {_str(name or profile.name)}",
        f"gpu = {_str(gpu or profile.gpu)}",
        f"description = {_str(profile.description)}",
    ]
    if profile.slo_s is not None:
        lines.append(f"slo_s = {profile.slo_s:g}")
    models = measurement.models
    for level in profile.levels:
        latency = "{ " + ", ".join(f"{b} = {t:.4g}" for b, t in sorted(measurement.latencies[level.id].items())) + " }"
        lines += [
            "",
            "[[levels]]",
            f"id = {_str(level.id)}",
            f"strategy = {_str(level.strategy.value)}",
            f"model = {_str(level.model)}",
            f"steps = {level.steps}",
        ]
        if level.skip:
            lines.append(f"skip = {level.skip}")
        if level.feature_cache:
            lines.append(f"feature_cache = {_value(dict(level.feature_cache))}")
        lines += [
            f"latency_s = {latency}   # measured",
            f"quality = {quality[level.id]:.4g}",
            f"load_time_s = {models[level.model].load_s:.3g}   # measured",
        ]
        if level.description:
            lines.append(f"description = {_str(level.description)}")
    # a deployment profile's pairs ([[cascades]]) or a cascade profile's one pair ([cascade])
    pairs = [(c, "[[cascades]]") for c in profile.cascades] or (
        [(profile.cascade, "[cascade]")] if profile.cascade is not None else []
    )
    for c, table in pairs:
        lines += [
            "",
            f"{table}   # kept from the input profile: f(t) comes from train-discriminator, not from timing",
            f"light = {_str(c.light)}",
            f"heavy = {_str(c.heavy)}",
        ]
        if c.resume:
            lines.append("resume = true")
        if c.diffserve_pair is not None:
            lines.append(f"diffserve_pair = {_str(c.diffserve_pair)}")
        lines += [
            f"discriminator_latency_s = {c.discriminator_latency_s:g}",
            f"thresholds = [{', '.join(f'{t:g}' for t in c.thresholds)}]",
            f"deferral = [{', '.join(f'{f:g}' for f in c.deferral)}]",
        ]
        if c.quality is not None:
            lines.append(f"quality = [{', '.join(f'{q:g}' for q in c.quality)}]")
    lines += ["", "[measured]   # provenance and per-model measurements; the planner does not read this table"]
    for key, value in {**measurement.provenance, **measurement.settings}.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for model in models.values():
        lines += ["", f"[measured.models.{_key(model.name)}]", f"load_s = {_value(model.load_s)}"]
        lines.append(f"load_s_runs = {_value([round(x, 4) for x in model.load_runs])}")
        for attr, key, note in _MEMORY_KEYS.get(measurement.memory_kind, ()):
            value = getattr(model, attr)
            if value is not None and value != {}:
                lines.append(f"{key} = {_value(value)}" + (f"   # {note}" if note else ""))
        if model.feature_cache_hit_rate:
            rates = {k: round(v, 4) for k, v in model.feature_cache_hit_rate.items()}
            lines.append(f"feature_cache_hit_rate = {_value(rates)}   # level = share of attention work skipped")
    out = Path(path)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
