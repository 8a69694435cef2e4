"""Loading and validating deployment profiles (TOML) into :class:`~argusdiff.domain.Profile`.

A profile lists the approximation levels of one deployment, slowest/best first, with their
profiled latencies, quality and model-load times. Shipped profiles live in
``argusdiff/profiles/*.toml``; every number in them cites its source in a comment.

Validation rules (each failure names the file, the level and the field):

* ids are unique, non-empty and URL-safe (``[A-Za-z0-9._-]``);
* ``strategy`` is one of ``ac``, ``sm``, ``cascade``;
* ``steps`` ≥ 1, ``0 ≤ skip < steps``; ``skip`` > 0 only for ``ac`` levels;
* latencies are positive and finite, batch sizes are positive integers, and a larger batch
  never takes less time than a smaller one;
* ``quality`` is in (0, 1]; ``load_time_s`` ≥ 0; ``memory_gb`` (optional) > 0;
* ``estimated`` lists the level's fields whose values are estimates rather than from the profile's
  ``[sources]`` (a table naming, per field, the one source its values come from);
* ``feature_cache`` (optional) names a diffusers feature cache the level's runs apply to its
  model's denoiser: ``{ method = "first_block", threshold = 0.08 }`` (methods:
  :data:`FEATURE_CACHE_METHODS`; the other keys are the method's config fields, numbers, strings,
  booleans or lists of them, checked by the worker when it builds the config). Only on an ``ac``
  level with K = 0: it shares the worker of the model's other AC levels (no load to switch);
* ``gpu_memory_gb`` (optional) > 0, and every level's model fits in it;
* the levels are monotone: peak throughput never decreases and quality never increases from
  one level to the next (ARGUS orders v1..vn slowest/best first; ODA relies on it);
* a ``[cascade]`` table names two existing levels, the light one faster than the heavy one, and
  an f(t) table whose thresholds increase within [0, 1] and whose deferral fractions lie in
  [0, 1] and never decrease;
* a deployment profile lists its light→heavy pairs as ``[[cascades]]`` entries (the same fields
  as ``[cascade]``, plus ``resume``: a deferral resumes the heavy model from the light image's
  latent), next to AC levels and smaller models. Each names two existing levels; a level starts
  at most one cascade; ``[cascade]`` and ``[[cascades]]`` do not mix. Such a profile, or one with
  both AC and SM levels, is ordered by quality only (best first): its levels are paths of one
  plan, not one ladder, so the throughput order does not apply;
* an optional ``[measured]`` table (written by ``argusdiff profile measure``: device, driver,
  library versions, date, per-model memory) must be a table; the planner does not read it.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from argusdiff.domain import FEATURE_CACHE_METHODS, AdapterSpec, ApproxLevel, CascadeSpec, Profile, Strategy
from argusdiff.errors import ProfileError

__all__ = [
    "FEATURE_CACHE_METHODS",
    "PROFILE_DIR",
    "SOURCED_FIELDS",
    "ProfileError",
    "list_profiles",
    "load_profile",
    "parse_profile",
    "resolve_profile",
]

PROFILE_DIR = Path(__file__).parent / "profiles"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

_LEVEL_FIELDS = {
    "id",
    "strategy",
    "model",
    "steps",
    "skip",
    "latency_s",
    "quality",
    "load_time_s",
    "peak_qpm",
    "description",
    "memory_gb",
    "estimated",
    "feature_cache",
}
#: level fields a profile may state a source for, or mark as estimated
SOURCED_FIELDS = ("latency_s", "quality", "load_time_s", "memory_gb")
_TOP_FIELDS = {
    "name",
    "gpu",
    "description",
    "levels",
    "cascade",
    "cascades",
    "slo_s",
    "measured",
    "gpu_memory_gb",
    "sources",
    "adapters",
}
_ADAPTER_FIELDS = {"name", "model", "source", "scale", "scale_min", "scale_max", "weight_name"}
_SOURCE_KEYS = {*SOURCED_FIELDS, "gpu_memory_gb", "slo_s", "cascade"}
_CASCADE_FIELDS = {"light", "heavy", "discriminator_latency_s", "thresholds", "deferral", "quality", "diffserve_pair"}
_CASCADES_FIELDS = {*_CASCADE_FIELDS, "resume", "description"}


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def resolve_profile(name_or_path: str | Path) -> Path:
    """A shipped profile name (``sdxl-ac-a100``) or a path to a TOML file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.is_file():
            raise ProfileError(f"{candidate}: no such profile file")
        return candidate
    shipped = PROFILE_DIR / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    raise ProfileError(
        f"unknown profile {str(name_or_path)!r}: not a file and not a shipped profile "
        f"(shipped: {', '.join(list_profiles())})"
    )


def load_profile(name_or_path: str | Path) -> Profile:
    """Load and validate a profile by shipped name or path."""
    path = resolve_profile(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_profile(data, source=str(path))


def _num(where: str, field: str, value: Any, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "an integer" if integer else "a number"
        raise ProfileError(f"{where}: field {field!r} must be {kind}, got {value!r}")
    if integer and not isinstance(value, int):
        raise ProfileError(f"{where}: field {field!r} must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise ProfileError(f"{where}: field {field!r} must be finite, got {value!r}")
    return value


def _parse_latency(where: str, raw: Any) -> dict[int, float]:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = {"1": raw}
    if not isinstance(raw, dict) or not raw:
        raise ProfileError(f"{where}: field 'latency_s' must be a number or a table of batch size = seconds")
    table: dict[int, float] = {}
    for key, value in raw.items():
        try:
            batch = int(key)
        except ValueError:
            raise ProfileError(f"{where}: field 'latency_s' has a batch size {key!r} that is not an integer") from None
        if batch < 1:
            raise ProfileError(f"{where}: field 'latency_s' has batch size {batch} < 1")
        seconds = _num(where, f"latency_s.{key}", value)
        if seconds <= 0:
            raise ProfileError(f"{where}: field 'latency_s.{key}' must be positive, got {seconds!r}")
        table[batch] = float(seconds)
    previous = 0.0
    for batch in sorted(table):
        if table[batch] < previous:
            raise ProfileError(
                f"{where}: field 'latency_s' decreases at batch size {batch} ({table[batch]} s < {previous} s)"
            )
        previous = table[batch]
    return table


def _parse_level(where: str, raw: Any) -> ApproxLevel:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: each [[levels]] entry must be a table")
    if isinstance(raw.get("id"), str):
        where = f"{where} ({raw['id']})"
    unknown = set(raw) - _LEVEL_FIELDS
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for required in ("id", "strategy", "model", "steps", "latency_s", "quality", "load_time_s"):
        if required not in raw:
            raise ProfileError(f"{where}: missing field {required!r}")
    level_id = raw["id"]
    if not isinstance(level_id, str) or not _ID.match(level_id):
        raise ProfileError(f"{where}: field 'id' must match [A-Za-z0-9][A-Za-z0-9._-]*, got {level_id!r}")
    try:
        strategy = Strategy(raw["strategy"])
    except ValueError:
        raise ProfileError(
            f"{where}: field 'strategy' must be one of ac, sm, cascade, got {raw['strategy']!r}"
        ) from None
    model = raw["model"]
    if not isinstance(model, str) or not model:
        raise ProfileError(f"{where}: field 'model' must be a non-empty string")
    steps = int(_num(where, "steps", raw["steps"], integer=True))
    if steps < 1:
        raise ProfileError(f"{where}: field 'steps' must be >= 1, got {steps}")
    skip = int(_num(where, "skip", raw.get("skip", 0), integer=True))
    if skip < 0 or skip >= steps:
        raise ProfileError(f"{where}: field 'skip' (K) must satisfy 0 <= K < steps ({steps}), got {skip}")
    if skip and strategy is not Strategy.AC:
        raise ProfileError(f"{where}: field 'skip' is only meaningful for strategy 'ac', got K={skip}")
    quality = _num(where, "quality", raw["quality"])
    if not 0.0 < quality <= 1.0:
        raise ProfileError(f"{where}: field 'quality' must be in (0, 1], got {quality!r}")
    load_time = _num(where, "load_time_s", raw["load_time_s"])
    if load_time < 0:
        raise ProfileError(f"{where}: field 'load_time_s' must be >= 0, got {load_time!r}")
    peak = raw.get("peak_qpm")
    if peak is not None:
        peak = _num(where, "peak_qpm", peak)
        if peak <= 0:
            raise ProfileError(f"{where}: field 'peak_qpm' must be positive, got {peak!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{where}: field 'description' must be a string")
    memory = raw.get("memory_gb")
    if memory is not None:
        memory = _num(where, "memory_gb", memory)
        if memory <= 0:
            raise ProfileError(f"{where}: field 'memory_gb' must be positive, got {memory!r}")
    estimated = raw.get("estimated", [])
    if not isinstance(estimated, list) or not all(isinstance(x, str) for x in estimated):
        raise ProfileError(f"{where}: field 'estimated' must be a list of field names")
    bad = [x for x in estimated if x not in SOURCED_FIELDS]
    if bad:
        raise ProfileError(f"{where}: field 'estimated' names unknown field(s) {', '.join(bad)}")
    feature_cache = _parse_feature_cache(where, raw.get("feature_cache"), strategy, skip)
    return ApproxLevel(
        id=level_id,
        strategy=strategy,
        model=model,
        steps=steps,
        skip=skip,
        latency_s=_parse_latency(where, raw["latency_s"]),
        quality=float(quality),
        load_time_s=float(load_time),
        peak_qpm_override=None if peak is None else float(peak),
        description=description,
        memory_gb=None if memory is None else float(memory),
        estimated=tuple(estimated),
        feature_cache=feature_cache,
    )


def _scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | str) and not (isinstance(value, float) and not math.isfinite(value))


def _parse_feature_cache(where: str, raw: Any, strategy: Strategy, skip: int) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: field 'feature_cache' must be a table such as {{ method = \"first_block\" }}")
    method = raw.get("method")
    if method not in FEATURE_CACHE_METHODS:
        raise ProfileError(
            f"{where}: field 'feature_cache.method' must be one of {', '.join(FEATURE_CACHE_METHODS)}, got {method!r}"
        )
    for key, value in raw.items():
        ok = _scalar(value) or (isinstance(value, list) and all(_scalar(v) for v in value))
        if not ok:
            raise ProfileError(
                f"{where}: field 'feature_cache.{key}' must be a number, string, boolean or list of them"
            )
    if strategy is not Strategy.AC or skip:
        raise ProfileError(
            f"{where}: field 'feature_cache' needs strategy 'ac' with K = 0 (a feature-cache level runs all N "
            "steps of its model, which it shares with the model's other AC levels)"
        )
    return dict(raw)


def _parse_cascade(where: str, raw: Any, levels: dict[str, ApproxLevel], *, entry: int | None = None) -> CascadeSpec:
    where = f"{where} [cascade]" if entry is None else f"{where} [[cascades]] #{entry}"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: must be a table")
    if entry is not None and isinstance(raw.get("light"), str):
        where = f"{where} ({raw['light']})"
    unknown = set(raw) - (_CASCADE_FIELDS if entry is None else _CASCADES_FIELDS)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for required in ("light", "heavy", "discriminator_latency_s", "thresholds", "deferral"):
        if required not in raw:
            raise ProfileError(f"{where}: missing field {required!r}")
    light, heavy = raw["light"], raw["heavy"]
    for field in ("light", "heavy"):
        if raw[field] not in levels:
            raise ProfileError(f"{where}: field {field!r} names unknown level {raw[field]!r}")
    if light == heavy:
        raise ProfileError(f"{where}: fields 'light' and 'heavy' name the same level {light!r}")
    if levels[light].peak_qpm <= levels[heavy].peak_qpm:
        raise ProfileError(f"{where}: field 'light' ({light}) must be faster than 'heavy' ({heavy})")
    disc = _num(where, "discriminator_latency_s", raw["discriminator_latency_s"])
    if disc < 0:
        raise ProfileError(f"{where}: field 'discriminator_latency_s' must be >= 0, got {disc!r}")
    thresholds = raw["thresholds"]
    deferral = raw["deferral"]
    if not isinstance(thresholds, list) or len(thresholds) < 2:
        raise ProfileError(f"{where}: field 'thresholds' must be a list of at least two numbers")
    if not isinstance(deferral, list) or len(deferral) != len(thresholds):
        raise ProfileError(f"{where}: field 'deferral' must be a list as long as 'thresholds' ({len(thresholds)})")
    ts = [float(_num(where, f"thresholds[{i}]", t)) for i, t in enumerate(thresholds)]
    fs = [float(_num(where, f"deferral[{i}]", f)) for i, f in enumerate(deferral)]
    for i in range(len(ts)):
        if not 0.0 <= ts[i] <= 1.0:
            raise ProfileError(f"{where}: field 'thresholds[{i}]' must be in [0, 1], got {ts[i]}")
        if not 0.0 <= fs[i] <= 1.0:
            raise ProfileError(f"{where}: field 'deferral[{i}]' must be in [0, 1], got {fs[i]}")
        if i and ts[i] <= ts[i - 1]:
            raise ProfileError(f"{where}: field 'thresholds' must increase (index {i}: {ts[i]} <= {ts[i - 1]})")
        if i and fs[i] < fs[i - 1]:
            raise ProfileError(f"{where}: field 'deferral' must not decrease (index {i}: {fs[i]} < {fs[i - 1]})")
    quality = raw.get("quality")
    qs: tuple[float, ...] | None = None
    if quality is not None:
        if not isinstance(quality, list) or len(quality) != len(ts):
            raise ProfileError(f"{where}: field 'quality' must be a list as long as 'thresholds' ({len(ts)})")
        qs = tuple(float(_num(where, f"quality[{i}]", q)) for i, q in enumerate(quality))
        for i, q in enumerate(qs):
            if not 0.0 < q <= 1.0:
                raise ProfileError(f"{where}: field 'quality[{i}]' must be in (0, 1], got {q}")
    resume = raw.get("resume", False)
    if not isinstance(resume, bool):
        raise ProfileError(f"{where}: field 'resume' must be true or false, got {resume!r}")
    if not isinstance(raw.get("description", ""), str):
        raise ProfileError(f"{where}: field 'description' must be a string")
    pair = raw.get("diffserve_pair")
    if pair is not None and not (isinstance(pair, str) and pair):
        raise ProfileError(f"{where}: field 'diffserve_pair' must be a non-empty string, got {pair!r}")
    return CascadeSpec(
        light=light,
        heavy=heavy,
        discriminator_latency_s=float(disc),
        thresholds=tuple(ts),
        deferral=tuple(fs),
        quality=qs,
        resume=resume,
        diffserve_pair=pair,
    )


def _parse_adapters(source: str, raw: Any, models: set[str]) -> tuple[AdapterSpec, ...]:
    """``[[adapters]]``: LoRA adapters per model (name, model, source, scale and its range)."""
    if not isinstance(raw, list):
        raise ProfileError(f"{source}: field 'adapters' must be a list of [[adapters]] tables")
    out: list[AdapterSpec] = []
    for i, entry in enumerate(raw):
        where = f"{source}: [[adapters]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ProfileError(f"{where}: must be a table")
        unknown = set(entry) - _ADAPTER_FIELDS
        if unknown:
            raise ProfileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        for field in ("name", "model", "source"):
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise ProfileError(f"{where}: field {field!r} must be a non-empty string")
        if not _ID.match(entry["name"]):
            raise ProfileError(f"{where}: field 'name' must be an id ([A-Za-z0-9._-]), got {entry['name']!r}")
        if entry["model"] not in models:
            raise ProfileError(f"{where}: field 'model' ({entry['model']!r}) is not a model of the profile's levels")
        lo = _num(where, "scale_min", entry.get("scale_min", 0.0))
        hi = _num(where, "scale_max", entry.get("scale_max", 2.0))
        scale = _num(where, "scale", entry.get("scale", 1.0))
        if not lo <= scale <= hi:
            raise ProfileError(f"{where}: needs scale_min <= scale <= scale_max, got {lo} <= {scale} <= {hi}")
        spec = AdapterSpec(name=entry["name"], model=entry["model"], source=entry["source"], scale=float(scale),
                           scale_min=float(lo), scale_max=float(hi), weight_name=entry.get("weight_name"))  # fmt: skip
        if any(a.name == spec.name and a.model == spec.model for a in out):
            raise ProfileError(f"{where}: adapter {spec.name!r} of model {spec.model!r} is declared twice")
        out.append(spec)
    return tuple(out)


def parse_profile(data: dict[str, Any], *, source: str = "<profile>") -> Profile:
    """Validate a profile already parsed from TOML (``source`` names it in errors)."""
    unknown = set(data) - _TOP_FIELDS
    if unknown:
        raise ProfileError(f"{source}: unknown top-level field(s) {', '.join(sorted(unknown))}")
    name = data.get("name")
    if not isinstance(name, str) or not _ID.match(name):
        raise ProfileError(f"{source}: field 'name' must be a profile name ([A-Za-z0-9._-]), got {name!r}")
    gpu = data.get("gpu", "unknown")
    if not isinstance(gpu, str):
        raise ProfileError(f"{source}: field 'gpu' must be a string")
    raw_levels = data.get("levels")
    if not isinstance(raw_levels, list) or not raw_levels:
        raise ProfileError(f"{source}: needs at least one [[levels]] table")
    levels: list[ApproxLevel] = []
    seen: dict[str, ApproxLevel] = {}
    for i, raw in enumerate(raw_levels):
        level = _parse_level(f"{source}: level #{i + 1}", raw)
        if level.id in seen:
            raise ProfileError(f"{source}: level #{i + 1} ({level.id}): field 'id' duplicates an earlier level")
        seen[level.id] = level
        levels.append(level)
    raw_cascades = data.get("cascades")
    if raw_cascades is not None:
        if "cascade" in data:
            raise ProfileError(f"{source}: use either [cascade] (one pair) or [[cascades]] (a list), not both")
        if not isinstance(raw_cascades, list) or not raw_cascades:
            raise ProfileError(f"{source}: field 'cascades' must be a list of [[cascades]] tables")
    strategies = {lv.strategy for lv in levels}
    one_plan = raw_cascades is not None or {Strategy.AC, Strategy.SM} <= strategies
    for prev, cur in itertools.pairwise(levels):
        where = f"{source}: level {cur.id!r}"
        if not one_plan and cur.peak_qpm < prev.peak_qpm - 1e-9:
            raise ProfileError(
                f"{where}: field 'latency_s' breaks monotonicity: levels are ordered slowest first, but "
                f"{cur.id!r} ({cur.peak_qpm:.3g} QPM) is slower than {prev.id!r} ({prev.peak_qpm:.3g} QPM)"
            )
        if cur.quality > prev.quality + 1e-9:
            raise ProfileError(
                f"{where}: field 'quality' breaks monotonicity: levels are ordered best first, but "
                f"{cur.id!r} ({cur.quality}) is better than {prev.id!r} ({prev.quality})"
            )
    slo = data.get("slo_s")
    if slo is not None:
        slo = _num(source, "slo_s", slo)
        if slo <= 0:
            raise ProfileError(f"{source}: field 'slo_s' must be positive, got {slo!r}")
    cascade = _parse_cascade(source, data["cascade"], seen) if "cascade" in data else None
    cascades: list[CascadeSpec] = []
    for i, raw in enumerate(raw_cascades or []):
        spec = _parse_cascade(source, raw, seen, entry=i + 1)
        if any(c.light == spec.light for c in cascades):
            raise ProfileError(
                f"{source}: [[cascades]] #{i + 1}: field 'light' ({spec.light!r}) already starts an earlier cascade"
            )
        cascades.append(spec)
    if not isinstance(data.get("measured", {}), dict):
        raise ProfileError(f"{source}: field 'measured' must be a table ([measured])")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{source}: field 'description' must be a string")
    gpu_memory = data.get("gpu_memory_gb")
    if gpu_memory is not None:
        gpu_memory = _num(source, "gpu_memory_gb", gpu_memory)
        if gpu_memory <= 0:
            raise ProfileError(f"{source}: field 'gpu_memory_gb' must be positive, got {gpu_memory!r}")
        for lv in levels:
            if lv.memory_gb is not None and lv.memory_gb > gpu_memory:
                raise ProfileError(
                    f"{source}: level {lv.id!r}: field 'memory_gb' ({lv.memory_gb:g}) "
                    f"exceeds gpu_memory_gb ({gpu_memory:g})"
                )
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ProfileError(f"{source}: [sources] must be a table of field = source")
    for key, value in sources.items():
        if key not in _SOURCE_KEYS:
            raise ProfileError(
                f"{source}: [sources] names unknown field {key!r} (known: {', '.join(sorted(_SOURCE_KEYS))})"
            )
        if not isinstance(value, str) or not value.strip():
            raise ProfileError(f"{source}: [sources] field {key!r} must be one non-empty string")
    adapters = _parse_adapters(source, data.get("adapters", []), {lv.model for lv in levels})
    return Profile(
        name=name,
        gpu=gpu,
        adapters=adapters,
        levels=tuple(levels),
        description=description,
        cascade=cascade,
        source=source,
        slo_s=None if slo is None else float(slo),
        gpu_memory_gb=None if gpu_memory is None else float(gpu_memory),
        sources=dict(sources),
        cascades=tuple(cascades),
    )
