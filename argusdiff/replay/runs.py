"""The runs of a replay: every policy of :func:`~argusdiff.replay.spec.variant_runs` simulated on
one prepared workload (:func:`_run_policy`, with the settings all runs share), their per-minute
metrics and summaries, the clairvoyant bound of each profile they use (:func:`_bounds`), and the
check that no policy dominates the flagship (:func:`domination`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argusdiff.domain import Profile, Strategy
from argusdiff.errors import ConfigError
from argusdiff.replay.spec import ReplaySpec, variant_runs
from argusdiff.replay.workload import Prepared, prepare

__all__ = ["ReplayResult", "domination", "profiled_quality", "run_replay"]


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
    if "time_limit_s" in cls.options_type.names():
        # no wall-clock limit on a solve: a replay's plans are a pure function of its inputs, not of
        # the machine's load; each solve stops at its backend's work limit (solver.backends)
        options.setdefault("time_limit_s", math.inf)
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
