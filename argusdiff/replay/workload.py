"""The workload a replay runs every policy on: :func:`prepare` turns a
:class:`~argusdiff.replay.spec.ReplaySpec` (trace, prompts, quality source, classifier, profiles)
into a :class:`Prepared` (the :class:`~argusdiff.simulator.Workload`, the profiles, the trace and
provenance) in named steps that hand one :class:`ReplayInputs` on: profiles, quality tables,
cascade confidences, classifiers, then the trace and the workload. ``load_fraction`` replays the
trace time-stretched (:func:`scale_to_peak`) so that its peak 1-minute rate is that fraction of the
most the primary profile's cluster can serve (:func:`cluster_capacity_qpm`). ``load_times`` picks
the models' load times the profiles charge (:func:`with_load_times`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.domain import CascadeSpec, Profile, Strategy
from argusdiff.errors import ConfigError
from argusdiff.replay.spec import ReplaySpec
from traces.synthetic import synthetic_confidence as _cascade_confidence

__all__ = [
    "ARGUS_TABLE2_PYTORCH_S",
    "LOAD_TIME_READINGS",
    "Prepared",
    "ReplayInputs",
    "cluster_capacity_qpm",
    "prepare",
    "scale_to_peak",
    "with_load_times",
]


#: the model load times a replay may charge (``ReplaySpec.load_times``, ``replay --load-times``)
LOAD_TIME_READINGS: dict[str, str] = {
    "profile": "the profiles' own (A100 profiles: ARGUS Table 2, Accelerate column)",
    "pytorch": "ARGUS Table 2, PyTorch column (plain from_pretrained)",
    "zero": "none (every load takes 0 s, as the Proteus artifact's simulator charges)",
}
#: ARGUS Table 2 (A100): each model size class's load time with Accelerate -> with plain PyTorch (s).
#: Every A100 profile's load time is one of these Accelerate values (estimates take a size class's).
ARGUS_TABLE2_PYTORCH_S: dict[float, float] = {9.42: 45.78, 5.56: 19.90, 4.86: 14.05, 2.91: 11.78}


def with_load_times(profile: Profile, reading: str) -> Profile:
    """``profile`` with its levels' load times under ``reading`` (:data:`LOAD_TIME_READINGS`)."""
    from dataclasses import replace

    if reading not in LOAD_TIME_READINGS:
        raise ConfigError(f"--load-times: {reading!r} is not one of {', '.join(LOAD_TIME_READINGS)}")
    if reading == "profile":
        return profile
    levels = []
    for lv in profile.levels:
        if reading == "zero":
            t = 0.0
        else:
            t = ARGUS_TABLE2_PYTORCH_S.get(round(lv.load_time_s, 2), float("nan"))
            if t != t:
                raise ConfigError(
                    f"--load-times pytorch: {profile.name}'s level {lv.id} loads in {lv.load_time_s} s, not an "
                    f"ARGUS Table 2 Accelerate time ({', '.join(map(str, ARGUS_TABLE2_PYTORCH_S))} s)"
                )
        levels.append(replace(lv, load_time_s=t))
    return replace(profile, levels=tuple(levels))


def _load_profiles(spec: ReplaySpec) -> dict[str, Profile]:
    from argusdiff.profile import load_profile as _load

    def load_profile(name: str) -> Profile:
        return with_load_times(_load(name), spec.load_times)

    primary = load_profile(spec.profile)
    sm = load_profile(spec.sm_profile)
    cascade = load_profile(spec.cascade_profile)
    if Strategy.CASCADE in primary.strategies:
        raise ConfigError(f"--profile: {primary.name!r} is a cascade profile; use --cascade-profile for it")
    if sm.strategies != {Strategy.SM}:
        raise ConfigError(f"--sm-profile: {sm.name!r} is not a smaller-model (sm) profile")
    if cascade.cascade is None:
        raise ConfigError(f"--cascade-profile: {cascade.name!r} has no [cascade] table")
    out = {"ac": primary, "sm": sm, "cascade": cascade}
    if spec.unified:
        unified = load_profile(spec.unified_profile)
        if not unified.cascades:
            raise ConfigError(f"--unified-profile: {unified.name!r} lists no [[cascades]]")
        out = {"unified": unified, **out}  # first: a level it shares with another profile takes that one's scores
    return out


def _prompt_set(spec: ReplaySpec):
    from traces.prompts import load_prompts

    return load_prompts(spec.prompts)


@dataclass
class ReplayInputs:
    """What the steps of :func:`prepare` hand on to each other, in their order: the profiles by
    family (:func:`_load_profiles`); the prompt set with one quality table per profile
    (:func:`_quality_tables`); the cascade discriminator's confidences (:func:`_cascade_confidences`,
    which may replace the cascade profile's table with the DiffServe artifact's scores); the
    classifier of each profile (:func:`_classifiers`). :func:`_workload` builds the simulator's
    workload from it and a trace."""

    profiles: dict[str, Profile]  # family ("ac", "sm", "cascade", "unified") -> profile
    prompts: Any  # traces.prompts.PromptSet
    tables: dict[str, tuple[Profile, Any]]  # profile name -> (profile, traces.quality.QualityTable)
    quality_note: dict[str, str]  # profile name -> where its quality comes from
    confidence: np.ndarray | None = None  # the cascade profile's light images' confidence per prompt
    confidences: dict[str, np.ndarray] = field(default_factory=dict)  # unified: light level -> confidence
    confidence_source: str = ""
    classifiers: dict[str, Any] = field(default_factory=dict)  # profile name -> classifier
    classifier_desc: str = ""


@dataclass
class Prepared:
    """The result of :func:`prepare`, the input of every policy's run in :func:`run_replay`."""

    workload: Any  # argusdiff.simulator.Workload
    profiles: dict[str, Profile]
    trace: Any  # traces.trace.Trace
    provenance: dict[str, Any]


def prepare(spec: ReplaySpec, *, log: Callable[[str], None] | None = None) -> Prepared:
    """The workload, the profiles, the trace and provenance for ``spec``, step by step."""
    say = log or (lambda _m: None)
    if spec.gpus < 1:
        raise ConfigError(f"--gpus: must be >= 1, got {spec.gpus}")
    if not 0.0 <= spec.confusion <= 1.0:
        raise ConfigError(f"--confusion: must be in [0, 1], got {spec.confusion}")
    inputs = _quality_tables(spec, _load_profiles(spec))
    _cascade_confidences(spec, inputs)
    _classifiers(spec, inputs)
    trace, scaling = _trace(spec, inputs, say)
    return _workload(spec, inputs, trace, scaling, say)


def _quality_tables(spec: ReplaySpec, profiles: dict[str, Profile]) -> ReplayInputs:
    """The prompt set and one quality table per profile: a measured table (``--quality`` CSV) for
    the profile whose levels it lists (its prompts become the set unless ``--prompts`` is given),
    synthetic tables (:mod:`traces.synthetic`) for the others."""
    from traces.quality import QualityTable
    from traces.synthetic import synthetic_quality_table

    prompts = _prompt_set(spec)
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
    quality_note: dict[str, str] = {}
    tables: dict[str, tuple[Profile, Any]] = {}
    for _fam, prof in profiles.items():
        if measured is not None and tuple(measured.level_ids) == prof.ids:
            tables[prof.name] = (prof, measured)
            quality_note[prof.name] = f"measured: {measured.source}"
        else:
            t = synthetic_quality_table(prompts, prof, seed=spec.seed)
            tables[prof.name] = (prof, t)
            quality_note[prof.name] = t.source
    return ReplayInputs(profiles=profiles, prompts=prompts, tables=tables, quality_note=quality_note)


def _cascade_confidences(spec: ReplaySpec, inputs: ReplayInputs) -> None:
    """Fills the discriminator's confidences in the light images of the cascade profile and, with
    a unified profile, of each of its cascade pairs: the DiffServe artifact's (``--quality
    diffserve``, whose heavy-image scores, where it has them, replace the cascade profile's
    table) or derived from the quality tables (:func:`traces.synthetic.synthetic_confidence`)."""
    from traces.quality import QualityTable

    profiles, prompts, tables = inputs.profiles, inputs.prompts, inputs.tables
    cascade = profiles["cascade"]
    ctable = tables[cascade.name][1]
    if spec.quality == "diffserve":
        from traces.diffserve import pair_confidences, routing_confidence

        pair = _diffserve_pair(cascade, cascade.cascade)
        n = len(prompts)
        confidence = routing_confidence(np.arange(n), pair=pair, source="dist")
        inputs.confidence_source = (
            f"DiffServe artifact per-query light-image confidences (dist_{pair}), prompt row i -> query i mod 5000"
        )
        conf = pair_confidences(pair)
        if conf is not None:  # the artifact scored the heavy images of this pair's queries too
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
            inputs.quality_note[cascade.name] = ctable.source
    else:
        confidence = _cascade_confidence(ctable, cascade, spec.seed)
        inputs.confidence_source = "derived from the quality table (rank of light/heavy quality mapped through f(t))"
    inputs.confidence = confidence
    if "unified" in profiles:
        unified = profiles["unified"]
        for pair in unified.cascade_specs:
            if pair.light == cascade.cascade.light:
                inputs.confidences[pair.light] = confidence  # the same light model: the same discriminator verdicts
            elif spec.quality == "diffserve":
                from traces.diffserve import routing_confidence

                inputs.confidences[pair.light] = routing_confidence(
                    np.arange(len(prompts)), pair=_diffserve_pair(unified, pair), source="dist"
                )
            else:
                inputs.confidences[pair.light] = _cascade_confidence(tables[unified.name][1], unified, spec.seed, pair)


def _classifiers(spec: ReplaySpec, inputs: ReplayInputs) -> None:
    """Fills the prompt classifier of each profile: the trained ``--classifier`` for the profiles
    whose levels it predicts, the oracle stand-in (with ``confusion``) for the others."""
    from argusdiff.policies.classifier import OracleClassifier

    tables, classifiers = inputs.tables, inputs.classifiers
    if spec.classifier:
        from classifiers.level import LevelClassifier

        clf = LevelClassifier.load(spec.classifier)
        clf_desc = f"trained LevelClassifier from {spec.classifier}"
        for prof, _t in tables.values():
            if tuple(clf.level_ids) == prof.ids:
                classifiers[prof.name] = clf
        if not classifiers:
            raise ConfigError(f"--classifier: {spec.classifier} predicts levels of none of the profiles")
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
        for prof, t in tables.values():
            classifiers[prof.name] = OracleClassifier(t, confusion=spec.confusion, seed=spec.seed)
        clf_desc = next(iter(classifiers.values())).description
    inputs.classifier_desc = clf_desc


def _trace(spec: ReplaySpec, inputs: ReplayInputs, say: Callable[[str], None]) -> tuple[Any, str]:
    """The trace over the prompt set, time-stretched to ``load_fraction`` of the primary cluster's
    capacity when asked, and a note of that scaling (empty when none)."""
    from traces.formats import load_trace

    trace = load_trace(spec.trace, seed=spec.seed, format=spec.trace_format, n_prompts=len(inputs.prompts))
    if len(trace) == 0:
        raise ConfigError(f"--trace: {spec.trace!r} has no requests")
    scaling = ""
    if spec.load_fraction is not None:
        if not 0.0 < spec.load_fraction <= 10.0:
            raise ConfigError(f"--load-fraction: must be in (0, 10], got {spec.load_fraction}")
        primary = inputs.profiles["ac"]
        cap = cluster_capacity_qpm(primary, spec.gpus)
        trace = scale_to_peak(trace, spec.load_fraction * cap)
        scaling = (
            f"time-stretched to a peak 1-minute rate of {trace.peak_qpm:.0f} QPM = {spec.load_fraction:.0%} of the "
            f"{spec.gpus}-worker {primary.name} cluster's maximum {cap:.0f} QPM (every worker at {primary.fastest.id})"
        )
        say(scaling)
    return trace, scaling


def _workload(spec: ReplaySpec, inputs: ReplayInputs, trace: Any, scaling: str, say: Callable[[str], None]) -> Prepared:
    """The simulator's workload from ``inputs`` and ``trace`` (with the prompts' MiniLM embeddings
    when ``embeddings``, and the trace's per-request SLOs and tiers), and the replay's provenance."""
    from argusdiff.simulator import build_workload
    from argusdiff.simulator.workload import trace_deadlines

    prompts, tables = inputs.prompts, inputs.tables
    prompt_idx = trace.prompt_idx if trace.prompt_idx is not None else np.arange(len(trace)) % len(prompts)
    embeddings = None
    similarity_source = "exact repeats only"
    if spec.embeddings:
        from traces.embeddings import get_encoder

        encoder = get_encoder()
        before = encoder.encoded
        embeddings = encoder.encode(list(prompts.prompts), progress=spec.progress)
        if encoder.encoded > before:
            say(f"encoded {encoder.encoded - before} of {len(prompts)} prompts with MiniLM (disk-cached for next time)")
        similarity_source = "MiniLM (all-MiniLM-L6-v2) prompt embeddings, cosine"
    req_slo, req_tier, slo_note = trace_deadlines(trace)
    if slo_note:
        say(slo_note)
    wl = build_workload(
        trace.arrivals_s,
        prompt_idx,
        list(prompts.prompts),
        tables,
        classifiers=inputs.classifiers,
        embeddings=embeddings,
        confidence=inputs.confidence,
        confidences=inputs.confidences,
        classifier_desc=inputs.classifier_desc,
        quality_source="; ".join(f"{k}: {v}" for k, v in inputs.quality_note.items()),
        similarity_source=similarity_source,
        confidence_source=inputs.confidence_source,
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
        "load_scaling": scaling,
        "prompts": f"{prompts.name} ({len(prompts)} prompts{', generated' if prompts.generated else ''})",
        "quality": inputs.quality_note,
        "quality_synthetic": any(t.synthetic for _p, t in tables.values()),
        "classifier": inputs.classifier_desc,
        "cache_similarity": similarity_source,
        "cascade_confidence": inputs.confidence_source,
        "profiles": {fam: p.name for fam, p in inputs.profiles.items()},
        "gpus": spec.gpus,
        "seed": spec.seed,
        "faults": spec.faults or "",
        "cache_prefill": spec.cache_prefill,
        "load_times": f"{spec.load_times}: {LOAD_TIME_READINGS[spec.load_times]}",
        "resident_models": spec.max_resident_models,
        "per_request_slo": req_slo is not None or req_tier is not None,
        "slo_note": slo_note,
        "date_note": "simulated cluster; wall-clock numbers depend on the machine",
    }
    return Prepared(workload=wl, profiles=inputs.profiles, trace=trace, provenance=provenance)


def cluster_capacity_qpm(profile: Profile, gpus: int, slo_s: float | None = None) -> float:
    """The most ``gpus`` workers serve (QPM) at the profile's fastest level: every worker at its
    peak throughput P_th (batch 1, as ARGUS serves); for a cascade, every worker on the light model
    at the best batch size whose latency is within ``slo_s`` (the profile's SLO by default)."""
    if profile.cascade is not None:
        light = profile.level(profile.cascade.light)
        slo = slo_s if slo_s is not None else profile.default_slo_s()
        ok = [b for b in light.batch_sizes if light.latency(b) <= slo] or [1]
        return gpus * max(light.throughput_qpm(b) for b in ok)
    return gpus * max(lv.peak_qpm for lv in profile.levels)


def scale_to_peak(trace, peak_qpm: float):
    """``trace`` time-stretched (the same arrival pattern, shape-preserving) so that its highest
    1-minute rate is at most ``peak_qpm``, and as close below it as the minute bins allow (they
    shift with the stretch, so the factor is refined a few times)."""
    if not (math.isfinite(peak_qpm) and peak_qpm > 0):
        raise ConfigError(f"peak: must be a positive number of QPM, got {peak_qpm}")
    if trace.peak_qpm <= 0:
        raise ConfigError(f"trace {trace.name!r} is empty: cannot scale it")
    factor = peak_qpm / trace.peak_qpm
    best = None
    for _ in range(24):
        out = trace.rescale(factor=factor)
        peak = out.peak_qpm
        if peak <= peak_qpm * (1 + 1e-9) and (best is None or peak > best.peak_qpm):
            best = out
        if peak_qpm * 0.995 <= peak <= peak_qpm * (1 + 1e-9):
            break
        factor *= peak_qpm / peak * (0.999 if peak > peak_qpm else 1.0)
    return best if best is not None else trace.rescale(factor=factor * 0.9)


def _diffserve_pair(profile: Profile, spec: CascadeSpec) -> str:
    """The DiffServe artifact's name of a cascade pair, as its profile gives it (``diffserve_pair``)."""
    if spec.diffserve_pair is None:
        raise ConfigError(
            f"--quality diffserve: profile {profile.name!r} gives no DiffServe confidences for the cascade "
            f"{spec.light} -> {spec.heavy} (field 'diffserve_pair')"
        )
    return spec.diffserve_pair
