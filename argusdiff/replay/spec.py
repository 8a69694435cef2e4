"""What a replay runs: the trace, prompts, quality source, profiles and policies
(:class:`ReplaySpec`), and every simulated run it makes of them (:func:`variant_runs`, labelled
with :func:`unified_label`, :func:`family_label`, :func:`mixed_label`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_TRACE",
    "UNIFIED_LABEL",
    "ReplaySpec",
    "family_label",
    "mixed_label",
    "unified_label",
    "variant_runs",
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
