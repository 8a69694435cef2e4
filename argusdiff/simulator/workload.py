"""What a simulation replays: arrivals, prompts, per-prompt quality, predictions, cache geometry.

Everything per prompt is precomputed here once (numpy arrays indexed by prompt row), so the event
loop only indexes arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argusdiff.domain import Profile
from argusdiff.errors import ConfigError

__all__ = ["Workload", "build_workload", "nearest_neighbours", "trace_deadlines"]

# Trace formats whose per-request deadlines are not text-to-image deadlines: Proteus' (and its
# Twitter-derived traces') deadlines are image-classification-scale milliseconds.
CLASSIFICATION_DEADLINE_FORMATS = frozenset({"proteus"})


def trace_deadlines(trace: Any) -> tuple[np.ndarray | None, tuple[str, ...] | None, str]:
    """Per-request SLOs and tiers of a ``traces.trace.Trace`` for the simulator, with a note.

    Explicit SLOs are honoured except from formats in :data:`CLASSIFICATION_DEADLINE_FORMATS`
    (also when such a file was rewritten to the native format: its ``source`` names it), which are
    ignored (the note says so); tiers are always kept.
    """
    slo = getattr(trace, "slo_s", None)
    tier = getattr(trace, "tier", None)
    fmt = str(getattr(trace, "format", "") or "")
    source = str(getattr(trace, "source", "") or "").replace("\\", "/").rsplit("/", 1)[-1].lower()
    if fmt not in CLASSIFICATION_DEADLINE_FORMATS:
        # a trace rewritten to the native format keeps its source file in the metadata
        fmt = next((f for f in CLASSIFICATION_DEADLINE_FORMATS if f in source), fmt)
    notes = []
    if slo is not None and fmt in CLASSIFICATION_DEADLINE_FORMATS:
        ms = float(np.median(slo)) * 1000.0
        notes.append(
            f"per-request deadlines of the {fmt} trace ignored (image-classification scale, median "
            f"{ms:.0f} ms; not text-to-image deadlines)"
        )
        slo = None
    elif slo is not None:
        notes.append("per-request SLOs from the trace")
    if tier is not None:
        notes.append("per-request tiers from the trace")
    return slo, (None if tier is None else tuple(tier)), "; ".join(notes)


@dataclass
class Workload:
    """Arrivals (seconds, sorted) with prompt rows, and per-prompt tables.

    ``quality[level_id]`` is each prompt's score at that level; ``relative[level_id]`` the score
    divided by the prompt's score at the best level of the same profile. ``optimal[profile ids]``
    is the classifier's predicted optimal level index per prompt. ``neighbours``/``neighbour_sim``
    list, per prompt, the most similar other prompts (cosine, descending) for the cache model;
    ``None`` means only an exact repeat of a prompt is a cache hit. ``confidence`` is the cascade
    discriminator's confidence in the light image per prompt.

    Per request (optional, arrival order): ``slo_s`` an explicit deadline relative to arrival in
    seconds (NaN: none, the tier's SLO applies) and ``tier`` the service tier name (``None``: every
    request is ``standard``), ``min_quality`` the request's minimum quality level id (``None``:
    none; the policy's routing applies it, as the live router's). ``slo_note`` says where they came
    from or why they were ignored.
    """

    arrivals_s: np.ndarray
    prompt_idx: np.ndarray
    prompts: Sequence[str]
    quality: dict[str, np.ndarray]
    relative: dict[str, np.ndarray]
    optimal: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)
    neighbours: np.ndarray | None = None
    neighbour_sim: np.ndarray | None = None
    confidence: np.ndarray | None = None
    # per cascade light level id, its discriminator's confidence per prompt (profiles with several
    # pairs); a light level not listed uses ``confidence``
    confidences: dict[str, np.ndarray] = field(default_factory=dict)
    classifier: str = "none"
    quality_source: str = ""
    similarity_source: str = "exact repeats only"
    confidence_source: str = ""
    trace_name: str = ""
    slo_s: np.ndarray | None = None
    tier: tuple[str, ...] | None = None
    min_quality: tuple[str | None, ...] | None = None
    slo_note: str = ""
    derived_optimal: dict[tuple[str, ...], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.arrivals_s = np.asarray(self.arrivals_s, dtype=np.float64)
        self.prompt_idx = np.asarray(self.prompt_idx, dtype=np.int64)
        if self.arrivals_s.shape != self.prompt_idx.shape:
            raise ConfigError("workload: arrivals and prompt indices differ in length")
        n_req = len(self.arrivals_s)
        if self.slo_s is not None:
            self.slo_s = np.asarray(self.slo_s, dtype=np.float64).reshape(-1)
            if len(self.slo_s) != n_req:
                raise ConfigError(f"workload: {len(self.slo_s)} per-request SLOs for {n_req} arrivals")
            if np.any(self.slo_s[np.isfinite(self.slo_s)] <= 0):
                raise ConfigError("workload: per-request SLOs must be positive")
        if self.tier is not None:
            self.tier = tuple(str(t) for t in self.tier)
            if len(self.tier) != n_req:
                raise ConfigError(f"workload: {len(self.tier)} tiers for {n_req} arrivals")
        if self.min_quality is not None:
            self.min_quality = tuple(None if q is None else str(q) for q in self.min_quality)
            if len(self.min_quality) != n_req:
                raise ConfigError(f"workload: {len(self.min_quality)} minimum quality levels for {n_req} arrivals")
        if n_req and np.any(np.diff(self.arrivals_s) < 0):
            order = np.argsort(self.arrivals_s, kind="stable")
            self.arrivals_s = self.arrivals_s[order]
            self.prompt_idx = self.prompt_idx[order]
            if self.slo_s is not None:
                self.slo_s = self.slo_s[order]
            if self.tier is not None:
                self.tier = tuple(self.tier[k] for k in order)
            if self.min_quality is not None:
                self.min_quality = tuple(self.min_quality[k] for k in order)
        n = len(self.prompts)
        if n == 0:
            raise ConfigError("workload: empty prompt set")
        if len(self.prompt_idx) and (self.prompt_idx.min() < 0):
            raise ConfigError("workload: negative prompt index in the trace")
        # a trace's prompt indices wrap around the prompt set
        self.prompt_idx = self.prompt_idx % n

    def optimal_for(self, profile: Profile) -> np.ndarray | None:
        """Optimal level index per prompt for a ladder no classifier was asked about (a merged
        AC+SM ladder): from the quality tables, the fastest level whose score is >= 0.9 × the
        prompt's score at the ladder's best level (no confusion; recorded in ``derived_optimal``)."""
        ids = profile.ids
        if ids in self.optimal:
            return self.optimal[ids]
        if not self.has_levels(profile):
            return None
        scores = np.stack([self.quality[lv] for lv in ids], axis=1)
        ok = scores >= 0.9 * scores[:, :1] - 1e-12
        lat = np.array([lv.latency(1) for lv in profile.levels])
        # among qualifying levels the fastest (ties: the later, i.e. lower-quality, level)
        key = np.where(ok, lat[None, :] - 1e-9 * np.arange(len(ids))[None, :], np.inf)
        opt = np.argmin(key, axis=1).astype(np.int64)
        self.optimal[ids] = opt
        self.derived_optimal[ids] = "quality-table oracle for the merged ladder (0.9 rule, no confusion)"
        return opt

    @property
    def n_requests(self) -> int:
        return len(self.arrivals_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrivals_s[-1]) if len(self.arrivals_s) else 0.0

    def has_levels(self, profile: Profile) -> bool:
        return all(lv in self.quality for lv in profile.ids)


def nearest_neighbours(embeddings: np.ndarray, k: int = 16, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` most similar other prompts per prompt (rows L2-normalised), by blocks."""
    emb = np.asarray(embeddings, dtype=np.float32)
    n = emb.shape[0]
    k = max(1, min(k, n - 1)) if n > 1 else 1
    idx = np.zeros((n, k), dtype=np.int32)
    sim = np.full((n, k), -1.0, dtype=np.float32)
    if n < 2:
        return idx, sim
    for s in range(0, n, block):
        e = emb[s : s + block]
        scores = e @ emb.T
        rows = np.arange(e.shape[0])
        scores[rows, s + rows] = -np.inf  # not itself
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        psim = np.take_along_axis(scores, part, axis=1)
        order = np.argsort(-psim, axis=1)
        idx[s : s + block] = np.take_along_axis(part, order, axis=1)
        sim[s : s + block] = np.take_along_axis(psim, order, axis=1)
    return idx, sim


def build_workload(
    arrivals_s: np.ndarray,
    prompt_idx: np.ndarray,
    prompts: Sequence[str],
    tables: Mapping[str, tuple[Profile, Any]],
    *,
    classifiers: Mapping[str, Any] | None = None,
    embeddings: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
    confidences: Mapping[str, np.ndarray] | None = None,
    classifier_desc: str = "none",
    quality_source: str = "",
    similarity_source: str | None = None,
    confidence_source: str = "",
    trace_name: str = "",
    slo_s: np.ndarray | None = None,
    tier: Sequence[str] | None = None,
    slo_note: str = "",
) -> Workload:
    """A workload from quality tables (one per profile, rows = ``prompts``) and optional classifiers
    (per profile name; ``None``: the table's true optimal levels)."""
    from argusdiff.policies.classifier import predict_level_indices

    quality: dict[str, np.ndarray] = {}
    relative: dict[str, np.ndarray] = {}
    optimal: dict[tuple[str, ...], np.ndarray] = {}
    for name, (profile, table) in tables.items():
        table.check_levels(profile.ids)
        if len(table) != len(prompts):
            raise ConfigError(f"quality table for {name!r} has {len(table)} prompts, the prompt set has {len(prompts)}")
        best = table.scores[:, 0]
        safe = np.where(np.abs(best) > 1e-12, best, 1.0)
        for j, lv in enumerate(profile.ids):
            quality[lv] = table.scores[:, j].copy()
            relative[lv] = table.scores[:, j] / safe
        clf = (classifiers or {}).get(name)
        if clf is None:
            optimal[profile.ids] = np.asarray(table.optimal_levels(0.9), dtype=np.int64)
        else:
            optimal[profile.ids] = predict_level_indices(clf, prompts, profile.ids)
    neighbours = sims = None
    if embeddings is not None:
        if len(embeddings) != len(prompts):
            raise ConfigError(f"embeddings have {len(embeddings)} rows, the prompt set has {len(prompts)}")
        neighbours, sims = nearest_neighbours(embeddings)
    return Workload(
        arrivals_s=arrivals_s,
        prompt_idx=prompt_idx,
        prompts=prompts,
        quality=quality,
        relative=relative,
        optimal=optimal,
        neighbours=neighbours,
        neighbour_sim=sims,
        confidence=None if confidence is None else np.asarray(confidence, dtype=np.float64),
        confidences={k: np.asarray(v, dtype=np.float64) for k, v in (confidences or {}).items()},
        classifier=classifier_desc,
        quality_source=quality_source,
        similarity_source=similarity_source
        or ("MiniLM prompt embeddings (cosine)" if embeddings is not None else "exact repeats only"),
        confidence_source=confidence_source,
        trace_name=trace_name,
        slo_s=slo_s,
        tier=None if tier is None else tuple(tier),
        slo_note=slo_note,
    )


def quick_workload(
    trace: str,
    profiles: Sequence[Profile],
    *,
    n_prompts: int = 500,
    seed: int = 0,
    confusion: float = 0.0,
    embeddings: np.ndarray | None = None,
) -> Workload:
    """A small workload for tests and notebooks: a generated trace, the first ``n_prompts`` of the
    built-in prompt set, SYNTHETIC quality tables (``traces.synthetic``) for ``profiles``, the oracle
    classifier stand-in with ``confusion``, and cascade confidences derived from the tables."""
    from argusdiff.policies.classifier import OracleClassifier
    from traces.formats import load_trace
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_confidence, synthetic_quality_table

    prompts = builtin_prompts().head(n_prompts)
    tables = {p.name: (p, synthetic_quality_table(prompts, p, seed=seed)) for p in profiles}
    classifiers = {name: OracleClassifier(t, confusion=confusion, seed=seed) for name, (_p, t) in tables.items()}
    confidence = None
    confidences: dict[str, np.ndarray] = {}
    for p, t in tables.values():
        if p.cascade is not None or p.cascades:
            for spec in p.cascade_specs:
                confidences[spec.light] = synthetic_confidence(t, p, seed, spec)
            if p.cascade is not None:
                confidence = confidences[p.cascade.light]
    tr = load_trace(trace, seed=seed, n_prompts=len(prompts))
    slo_s, tier, slo_note = trace_deadlines(tr)
    return build_workload(
        tr.arrivals_s,
        tr.prompt_idx,
        list(prompts.prompts),
        tables,
        classifiers=classifiers,
        embeddings=embeddings,
        confidence=confidence,
        confidences=confidences,
        classifier_desc=next(iter(classifiers.values())).description,
        quality_source="SYNTHETIC (traces.synthetic)",
        trace_name=tr.name,
        slo_s=slo_s,
        tier=tier,
        slo_note=slo_note,
    )
