"""Trace replay: one workload, several policies, the same simulated cluster, side by side.

:mod:`~argusdiff.replay.spec` says what a replay runs (:class:`ReplaySpec`, :func:`variant_runs`).
:mod:`~argusdiff.replay.workload`'s :func:`prepare` turns the spec (trace, prompts, quality
source, classifier, profiles) into a :class:`Prepared` (the :class:`~argusdiff.simulator.Workload`,
the profiles, the trace and provenance) in named steps that hand one :class:`ReplayInputs` on:
profiles, quality tables, cascade confidences, classifiers, then the trace and the workload.
:mod:`~argusdiff.replay.runs`' :func:`run_replay` runs every policy of :func:`variant_runs` on it
(``_run_policy``, with the settings all runs share) and computes per-minute metrics and summaries;
:mod:`argusdiff.report` writes the outputs.

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

from argusdiff.replay.runs import ReplayResult, domination, profiled_quality, run_replay
from argusdiff.replay.spec import (
    DEFAULT_POLICIES,
    DEFAULT_TRACE,
    UNIFIED_LABEL,
    ReplaySpec,
    family_label,
    mixed_label,
    unified_label,
    variant_runs,
)
from argusdiff.replay.workload import (
    ARGUS_TABLE2_PYTORCH_S,
    LOAD_TIME_READINGS,
    Prepared,
    ReplayInputs,
    cluster_capacity_qpm,
    prepare,
    scale_to_peak,
    with_load_times,
)

__all__ = [
    "ARGUS_TABLE2_PYTORCH_S",
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
    "profiled_quality",
    "run_replay",
    "scale_to_peak",
    "unified_label",
    "variant_runs",
    "with_load_times",
]
