"""Trace replay: one workload, several policies, the same simulated cluster, side by side.

:func:`prepare` turns a :class:`ReplaySpec` (trace, prompts, quality source, classifier, profiles)
into a :class:`~argusdiff.simulator.Workload`; :func:`run_replay` simulates every policy on it
and computes per-minute metrics and summaries; :mod:`argusdiff.report` writes the outputs.

Each policy runs on the profile of its family: ARGUS-style policies (argus, argus+, pac,
nirvana) on the approximate-caching profile (argus/argus+ switch to the smaller-model profile when
the cache degrades), the model-ladder baselines (proteus, sommelier, clipper-ha, clipper-ht) on the
smaller-model profile, and the cascades (diffserve, diffserve-static) on the cascade profile. All
three profiles share SD-XL 50 steps as their best level (``cascade-sdxlltn-sdxl``'s heavy model),
so "relative quality" (vs each prompt's best level) is comparable across them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.domain import Profile, Strategy
from argusdiff.errors import ConfigError

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_TRACE",
    "FAMILY",
    "ReplayResult",
    "ReplaySpec",
    "prepare",
    "run_replay",
]

DEFAULT_TRACE = "bursty:low=40,high=160,period=5m,duration=30m"
DEFAULT_POLICIES = (
    "argus",
    "argus+",
    "pac",
    "proteus",
    "nirvana",
    "sommelier",
    "clipper-ha",
    "clipper-ht",
    "diffserve",
    "diffserve-static",
)
FAMILY = {
    "argus": "ac",
    "argus+": "ac",
    "pac": "ac",
    "nirvana": "ac",
    "proteus": "sm",
    "sommelier": "sm",
    "clipper-ha": "sm",
    "clipper-ht": "sm",
    "diffserve": "cascade",
    "diffserve-static": "cascade",
}


@dataclass
class ReplaySpec:
    trace: str = DEFAULT_TRACE
    trace_format: str | None = None
    prompts: str | None = None  # None: the built-in generated set
    quality: str = "synthetic"  # "synthetic" | path to a QualityTable CSV | "diffserve"
    policies: Sequence[str] = DEFAULT_POLICIES
    gpus: int = 8
    profile: str = "sdxl-ac-a100"
    sm_profile: str = "sm-a100"
    cascade_profile: str = "cascade-sdxlltn-sdxl"
    seed: int = 0
    period_s: float | None = None  # None: 60 s (ARGUS); DiffServe policies use cascade_period_s
    cascade_period_s: float = 1.0
    faults: str | None = None
    slo_s: float | None = None  # None: slo_factor × the slowest level of the primary profile
    slo_factor: float = 3.0
    tier_slo: dict[str, float] | None = None  # tier -> SLO multiplier; None: simulator defaults
    classifier: str | None = None  # path to a trained LevelClassifier; None: oracle stand-in
    confusion: float = 0.1
    jitter: float = 0.0
    embeddings: bool = True  # MiniLM prompt embeddings for cache similarity
    cache_latency_s: float = 0.05
    cache_prefill: float = 0.5  # share of the prompt set cached before the trace (earlier traffic)
    ablation: bool = False  # add argus+ variants with one part switched off
    mixed: bool = False  # add argus+ on the merged AC+SM ladder (argusdiff.policies.mixed)
    policy_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplayResult:
    spec: ReplaySpec
    trace_name: str
    trace_summary: dict[str, Any]
    provenance: dict[str, Any]
    results: dict[str, Any]  # policy label -> SimResult
    minutes: dict[str, dict[str, np.ndarray]]
    summaries: dict[str, dict[str, Any]]


MIXED_LABEL = "argus+ (AC+SM)"

ABLATIONS = {
    "argus+ -admission": {"admission": False},
    "argus+ -backlog": {"backlog": False},
    "argus+ -switch": {"switch_aware": False},
}


def _load_profiles(spec: ReplaySpec) -> dict[str, Profile]:
    from argusdiff.profile import load_profile

    primary = load_profile(spec.profile)
    sm = load_profile(spec.sm_profile)
    cascade = load_profile(spec.cascade_profile)
    if Strategy.CASCADE in primary.strategies:
        raise ConfigError(f"--profile: {primary.name!r} is a cascade profile; use --cascade-profile for it")
    if sm.strategies != {Strategy.SM}:
        raise ConfigError(f"--sm-profile: {sm.name!r} is not a smaller-model (sm) profile")
    if cascade.cascade is None:
        raise ConfigError(f"--cascade-profile: {cascade.name!r} has no [cascade] table")
    return {"ac": primary, "sm": sm, "cascade": cascade}


def _prompt_set(spec: ReplaySpec):
    from traces.prompts import builtin_prompts, load_prompts

    if spec.prompts is None:
        return builtin_prompts()
    return load_prompts(spec.prompts)


def _cascade_confidence(table, profile: Profile, rng_seed: int) -> np.ndarray:
    """Synthetic discriminator confidences consistent with the profile's f(t): a prompt whose
    light image is relatively worse gets a lower confidence, and P(confidence < t) = f(t)."""
    c = profile.cascade
    light = table.level_index(c.light)
    heavy = table.level_index(c.heavy)
    rel = table.scores[:, light] / np.maximum(table.scores[:, heavy], 1e-9)
    n = len(rel)
    rng = np.random.default_rng([rng_seed, 31])
    order = np.lexsort((rng.random(n), rel))
    u = np.empty(n)
    u[order] = (np.arange(n) + 0.5) / n
    ts = np.asarray(c.thresholds)
    fs = np.asarray(c.deferral)
    # invert f: the smallest t with f(t) >= u (f is non-decreasing)
    fs_strict = fs + np.arange(len(fs)) * 1e-12
    return np.interp(u, fs_strict, ts)


def prepare(spec: ReplaySpec, *, log: Callable[[str], None] | None = None):
    """The workload, the profiles, the trace and provenance for ``spec``."""
    from traces.quality import QualityTable
    from traces.trace import load_trace

    say = log or (lambda _m: None)
    if spec.gpus < 1:
        raise ConfigError(f"--gpus: must be >= 1, got {spec.gpus}")
    if not 0.0 <= spec.confusion <= 1.0:
        raise ConfigError(f"--confusion: must be in [0, 1], got {spec.confusion}")
    profiles = _load_profiles(spec)
    prompts = _prompt_set(spec)
    quality_note: dict[str, str] = {}
    tables: dict[str, tuple[Profile, Any]] = {}
    measured = None
    if spec.quality not in ("synthetic", "diffserve"):
        path = Path(spec.quality)
        if not path.is_file():
            raise ConfigError(f"--quality: {spec.quality!r} is not 'synthetic', 'diffserve' or an existing CSV file")
        measured = QualityTable.from_csv(path)
        match = [fam for fam, p in profiles.items() if tuple(measured.level_ids) == p.ids]
        if not match:
            raise ConfigError(
                f"--quality: {path} has levels {list(measured.level_ids)}, which match none of the profiles "
                f"({', '.join(f'{p.name}: {list(p.ids)}' for p in profiles.values())})"
            )
        if spec.prompts is None:
            from traces.prompts import PromptSet

            prompts = PromptSet(prompts=tuple(measured.prompts), ids=tuple(measured.prompt_ids), name=path.stem)
        elif tuple(measured.prompts) != tuple(prompts.prompts):
            raise ConfigError(f"--quality: {path} is for other prompts than --prompts {spec.prompts}")
    from traces.synthetic import synthetic_quality_table

    for _fam, prof in profiles.items():
        if measured is not None and tuple(measured.level_ids) == prof.ids:
            tables[prof.name] = (prof, measured)
            quality_note[prof.name] = f"measured: {measured.source}"
        else:
            t = synthetic_quality_table(prompts, prof, seed=spec.seed)
            tables[prof.name] = (prof, t)
            quality_note[prof.name] = t.source
    # the cascade's discriminator confidences
    cascade = profiles["cascade"]
    confidence_source = ""
    ctable = tables[cascade.name][1]
    if spec.quality == "diffserve":
        from traces.diffserve import load_confidences, routing_confidence

        pair = _cascade_pair(cascade)
        n = len(prompts)
        confidence = routing_confidence(np.arange(n), pair=pair, source="dist")
        confidence_source = (
            f"DiffServe artifact per-query light-image confidences (dist_{pair}), prompt row i -> query i mod 5000"
        )
        if pair == "sdturbo":
            conf = load_confidences()
            reps = math.ceil(n / len(conf))
            scores = np.zeros((n, len(cascade.ids)))
            scores[:, cascade.ids.index(cascade.cascade.light)] = np.tile(conf.light, reps)[:n]
            scores[:, cascade.ids.index(cascade.cascade.heavy)] = np.tile(conf.heavy, reps)[:n]
            ctable = QualityTable(
                level_ids=cascade.ids,
                prompt_ids=tuple(prompts.ids),
                prompts=tuple(prompts.prompts),
                scores=np.maximum(scores, 1e-6),
                metric="discriminator-confidence",
                source=f"DiffServe artifact {conf.source}: discriminator P(real) of the light and heavy images",
            )
            tables[cascade.name] = (cascade, ctable)
            quality_note[cascade.name] = ctable.source
    else:
        confidence = _cascade_confidence(ctable, cascade, spec.seed)
        confidence_source = "derived from the quality table (rank of light/heavy quality mapped through f(t))"
    # classifier
    classifiers: dict[str, Any] = {}
    if spec.classifier:
        from classifiers.level import LevelClassifier

        clf = LevelClassifier.load(spec.classifier)
        clf_desc = f"trained LevelClassifier from {spec.classifier}"
        for prof, _t in tables.values():
            if tuple(clf.level_ids) == prof.ids:
                classifiers[prof.name] = clf
        if not classifiers:
            raise ConfigError(f"--classifier: {spec.classifier} predicts levels of none of the profiles")
        from argusdiff.policies.classifier import OracleClassifier

        others = [prof for prof, _t in tables.values() if prof.name not in classifiers]
        for prof in others:
            classifiers[prof.name] = OracleClassifier(tables[prof.name][1], confusion=spec.confusion, seed=spec.seed)
        if others:
            trained = sorted(set(classifiers) - {p.name for p in others})
            clf_desc = (
                f"trained LevelClassifier from {spec.classifier} for {', '.join(trained)}; "
                f"{classifiers[others[0].name].description} for {', '.join(p.name for p in others)}"
            )
    else:
        from argusdiff.policies.classifier import OracleClassifier

        for prof, t in tables.values():
            classifiers[prof.name] = OracleClassifier(t, confusion=spec.confusion, seed=spec.seed)
        clf_desc = next(iter(classifiers.values())).description
    # trace
    trace = load_trace(spec.trace, seed=spec.seed, format=spec.trace_format, n_prompts=len(prompts))
    if len(trace) == 0:
        raise ConfigError(f"--trace: {spec.trace!r} has no requests")
    prompt_idx = trace.prompt_idx if trace.prompt_idx is not None else np.arange(len(trace)) % len(prompts)
    embeddings = None
    similarity_source = "exact repeats only"
    if spec.embeddings:
        from traces.embeddings import encode_prompts

        say(f"encoding {len(prompts)} prompts with MiniLM (disk-cached)...")
        embeddings = encode_prompts(list(prompts.prompts))
        similarity_source = "MiniLM (all-MiniLM-L6-v2) prompt embeddings, cosine"
    from argusdiff.simulator import build_workload
    from argusdiff.simulator.workload import trace_deadlines

    req_slo, req_tier, slo_note = trace_deadlines(trace)
    if slo_note:
        say(slo_note)
    wl = build_workload(
        trace.arrivals_s,
        prompt_idx,
        list(prompts.prompts),
        tables,
        classifiers=classifiers,
        embeddings=embeddings,
        confidence=confidence,
        classifier_desc=clf_desc,
        quality_source="; ".join(f"{k}: {v}" for k, v in quality_note.items()),
        similarity_source=similarity_source,
        confidence_source=confidence_source,
        trace_name=trace.name or str(spec.trace),
        slo_s=req_slo,
        tier=req_tier,
        slo_note=slo_note,
    )
    provenance = {
        "trace": str(spec.trace),
        "trace_name": trace.name,
        "requests": len(trace),
        "duration_min": float(trace.duration_s) / 60.0,
        "mean_qpm": float(trace.mean_qpm),
        "peak_qpm": float(trace.peak_qpm),
        "prompts": f"{prompts.name} ({len(prompts)} prompts{', generated' if prompts.generated else ''})",
        "quality": quality_note,
        "quality_synthetic": any(t.synthetic for _p, t in tables.values()),
        "classifier": clf_desc,
        "cache_similarity": similarity_source,
        "cascade_confidence": confidence_source,
        "profiles": {fam: p.name for fam, p in profiles.items()},
        "gpus": spec.gpus,
        "seed": spec.seed,
        "faults": spec.faults or "",
        "cache_prefill": spec.cache_prefill,
        "per_request_slo": req_slo is not None or req_tier is not None,
        "slo_note": slo_note,
        "date_note": "simulated cluster; wall-clock numbers depend on the machine",
    }
    return wl, profiles, trace, provenance


def _cascade_pair(profile: Profile) -> str:
    light = profile.cascade.light.lower()
    for key, pair in (("turbo", "sdturbo"), ("sdxs", "sdxs"), ("light", "sdxlltn"), ("ltn", "sdxlltn")):
        if key in light:
            return pair
    raise ConfigError(f"--quality diffserve: no DiffServe confidences for the light model {profile.cascade.light!r}")


def run_replay(
    spec: ReplaySpec,
    *,
    progress: Callable[[str, float], None] | None = None,
    log: Callable[[str], None] | None = None,
    prepared: tuple | None = None,
) -> ReplayResult:
    """Simulate every policy of ``spec`` on one workload."""
    from argusdiff.policies import POLICIES, make_policy
    from argusdiff.simulator import SimConfig, minute_metrics, parse_faults, simulate, summarize

    for name in spec.policies:
        if name not in POLICIES:
            raise ConfigError(f"--policies: unknown policy {name!r} (known: {', '.join(POLICIES)})")
    if not spec.policies:
        raise ConfigError("--policies: no policy given")
    wl, profiles, trace, provenance = prepared or prepare(spec, log=log)
    faults = tuple(parse_faults(spec.faults, gpus=spec.gpus, duration_s=float(trace.duration_s)))
    primary = profiles["ac"]
    if spec.slo_s is not None and spec.slo_s <= 0:
        raise ConfigError(f"--slo: must be positive, got {spec.slo_s}")
    slo = spec.slo_s if spec.slo_s is not None else primary.default_slo_s(spec.slo_factor)
    provenance["slo_s"] = slo
    from argusdiff.simulator.engine import DEFAULT_TIER_SLO

    tier_slo = dict(DEFAULT_TIER_SLO if spec.tier_slo is None else spec.tier_slo)
    provenance["tier_slo"] = tier_slo
    runs: list[tuple[str, str, dict[str, Any]]] = [(n, n, {}) for n in spec.policies]
    if spec.ablation:
        runs += [(label, "argus+", opts) for label, opts in ABLATIONS.items()]
    override: dict[str, Profile] = {}
    if spec.mixed:
        from argusdiff.policies.mixed import merged_ladder

        if profiles["ac"].strategies != {Strategy.AC}:
            raise ConfigError(f"--mixed: --profile must be an approximate-caching profile, got {profiles['ac'].name!r}")
        runs.append((MIXED_LABEL, "argus+", {}))
        override[MIXED_LABEL] = merged_ladder(profiles["ac"], profiles["sm"])
    results: dict[str, Any] = {}
    minutes: dict[str, dict[str, np.ndarray]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    peak = float(trace.peak_qpm)
    for label, name, extra in runs:
        fam = FAMILY[name]
        prof = override.get(label, profiles[fam])
        if fam == "ac" and prof.strategies == {Strategy.SM} and name == "nirvana":
            raise ConfigError(f"--profile: nirvana needs an approximate-caching profile, {prof.name!r} is sm")
        period = (spec.period_s or 60.0) if fam != "cascade" else (spec.period_s or spec.cascade_period_s)
        options: dict[str, Any] = {"slo_s": slo, "period_s": period, **spec.policy_options, **extra}
        if name in ("argus", "argus+") and prof.strategies == {Strategy.AC}:
            options["fallback"] = profiles["sm"]
        if name == "diffserve-static":
            options["peak_qpm"] = peak
        policy = make_policy(
            name,
            prof,
            rng=np.random.default_rng([spec.seed, _stable_hash(label)]),
            config=options,
        )
        cfg = SimConfig(
            gpus=spec.gpus,
            period_s=period,
            slo_s=slo,
            seed=spec.seed,
            jitter=spec.jitter,
            cache_latency_s=spec.cache_latency_s,
            cache_prefill=spec.cache_prefill,
            faults=faults,
            tier_slo=tier_slo,
        )
        cb = (lambda f, _label=label: progress(_label, f)) if progress else None
        res = simulate(policy, wl, cfg, progress=cb)
        res.policy = label
        m = minute_metrics(res)
        s = summarize(res, m)
        s["policy"] = label
        s["period_s"] = period
        results[label] = res
        minutes[label] = m
        summaries[label] = s
    return ReplayResult(
        spec=spec,
        trace_name=provenance.get("trace_name") or str(spec.trace),
        trace_summary={"requests": provenance["requests"], "duration_min": provenance["duration_min"]},
        provenance=provenance,
        results=results,
        minutes=minutes,
        summaries=summaries,
    )


def _stable_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))
