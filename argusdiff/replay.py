"""Trace replay: one workload, several policies, the same simulated cluster, side by side.

:func:`prepare` turns a :class:`ReplaySpec` (trace, prompts, quality source, classifier, profiles)
into a :class:`Prepared` (the :class:`~argusdiff.simulator.Workload`, the profiles, the trace and
provenance) in named steps that hand one :class:`ReplayInputs` on: profiles, quality tables,
cascade confidences, classifiers, then the trace and the workload. :func:`run_replay` runs every
policy of :func:`variant_runs` on it (:func:`_run_policy`, with the settings all runs share) and
computes per-minute metrics and summaries; :mod:`argusdiff.report` writes the outputs.

Each policy runs on the profile of its family (``Policy.family``, given where it registers):
ARGUS-style policies (argus, argus+, pac, nirvana) on the approximate-caching profile (those with
``uses_fallback``, argus, argus+ and pac, switch to the smaller-model profile when the cache degrades),
the model-ladder baselines (proteus, sommelier, clipper-ha, clipper-ht) on the smaller-model
profile, and the cascades (diffserve, diffserve-static) on the cascade profile. All
three profiles share SD-XL 50 steps as their best level (``cascade-sdxlltn-sdxl``'s heavy model),
so "relative quality" (vs each prompt's best level) is comparable across them. With
``cascade_baselines`` the model-ladder baselines run on the cascade profile's two models instead
(DiffServe §4.1's comparison: Clipper-Light/-Heavy, Proteus; ``Policy.cascade_baseline``).

``argus+`` is the flagship: argus+ on the deployment profile that lists every path
(``unified_profile``, ``unified-a100``: the AC ladder, the smaller models and the cascades in one
plan, per SLO tier); it runs by default. argus+ on the AC ladder alone is ``argus+ (AC)``, a run
only on request (``ac_only``, or with ``ablation``, whose switched-off parts it is the base of): it
does not beat ARGUS on every trace of ``scripts/check_flagship.py`` (docs/results.md), so it is no
default row. With ``unified`` off the deployment is the family profile alone and argus+ on it is
``argus+``. Its quality table is composed per strategy (:mod:`traces.synthetic`); a level it
shares with another profile takes that profile's scores, so every policy sees the same quality of
the same level. With ``ablation`` it also runs without cascades, AC, SM or tiers
(``Policy.path_ablations``). :func:`domination` is the check that no policy has both fewer or equal
violations and higher or equal relative quality than it, one of the two strictly.

Every policy plans with the same demand predictor (``predictor``; ``"source"`` gives each policy
its paper's or artifact's reading instead, ``Policy.source_predictor``). A policy provisioned for an
anticipated peak given in advance (``Policy.needs_peak``: ``diffserve-static``) gets
``static_peak_qpm``, by default the trace's highest 1-minute rate. ``load_fraction`` replays the
trace time-stretched so that its peak 1-minute rate is that fraction of the most the primary
profile's cluster can serve (:func:`cluster_capacity_qpm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.domain import CascadeSpec, Profile, Strategy
from argusdiff.errors import ConfigError
from traces.synthetic import synthetic_confidence as _cascade_confidence

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_TRACE",
    "LOAD_TIME_READINGS",
    "UNIFIED_LABEL",
    "Prepared",
    "ReplayInputs",
    "ReplayResult",
    "ReplaySpec",
    "cluster_capacity_qpm",
    "domination",
    "family_label",
    "mixed_label",
    "prepare",
    "run_replay",
    "scale_to_peak",
    "unified_label",
    "variant_runs",
    "with_load_times",
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


@dataclass
class ReplaySpec:
    trace: str = DEFAULT_TRACE
    trace_format: str | None = None
    prompts: str | None = None  # None: the configured default set ([traces] prompts: diffusiondb)
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
    progress: bool = False  # a progress bar (on a terminal) while prompts not packaged or cached are encoded
    cache_latency_s: float = 0.05
    cache_prefill: float = 0.5  # share of the prompt set cached before the trace (earlier traffic)
    ablation: bool = False  # add argus+ variants with one part switched off
    mixed: bool = False  # add argus+ on the merged AC+SM ladder (argusdiff.policies.mixed)
    policy_options: dict[str, Any] = field(default_factory=dict)
    # the demand predictor of every policy (argusdiff.predictors.predictor_spec); None: the default
    # reading; "source": each policy's own (SOURCE_PREDICTORS)
    predictor: str | None = None
    static_peak_qpm: float | None = None  # diffserve-static's anticipated peak; None: the trace's 1-min peak
    load_fraction: float | None = None  # stretch the trace to this share of the primary cluster's capacity
    cascade_baselines: bool = False  # proteus / clipper-ha / clipper-ht on the cascade profile
    max_resident_models: int = 2  # models a simulated worker keeps loaded (the live default)
    # which load times the profiles' levels take (LOAD_TIME_READINGS): "profile" (their own; for the
    # A100 profiles ARGUS Table 2's Accelerate column), "pytorch" (Table 2's PyTorch column), "zero"
    load_times: str = "profile"
    # admission after every policy (argusdiff.admission), as the service applies it: True (the
    # [admission] defaults), False (off: a policy alone, e.g. to reproduce a paper) or a config
    admission: Any = True
    # argus+ (a policy with ``plans_unified``) on the deployment profile that lists every path, as
    # ``argus+``; False: on its family's profile alone, as ``argus+``
    unified: bool = True
    # with ``unified``, also argus+ on its family's profile alone, as ``argus+ (AC)`` (family_label)
    ac_only: bool = False
    unified_profile: str = "unified-a100"
    # ARGUS §4.1 drift retraining over the served-quality stream of policies that use the
    # classifier (argusdiff.simulator.drift.DriftSettings); None: not modelled
    drift: Any = field(default_factory=lambda: _drift_settings())
    # the clairvoyant bound of each profile the runs use (argusdiff.bound, docs/bound.md): a row in
    # the tables, and each policy's gap to it
    bound: bool = True


def _drift_settings() -> Any:
    from argusdiff.simulator.drift import DriftSettings

    return DriftSettings()


@dataclass
class ReplayResult:
    spec: ReplaySpec
    trace_name: str
    trace_summary: dict[str, Any]
    provenance: dict[str, Any]
    results: dict[str, Any]  # policy label -> SimResult
    minutes: dict[str, dict[str, np.ndarray]]
    summaries: dict[str, dict[str, Any]]
    bounds: dict[str, Any] = field(default_factory=dict)  # profile name -> argusdiff.bound.Bound


def unified_label(name: str) -> str:
    """The label of policy ``name``'s run on the unified profile (``Policy.plans_unified``): the
    policy's own name (argus+ plans every path the deployment has; docs/policies.md)."""
    return name


def family_label(name: str, family: str) -> str:
    """The label of the run of a policy that plans a unified profile on its family's profile alone
    (``argus+ (AC)``), beside the unified run (``ReplaySpec.ac_only``)."""
    return f"{name} ({family.upper()})"


def mixed_label(name: str) -> str:
    """The label of policy ``name``'s run on the merged AC+SM ladder (``Policy.plans_mixed``)."""
    return f"{name} (AC+SM)"


#: the report's subject: argus+ on the unified profile (its domination check, docs/results.md)
UNIFIED_LABEL = unified_label("argus+")


def variant_runs(spec: ReplaySpec) -> list[tuple[str, str, dict[str, Any], str | None]]:
    """Every simulated run of ``spec`` as ``(label, policy, extra options, profile)``: each policy
    of ``spec.policies`` on its family's profile (``profile`` None), except that with ``unified`` a
    policy that plans a unified profile (``plans_unified``) runs under its name on ``"unified"``
    (with its ``path_ablations`` under ``ablation``) and on its family's profile only with
    ``ac_only`` or ``ablation`` (as :func:`family_label`); with ``ablation``, each registered
    policy's ``ablations`` on its family's profile; with ``mixed``, each registered policy that
    plans a merged ladder (``plans_mixed``) on ``"mixed"``."""
    from argusdiff.policies import POLICIES, policy_class

    def on_unified(name: str) -> bool:
        return spec.unified and policy_class(name).plans_unified

    def base(name: str) -> str:  # the label of the policy's run on its family's profile
        return family_label(name, policy_class(name).family) if on_unified(name) else name

    runs: list[tuple[str, str, dict[str, Any], str | None]] = []
    for name in spec.policies:
        if not on_unified(name):
            runs.append((name, name, {}, None))
            continue
        runs.append((unified_label(name), name, {}, "unified"))
        if spec.ac_only or spec.ablation:
            runs.append((base(name), name, {}, None))
    if spec.ablation:
        for name, cls in POLICIES.items():
            runs += [(f"{base(name)} {suffix}", name, dict(opts), None) for suffix, opts in cls.ablations.items()]
        for name in spec.policies:
            if on_unified(name):
                label = unified_label(name)
                paths = policy_class(name).path_ablations.items()
                runs += [(f"{label} {suffix}", name, dict(opts), "unified") for suffix, opts in paths]
    if spec.mixed:
        runs += [(mixed_label(name), name, {}, "mixed") for name, cls in POLICIES.items() if cls.plans_mixed]
    return runs


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


def run_replay(
    spec: ReplaySpec,
    *,
    progress: Callable[[str, float], None] | None = None,
    log: Callable[[str], None] | None = None,
    prepared: Prepared | None = None,
) -> ReplayResult:
    """Simulate every policy of ``spec`` on one workload (``prepared``, or :func:`prepare`'s)."""
    from argusdiff.policies import POLICIES

    for name in spec.policies:
        if name not in POLICIES:
            raise ConfigError(f"--policies: unknown policy {name!r} (known: {', '.join(POLICIES)})")
    if not spec.policies:
        raise ConfigError("--policies: no policy given")
    prepared = prepared or prepare(spec, log=log)
    provenance = prepared.provenance
    shared = _shared_run_settings(spec, prepared)
    profiled: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    minutes: dict[str, dict[str, np.ndarray]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for label, name, extra, on in shared.runs:
        res, m, s = _run_policy(spec, prepared.workload, shared, label, name, extra, on, profiled, progress)
        results[label] = res
        minutes[label] = m
        summaries[label] = s
    bounds = _bounds(spec, prepared, shared, results, summaries) if spec.bound else {}
    return ReplayResult(
        spec=spec,
        trace_name=provenance.get("trace_name") or str(spec.trace),
        trace_summary={"requests": provenance["requests"], "duration_min": provenance["duration_min"]},
        provenance=provenance,
        results=results,
        minutes=minutes,
        summaries=summaries,
        bounds=bounds,
    )


_BOUNDS: dict[tuple, Any] = {}  # one process's bounds by trace, levels and cluster (scripts replay a trace often)


def _bounds(
    spec: ReplaySpec,
    prepared: Prepared,
    shared: _SharedRunSettings,
    results: dict[str, Any],
    summaries: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The clairvoyant bound (:mod:`argusdiff.bound`) of each profile the runs use, over its levels
    and any other level its runs served (ARGUS's fallback ladder), and each summary's ``bound_gap``: the bound's
    quality at the run's violation ratio minus the run's relative quality (points of 1)."""
    import hashlib

    from argusdiff.bound import clairvoyant_bound
    from argusdiff.domain import level_catalogue

    catalog = level_catalogue(*shared.profiles.values())
    wl = prepared.workload
    by_profile: dict[str, list[str]] = {}
    for label, s in summaries.items():
        name = str(s.get("profile"))
        profile = next((p for p in shared.profiles.values() if p.name == name), None)
        ids = by_profile.setdefault(name, list(profile.ids) if profile is not None else [])
        res = results[label]
        used = {res.level_ids[k] for k in np.unique(res.level[res.level >= 0])}
        ids += [i for i in res.level_ids if i in used and i not in ids and i in catalog and i in wl.relative]
    digest = hashlib.sha1(np.ascontiguousarray(wl.arrivals_s).tobytes())
    digest.update(np.ascontiguousarray(wl.prompt_idx).tobytes())
    for lv in sorted({i for ids in by_profile.values() for i in ids}):
        digest.update(lv.encode() + np.ascontiguousarray(wl.relative[lv]).tobytes())
    if wl.slo_s is not None:
        digest.update(np.ascontiguousarray(wl.slo_s).tobytes())
    digest.update(repr(wl.tier).encode())
    out: dict[str, Any] = {}
    for name, ids in by_profile.items():
        profile = next((p for p in shared.profiles.values() if p.name == name), next(iter(shared.profiles.values())))
        key = (
            digest.hexdigest(),
            tuple(ids),
            spec.gpus,
            shared.slo_s,
            tuple(sorted(shared.tier_slo.items())),
            shared.faults,
        )
        if key not in _BOUNDS:
            _BOUNDS[key] = clairvoyant_bound(
                wl,
                profile,
                gpus=spec.gpus,
                slo_s=shared.slo_s,
                tier_slo=shared.tier_slo,
                faults=shared.faults,
                levels=[catalog[i] for i in ids],
            )
        out[name] = _BOUNDS[key]
    for s in summaries.values():
        b = out.get(str(s.get("profile")))
        if b is not None:
            q = s["relative_quality"]
            s["bound_gap"] = b.quality_at(s["slo_violation_ratio"]) - q if q == q else float("nan")
    return out


@dataclass
class _SharedRunSettings:
    """What every policy's run of a replay shares (:func:`_shared_run_settings`)."""

    profiles: dict[str, Profile]  # prepare()'s, with "mixed" (the merged AC+SM ladder) when asked
    runs: list[tuple[str, str, dict[str, Any], str | None]]  # variant_runs(spec)
    faults: tuple
    slo_s: float
    tier_slo: dict[str, float]
    admission: Any  # argusdiff.admission.AdmissionConfig
    peak_qpm: float  # the anticipated peak of the policies that need one (Policy.needs_peak)


def _shared_run_settings(spec: ReplaySpec, prepared: Prepared) -> _SharedRunSettings:
    """The settings every run shares, checked against ``spec``, each recorded in the provenance."""
    from argusdiff.policies import POLICIES, policy_class
    from argusdiff.predictors import predictor_spec
    from argusdiff.simulator import parse_faults
    from argusdiff.simulator.engine import DEFAULT_TIER_SLO

    profiles, provenance = prepared.profiles, prepared.provenance
    faults = tuple(parse_faults(spec.faults, gpus=spec.gpus, duration_s=float(prepared.trace.duration_s)))
    primary = profiles["ac"]
    if spec.slo_s is not None and spec.slo_s <= 0:
        raise ConfigError(f"--slo: must be positive, got {spec.slo_s}")
    slo = spec.slo_s if spec.slo_s is not None else primary.default_slo_s(spec.slo_factor)
    provenance["slo_s"] = slo
    tier_slo = dict(DEFAULT_TIER_SLO if spec.tier_slo is None else spec.tier_slo)
    provenance["tier_slo"] = tier_slo
    admission = _admission(spec.admission)
    provenance["admission"] = admission.describe()
    if spec.mixed:
        from argusdiff.policies.mixed import merged_ladder

        if profiles["ac"].strategies != {Strategy.AC}:
            raise ConfigError(f"--mixed: --profile must be an approximate-caching profile, got {profiles['ac'].name!r}")
        profiles = {**profiles, "mixed": merged_ladder(profiles["ac"], profiles["sm"])}
    runs = variant_runs(spec)
    if spec.static_peak_qpm is not None and not spec.static_peak_qpm > 0:
        raise ConfigError(f"--static-peak: must be a positive QPM, got {spec.static_peak_qpm}")
    peak = float(prepared.trace.peak_qpm) if spec.static_peak_qpm is None else float(spec.static_peak_qpm)
    peaked = [n for n in spec.policies if policy_class(n).needs_peak]
    if peaked:
        provenance["static_peak"] = f"{', '.join(peaked)} provisioned for {peak:.0f} QPM given in advance " + (
            "(the trace's highest 1-minute rate)" if spec.static_peak_qpm is None else "(--static-peak)"
        )
    if spec.predictor not in (None, "source"):
        predictor_spec(spec.predictor)  # fail early, naming the option
    provenance["predictor"] = (
        "each policy's own reading ("
        + ", ".join(f"{k}: {c.source_predictor}" for k, c in POLICIES.items() if c.source_predictor)
        + ")"
        if spec.predictor == "source"
        else predictor_spec(spec.predictor).describe()
    )
    return _SharedRunSettings(
        profiles=profiles, runs=runs, faults=faults, slo_s=slo, tier_slo=tier_slo, admission=admission, peak_qpm=peak
    )


def _run_policy(
    spec: ReplaySpec,
    wl: Any,
    shared: _SharedRunSettings,
    label: str,
    name: str,
    extra: dict[str, Any],
    on: str | None,
    profiled: dict[str, dict[str, Any]],
    progress: Callable[[str, float], None] | None,
) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """One run of :func:`variant_runs` (``label``: policy ``name`` with ``extra`` options on the
    profile ``on``, or its family's): the policy built from its class attributes, simulated on
    ``wl``; its result, per-minute metrics and summary. ``profiled`` caches the unified plan's
    quality model per profile (:func:`profiled_quality`)."""
    from argusdiff.policies import make_policy, policy_class
    from argusdiff.simulator import SimConfig, minute_metrics, simulate, summarize

    cls = policy_class(name)
    fam = "cascade" if spec.cascade_baselines and cls.cascade_baseline else cls.family
    prof = shared.profiles[on or fam]
    if not prof.strategies & cls.strategies:
        kinds = "/".join(sorted(s.value for s in cls.strategies))
        have = "/".join(sorted(s.value for s in prof.strategies))
        raise ConfigError(f"--profile: {name} needs a {kinds} profile, {prof.name!r} is {have}")
    # DiffServe's controller refreshes every 1 s; the others plan every period (ARGUS: 60 s)
    period = (spec.period_s or 60.0) if cls.family != "cascade" else (spec.period_s or spec.cascade_period_s)
    extra = dict(extra)
    sim_fields = dict(extra.pop("sim", {}))  # an ablation may switch a simulated mechanism off too
    options: dict[str, Any] = {"slo_s": shared.slo_s, "period_s": period, **spec.policy_options, **extra}
    if prof.cascades:
        options["tier_slo"] = shared.tier_slo
        if prof.name not in profiled:
            profiled[prof.name] = profiled_quality(wl, prof)
        options.update(profiled[prof.name])
    if spec.predictor == "source":
        options.setdefault("predictor", cls.source_predictor)
    elif spec.predictor is not None:
        options.setdefault("predictor", spec.predictor)
    if cls.uses_fallback and prof.strategies == {Strategy.AC}:
        options["fallback"] = shared.profiles["sm"]
    if cls.needs_peak:
        options["peak_qpm"] = shared.peak_qpm
    policy = make_policy(
        name,
        prof,
        rng=np.random.default_rng([spec.seed, _stable_hash(label)]),
        config=options,
    )
    cfg = SimConfig(
        gpus=spec.gpus,
        period_s=period,
        slo_s=shared.slo_s,
        seed=spec.seed,
        jitter=spec.jitter,
        cache_latency_s=spec.cache_latency_s,
        cache_prefill=spec.cache_prefill,
        faults=shared.faults,
        tier_slo=shared.tier_slo,
        max_resident_models=spec.max_resident_models,
        admission=shared.admission,
        **sim_fields,
    )
    cb = (lambda f, _label=label: progress(_label, f)) if progress else None
    res = simulate(policy, wl, cfg, progress=cb)
    res.policy = label
    m = minute_metrics(res)
    s = summarize(res, m)
    s["policy"] = label
    s["admission"] = "on" if shared.admission.enabled else "off"
    s["period_s"] = period
    s["predictor"] = policy.describe().get("predictor", "")
    if spec.drift is not None and policy.uses_classifier:
        from argusdiff.simulator.drift import replay_drift

        s["drift"] = replay_drift(res, spec.drift, seed=spec.seed).as_dict()
    return res, m, s


def _admission(value: Any):
    """The admission mechanism of a replay from ``ReplaySpec.admission``."""
    from argusdiff.admission import AdmissionConfig

    if isinstance(value, AdmissionConfig):
        return value
    if isinstance(value, bool):
        return AdmissionConfig(enabled=value)
    raise ConfigError(f"admission: expected true, false or an AdmissionConfig, got {value!r}")


def profiled_quality(wl, profile: Profile) -> dict[str, Any]:
    """The unified plan's quality model profiled on the workload's prompt set (not its trace): per
    predicted optimal level c, the mean relative quality of c's prompts at each level; per cascade
    light level, f_c(t) (the share of c's prompts whose light image's confidence is below t) and the
    mean relative quality of the light images kept at t. Options ``class_quality`` and
    ``cascade_tables`` of argus+."""
    from solver.paths import class_quality_model

    ids = profile.ids
    opt = wl.optimal_for(profile) if ids not in wl.optimal else wl.optimal[ids]
    rel = np.stack([np.clip(wl.relative[lv], 0.0, 1.0) for lv in ids], axis=1)
    fallback = class_quality_model(profile.levels)
    members = [np.flatnonzero(opt == c) for c in range(len(ids))]
    cq = [tuple(float(v) for v in rel[m].mean(axis=0)) if len(m) else tuple(fallback[c]) for c, m in enumerate(members)]
    tables: dict[str, tuple] = {}
    for spec in profile.cascade_specs:
        conf = wl.confidences.get(spec.light, wl.confidence)
        if conf is None:
            continue
        j = ids.index(spec.light)
        ts = np.asarray(spec.thresholds)
        defer, kept = [], []
        for c, m in enumerate(members):
            if not len(m):
                defer.append(tuple(float(f) for f in spec.deferral))
                kept.append(tuple(cq[c][j] for _ in ts))
                continue
            below = conf[m][:, None] < ts[None, :]
            defer.append(tuple(float(v) for v in below.mean(axis=0)))
            keep = ~below
            n_keep = keep.sum(axis=0)
            q = (rel[m, j][:, None] * keep).sum(axis=0) / np.maximum(n_keep, 1)
            kept.append(tuple(float(v) if k else cq[c][j] for v, k in zip(q, n_keep, strict=True)))
        tables[spec.light] = (tuple(defer), tuple(kept))
    return {"class_quality": tuple(cq), "cascade_tables": tables}


def domination(summaries: dict[str, dict[str, Any]], subject: str, *, among: Sequence[str] | None = None) -> list[str]:
    """The policies (of ``among``, default all but ``subject``'s own variants) that dominate
    ``subject``: fewer or equal SLO violations and higher or equal relative quality, one strictly."""
    me = summaries[subject]
    v0, q0 = float(me["slo_violation_ratio"]), float(me["relative_quality"])
    out = []
    for label, s in summaries.items():
        if label == subject or (among is not None and label not in among):
            continue
        if among is None and label.startswith(subject):
            continue
        v, q = float(s["slo_violation_ratio"]), float(s["relative_quality"])
        if v <= v0 and q >= q0 and (v < v0 or q > q0):
            out.append(label)
    return out


def _stable_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))
