"""A SYNTHETIC quality table calibrated to ARGUS's published numbers (not measured quality).

No GPU here means no measured PickScores; this generator stands in for
``scripts/profile_models.py`` so the simulator and the classifier trainer have per-prompt,
per-level scores with the structure ARGUS reports (§3.2, §5.5):

* many prompts tolerate approximation: each prompt's *optimal level* (the fastest level whose
  score is ≥ 0.9 × its best score) is spread over all levels (ARGUS Fig. 8);
* routing each prompt to its optimal level gives a mean PickScore of ≈ 20.8 (AC) / 20.6 (SM),
  routing uniformly at random ≈ 17.6 (AC) / 18.2 (SM) (ARGUS §5.5);
* degradation grows super-linearly with the speed gap between a level and the best level
  (ARGUS §4.3: "D grows super-linearly with the speed gap").

Model (all per prompt p, level i; levels slowest/best first)::

    u_i      = (1 - latency_i / latency_0) / gap_ref            # speed gap, 0 at the best level
    z_p      = mu + spread * (sqrt(rho) * f_p + sqrt(1 - rho) * e_p)   # tolerance score
    T_p      = t_max / (1 + exp(-z_p))                          # tolerated gap (logit-normal)
    x_pi     = 0.1 * (u_i / T_p) ** gamma                       # super-linear in the gap
    drop_pi  = max_drop * (1 - exp(-x_pi / max_drop))           # ≈ x for small x, ≤ max_drop
    score_pi = b_p * (1 - drop_pi) + score_noise * n_pi         # PickScore-like
    b_p      = base_mean + base_sd * e'_p

``f_p`` is a standardized linear score of TEXT FEATURES of the prompt (:func:`prompt_features`):
length and detail words, portraits/faces/hands, text rendering, counting and spatial relations
lower the tolerance; simple scenes, landscapes and painterly styles raise it. ``rho`` is the share
of the log-tolerance variance explained by the text (so a text classifier can learn most, not
all, of it). The noises ``e``, ``e'``, ``n`` come from a hash of (seed, prompt text), so a prompt
gets the same scores in any set and order.

Parameters per strategy were fitted with ``scripts/calibrate_synthetic.py`` (see
``docs/quality.md``). Caveat: to bring *random* routing down to 17.6 while the optimal-level mean
stays at 20.8, the fastest levels must be very bad for intolerant prompts (drops of 30–50%).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from argusdiff.domain import CascadeSpec, Profile, Strategy
from traces.prompts import PromptSet
from traces.quality import QualityTable, QualityTableError

__all__ = [
    "DEFAULT_PARAMS",
    "FEATURE_NAMES",
    "TARGETS",
    "CalibrationTarget",
    "SyntheticParams",
    "calibration_report",
    "fit_params",
    "level_gaps",
    "params_for",
    "prompt_features",
    "synthetic_confidence",
    "synthetic_quality_table",
    "tolerance",
]

VERSION = 2

# ---------------------------------------------------------------------------------------------
# Text features

_DETAIL = re.compile(
    r"\b(intricate|highly detailed|ultra detailed|detailed|8k|4k|hdr|sharp focus|octane|unreal engine|artstation|"
    r"cinematic|hyper ?realistic|photorealistic|realistic|volumetric|concept art|by [a-z]+ [a-z]+|elegant|"
    r"ornate|masterpiece|award winning|high quality|fine details?|textures?)\b"
)
_PORTRAIT = re.compile(
    r"\b(portrait|face|faces|selfie|close-?up of a (?:man|woman|person)|headshot|eyes|smiling|woman|man|girl|"
    r"boy|person|people|lady|gentleman|child|children|crowd)\b"
)
_HANDS = re.compile(r"\b(hands?|fingers?|holding)\b")
_TEXT = re.compile(
    r"(\"[^\"]+\"|“[^”]+”|\b(sign|says|saying|written|writing|text|letters?|typography|logo|title|titled|caption|"
    r"words?|reads|spelled|font)\b)"
)
_NUMBER_WORDS = "two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|dozen|several|many|multiple"
_COUNT = re.compile(rf"\b({_NUMBER_WORDS}|\d+)\s+(?!k\b|d\b|px\b|mm\b|%)[a-z]+")
_SPATIAL = re.compile(
    r"\b(left of|right of|on top of|under|underneath|below|above|behind|in front of|next to|beside|between|"
    r"inside|on the left|on the right)\b"
)
_SIMPLE = re.compile(
    r"\b(landscape|sky|sunset|sunrise|ocean|sea|mountains?|hills?|forest|field|meadow|lake|clouds?|desert|"
    r"beach|abstract|minimalist|minimal|simple|pattern|texture background|wallpaper|background|valley|river)\b"
)
_STYLE = re.compile(
    r"\b(painting|watercolou?r|oil on canvas|sketch|drawing|impressionis[mt]|illustration|pastel|linocut|"
    r"charcoal|poster|cartoon|flat)\b"
)

FEATURE_NAMES = (
    "log_words",
    "detail_terms",
    "portrait",
    "hands",
    "text_rendering",
    "counting",
    "spatial_terms",
    "simple_scene",
    "painterly_style",
    "short",
)

#: weight of each feature in the log-tolerance before standardization (negative: less tolerant)
FEATURE_WEIGHTS: dict[str, float] = {
    "log_words": -0.45,
    "detail_terms": -0.25,
    "portrait": -0.7,
    "hands": -0.4,
    "text_rendering": -1.2,
    "counting": -0.8,
    "spatial_terms": -0.45,
    "simple_scene": 0.6,
    "painterly_style": 0.4,
    "short": 0.3,
}


def prompt_features(texts: Sequence[str]) -> np.ndarray:
    """Text features of each prompt, shape ``(n, len(FEATURE_NAMES))`` (float64)."""
    out = np.zeros((len(texts), len(FEATURE_NAMES)))
    for i, raw in enumerate(texts):
        t = raw.lower()
        words = len(t.split())
        out[i] = (
            math.log1p(words),
            min(4, len(_DETAIL.findall(t))),
            1.0 if _PORTRAIT.search(t) else 0.0,
            1.0 if _HANDS.search(t) else 0.0,
            1.0 if _TEXT.search(raw) else 0.0,
            1.0 if _COUNT.search(t) else 0.0,
            min(2, len(_SPATIAL.findall(t))),
            1.0 if _SIMPLE.search(t) else 0.0,
            1.0 if _STYLE.search(t) else 0.0,
            1.0 if words <= 4 else 0.0,
        )
    return out


# ---------------------------------------------------------------------------------------------
# Parameters and targets


@dataclass(frozen=True)
class SyntheticParams:
    """Parameters of the synthetic quality model (see the module docstring)."""

    base_mean: float = 21.7  # PickScore of a prompt's best image, mean over prompts
    base_sd: float = 0.7
    mu: float = 0.0  # mean tolerance score
    spread: float = 1.5  # sd of the tolerance score
    t_max: float = 1.3  # largest tolerated gap (in units of gap_ref)
    rho: float = 0.65  # share of the log-tolerance variance explained by text features
    gamma: float = 2.0  # super-linearity of the drop in the speed gap (> 1)
    max_drop: float = 0.5  # largest relative drop
    score_noise: float = 0.15  # per-image PickScore noise
    gap_ref: float = 0.476  # speed gap (1 - latency/latency_best) that counts as u = 1
    feature_mean: float = -1.2  # standardization of the raw feature score (fitted on DiffusionDB)
    feature_sd: float = 0.6
    weights: Mapping[str, float] = field(default_factory=lambda: dict(FEATURE_WEIGHTS))

    def __post_init__(self) -> None:
        checks = {
            "base_sd": self.base_sd >= 0,
            "spread": self.spread > 0,
            "rho": 0.0 <= self.rho <= 1.0,
            "gamma": self.gamma > 0,
            "max_drop": 0.0 < self.max_drop < 1.0,
            "score_noise": self.score_noise >= 0,
            "gap_ref": self.gap_ref > 0,
            "t_max": self.t_max > 0,
            "feature_sd": self.feature_sd > 0,
            "base_mean": self.base_mean > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise QualityTableError(f"synthetic params: {name}={getattr(self, name)!r} is out of range")
        unknown = set(self.weights) - set(FEATURE_NAMES)
        if unknown:
            raise QualityTableError(f"synthetic params: unknown feature weights {sorted(unknown)}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weights"] = dict(self.weights)
        return d

    def describe(self) -> str:
        keys = ("base_mean", "mu", "spread", "t_max", "rho", "gamma", "max_drop", "gap_ref")
        return ", ".join(f"{k}={getattr(self, k):.4g}" for k in keys)


@dataclass(frozen=True)
class CalibrationTarget:
    """Published numbers the synthetic table is fitted to."""

    oracle: float  # mean PickScore when each prompt is served at its optimal level
    random: float  # mean PickScore when each prompt is served at a uniformly random level
    shares: tuple[float, ...] | None  # optimal-level shares, levels slowest first (None: not fitted)
    ratio: float = 0.9
    citation: str = ""


#: ARGUS §5.5: AC 20.8 (classifier) vs 17.6 (random); SM 20.6 vs 18.2. Shares: our reading of
#: ARGUS Fig. 8 (a bar chart without a table) for six levels: about 30% of prompts need the best
#: level, about a quarter tolerate the fastest one, the rest spread over the middle levels.
FIG8_SHARES_6 = (0.30, 0.10, 0.10, 0.12, 0.13, 0.25)
TARGETS: dict[str, CalibrationTarget] = {
    "ac": CalibrationTarget(20.8, 17.6, FIG8_SHARES_6, citation="ARGUS §5.5 (AC 20.8 vs 17.6), Fig. 8 (shares, read)"),
    "sm": CalibrationTarget(20.6, 18.2, FIG8_SHARES_6, citation="ARGUS §5.5 (SM 20.6 vs 18.2), Fig. 8 (shares, read)"),
}

#: Fitted by scripts/calibrate_synthetic.py on the first 5k DiffusionDB prompts (see docs/quality.md).
_FIT_FEATURES = {"feature_mean": -1.9582, "feature_sd": 0.8707}
DEFAULT_PARAMS: dict[str, SyntheticParams] = {
    # sdxl-ac-a100 (K = 0..25): shares L1 error 0.03, oracle 20.80, random 17.60
    "ac": SyntheticParams(
        base_mean=21.74, mu=0.0007, spread=2.882, t_max=1.118, gamma=3.53, max_drop=0.5059, gap_ref=0.4762,
        **_FIT_FEATURES,
    ),
    # sm-a100 (SD-XL .. Tiny-SD, ARGUS Table 2 latencies): oracle 20.60, random 18.20. SD-2.0, SD-1.5
    # and SD-1.4 are all 3.84 s (0.09 faster than SD-XL) and rarely optimal (shares L1 error 0.34);
    # gamma sits at its lower bound: the published random mean needs a steep drop at small gaps
    "sm": SyntheticParams(
        base_mean=21.7133, mu=0.0001, spread=3.9367, t_max=1.0644, gamma=1.05, max_drop=0.5552, gap_ref=0.481,
        **_FIT_FEATURES,
    ),
    # cascades (light -> heavy): the SM fit on the earlier SM ladder (SD-XL 4.2 s, Tiny-SD 0.6 s), whose
    # fastest-level speed gap (0.86) is the size of a cascade's light -> heavy gap (0.91..0.97);
    # oracle 20.60, random 18.22 on that ladder
    "cascade": SyntheticParams(
        base_mean=21.76, mu=-0.0013, spread=1.136, t_max=1.437, gamma=1.978, max_drop=0.7681, gap_ref=0.8571,
        **_FIT_FEATURES,
    ),
}  # fmt: skip


def params_for(profile: Profile) -> SyntheticParams:
    """The default parameters for a profile's strategy: the AC fit, the cascade parameters, else
    the SM fit."""
    strategies = {lv.strategy for lv in profile.levels}
    if strategies == {Strategy.AC}:
        return DEFAULT_PARAMS["ac"]
    if Strategy.CASCADE in strategies:
        return DEFAULT_PARAMS["cascade"]
    return DEFAULT_PARAMS["sm"]


def level_gaps(profile: Profile) -> np.ndarray:
    """Speed gap of each level to the best one: ``1 - latency_i / latency_0`` (batch 1), made
    strictly increasing (+0.01) where two levels have the same latency."""
    lat0 = profile.levels[0].latency(1)
    gaps = np.array([max(0.0, 1.0 - lv.latency(1) / lat0) for lv in profile.levels])
    for i in range(1, gaps.size):
        gaps[i] = max(gaps[i], gaps[i - 1] + 0.01)
    return gaps


# ---------------------------------------------------------------------------------------------
# Deterministic per-prompt noise


def _hash_normals(texts: Sequence[str], seed: int, stream: str, k: int = 1) -> np.ndarray:
    """Standard normals, shape (n, k), a pure function of (seed, stream, text)."""
    from scipy.special import ndtri

    if k > 8:  # one blake2b digest holds 8 words: further columns from numbered streams
        parts = [_hash_normals(texts, seed, stream, 8)]
        for c in range(1, math.ceil(k / 8)):
            parts.append(_hash_normals(texts, seed, f"{stream}\x00{c}", min(8, k - 8 * c)))
        return np.concatenate(parts, axis=1)
    out = np.empty((len(texts), k))
    for i, t in enumerate(texts):
        h = hashlib.blake2b(f"{seed}\x00{stream}\x00{t}".encode(), digest_size=8 * k).digest()
        words = np.frombuffer(h, dtype="<u8")
        out[i] = (words.astype(np.float64) + 0.5) / 2.0**64
    return ndtri(out)


def _feature_score(texts: Sequence[str], params: SyntheticParams, features: np.ndarray | None = None) -> np.ndarray:
    feats = prompt_features(texts) if features is None else features
    w = np.array([params.weights.get(name, 0.0) for name in FEATURE_NAMES])
    return feats @ w


def tolerance(
    texts: Sequence[str], params: SyntheticParams, *, seed: int = 0, features: np.ndarray | None = None
) -> np.ndarray:
    """Each prompt's tolerance score ``z_p`` (higher = tolerates faster levels)."""
    raw = _feature_score(texts, params, features)
    f = (raw - params.feature_mean) / params.feature_sd
    e = _hash_normals(texts, seed, "tolerance")[:, 0]
    return params.mu + params.spread * (math.sqrt(params.rho) * f + math.sqrt(1.0 - params.rho) * e)


def _scores(
    texts: Sequence[str],
    gaps: np.ndarray,
    params: SyntheticParams,
    seed: int,
    features: np.ndarray | None = None,
    noise: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    z = tolerance(texts, params, seed=seed, features=features)
    u = gaps / params.gap_ref
    t = params.t_max / (1.0 + np.exp(-z))
    x = 0.1 * (u[None, :] / t[:, None]) ** params.gamma
    drop = params.max_drop * (1.0 - np.exp(-x / params.max_drop))
    if noise is None:
        base_e = _hash_normals(texts, seed, "base")[:, 0]
        level_e = _hash_normals(texts, seed, "levels", k=gaps.size)
    else:
        base_e, level_e = noise
    b = params.base_mean + params.base_sd * base_e
    scores = b[:, None] * (1.0 - drop) + params.score_noise * level_e[:, : gaps.size]
    return np.maximum(scores, 0.01)


def synthetic_quality_table(
    prompts: PromptSet | Sequence[str],
    profile: Profile,
    *,
    seed: int = 0,
    params: SyntheticParams | None = None,
) -> QualityTable:
    """A SYNTHETIC PickScore-like table for ``prompts`` at ``profile``'s levels (marked
    ``synthetic=True``; its ``source`` names the generator, parameters and seed)."""
    if isinstance(prompts, PromptSet):
        texts, ids, set_name = list(prompts.prompts), prompts.ids, prompts.name
    else:
        texts = [str(p) for p in prompts]
        ids, set_name = tuple(f"p{i}" for i in range(len(texts))), "prompts"
    if not texts:
        raise QualityTableError("no prompts to build a synthetic quality table for")
    if profile.cascades and params is None:
        return _composed_table(texts, tuple(ids), set_name, profile, seed)
    p = params or params_for(profile)
    scores = _scores(texts, level_gaps(profile), p, seed)
    return QualityTable(
        level_ids=profile.ids,
        prompt_ids=tuple(ids),
        prompts=tuple(texts),
        scores=scores,
        metric="pickscore",
        source=(
            f"SYNTHETIC (traces.synthetic v{VERSION}, calibrated to ARGUS §5.5/Fig. 8; not measured) "
            f"prompts={set_name} seed={seed} {p.describe()}"
        ),
        synthetic=True,
        profile=profile.name,
    )


def _composed_table(texts: list[str], ids: tuple[str, ...], set_name: str, profile: Profile, seed: int) -> QualityTable:
    """A deployment profile with AC levels, smaller models and cascades: each kind of level from
    the generator fitted to it, as its single-strategy profile would get it. The AC levels as an AC
    ladder (the best level's model); the smaller models as an SM ladder below the profile's best
    level; each cascade's light level as the cascade pair [heavy, light], its score the heavy
    level's score here times the pair's light/heavy ratio (chained relative quality)."""
    from argusdiff.domain import Profile as _Profile

    levels = profile.levels
    best = levels[0]
    n = len(texts)
    cols: dict[str, np.ndarray] = {}

    def sub(name: str, lvls, params: SyntheticParams) -> np.ndarray:
        prof = _Profile(name=f"{profile.name}:{name}", gpu=profile.gpu, levels=tuple(lvls))
        return _scores(texts, level_gaps(prof), params, seed)

    ac = [lv for lv in levels if lv.strategy is Strategy.AC]
    if ac:
        sc = sub("ac", ac, DEFAULT_PARAMS["ac"])
        for j, lv in enumerate(ac):
            cols[lv.id] = sc[:, j]
    lights = {c.light: c for c in profile.cascades}
    sm = [lv for lv in levels if lv.strategy is not Strategy.AC and lv.id not in lights and lv.id not in cols]
    if sm:
        head = [best] if best.id not in {lv.id for lv in sm} else []
        sc = sub("sm", [*head, *sm], DEFAULT_PARAMS["sm"])
        if head and best.id not in cols:
            cols[best.id] = sc[:, 0]
        for j, lv in enumerate(sm):
            cols[lv.id] = sc[:, j + len(head)]
    pending = dict(lights)
    while pending:
        ready = [c for c in pending.values() if c.heavy in cols]
        if not ready:
            raise QualityTableError(
                f"profile {profile.name!r}: cascade heavy level(s) {sorted(c.heavy for c in pending.values())} "
                "have no synthetic scores"
            )
        for c in ready:
            sc = sub(f"cascade-{c.light}", [profile.level(c.heavy), profile.level(c.light)], DEFAULT_PARAMS["cascade"])
            cols[c.light] = cols[c.heavy] * sc[:, 1] / np.maximum(sc[:, 0], 1e-9)
            del pending[c.light]
    scores = np.stack([cols[lv.id] for lv in levels], axis=1) if n else np.zeros((0, len(levels)))
    return QualityTable(
        level_ids=profile.ids,
        prompt_ids=ids,
        prompts=tuple(texts),
        scores=np.maximum(scores, 0.01),
        metric="pickscore",
        source=(
            f"SYNTHETIC (traces.synthetic v{VERSION}, composed per strategy: AC, SM and cascade fits, cascade "
            f"light levels chained to their heavy level; not measured) prompts={set_name} seed={seed}"
        ),
        synthetic=True,
        profile=profile.name,
    )


# ---------------------------------------------------------------------------------------------
# Calibration


def synthetic_confidence(
    table: QualityTable, profile: Profile, rng_seed: int, spec: CascadeSpec | None = None
) -> np.ndarray:
    """SYNTHETIC discriminator confidences, one per prompt of ``table``, consistent with a cascade
    pair's f(t) (``spec``, default the profile's ``[cascade]``): a prompt whose light image is
    relatively worse (light score / heavy score) gets a lower confidence, and
    P(confidence < t) = f(t). The replay and the simulator's small workloads use it where no
    measured confidences exist."""
    c = spec if spec is not None else profile.cascade
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


def calibration_report(
    table: QualityTable,
    *,
    ratio: float = 0.9,
    target: CalibrationTarget | None = None,
    categories: Sequence[str] | None = None,
) -> dict:
    """What a table looks like against ARGUS's numbers: optimal-level shares, mean PickScore at
    the optimal level (oracle routing), under uniformly random routing (exact expectation),
    at the best level, and per level; per category when ``categories`` are given."""
    s = table.scores
    opt = table.optimal_levels(ratio)
    n, m = s.shape
    shares = np.bincount(opt, minlength=m) / n
    oracle = float(s[np.arange(n), opt].mean())
    rand = float(s.mean())
    rel = table.relative()
    out: dict = {
        "prompts": n,
        "levels": list(table.level_ids),
        "synthetic": table.synthetic,
        "source": table.source,
        "ratio": ratio,
        "optimal_share": [round(float(x), 4) for x in shares],
        "oracle_mean": round(oracle, 3),
        "random_mean": round(rand, 3),
        "best_level_mean": round(float(s[:, 0].mean()), 3),
        "level_mean": [round(float(x), 3) for x in s.mean(axis=0)],
        "level_relative_mean": [round(float(x), 4) for x in rel.mean(axis=0)],
        "level_relative_p10": [round(float(x), 4) for x in np.percentile(rel, 10, axis=0)],
        "mean_optimal_level": round(float(opt.mean()), 3),
    }
    if target is not None:
        out["target"] = {
            "oracle": target.oracle,
            "random": target.random,
            "shares": None if target.shares is None else list(target.shares),
            "citation": target.citation,
        }
        out["error"] = {"oracle": round(oracle - target.oracle, 3), "random": round(rand - target.random, 3)}
        if target.shares is not None and len(target.shares) == m:
            out["error"]["shares_l1"] = round(float(np.abs(shares - np.array(target.shares)).sum()), 4)
    if categories is not None:
        cats = np.array(categories, dtype=object)
        by = {}
        for c in sorted(set(categories)):
            mask = cats == c
            by[str(c)] = {
                "prompts": int(mask.sum()),
                "mean_optimal_level": round(float(opt[mask].mean()), 3),
                "share_best_level": round(float((opt[mask] == 0).mean()), 3),
                "share_fastest_level": round(float((opt[mask] == m - 1).mean()), 3),
            }
        out["by_category"] = by
    return out


def fit_params(
    prompts: PromptSet | Sequence[str],
    profile: Profile,
    target: CalibrationTarget,
    *,
    seed: int = 0,
    start: SyntheticParams | None = None,
    maxiter: int = 400,
) -> tuple[SyntheticParams, dict]:
    """Fit ``mu``, ``spread``, ``gamma``, ``max_drop``, ``t_max`` (shares and the random/oracle ratio) and
    then ``base_mean`` (the oracle mean) to ``target`` on ``prompts``; the feature
    standardization is set from these prompts. Returns the parameters and the report."""
    from scipy.optimize import minimize

    texts = list(prompts.prompts) if isinstance(prompts, PromptSet) else [str(p) for p in prompts]
    p0 = start or params_for(profile)
    gaps = level_gaps(profile)
    feats = prompt_features(texts)
    raw = feats @ np.array([p0.weights.get(k, 0.0) for k in FEATURE_NAMES])
    p0 = replace(p0, feature_mean=float(raw.mean()), feature_sd=float(raw.std()) or 1.0, gap_ref=float(gaps[-1]))
    noise = (_hash_normals(texts, seed, "base")[:, 0], _hash_normals(texts, seed, "levels", k=gaps.size))
    m = gaps.size
    want_shares = np.array(target.shares) if target.shares is not None and len(target.shares) == m else None
    want_ratio = target.random / target.oracle

    def build(v: np.ndarray) -> SyntheticParams:
        return replace(
            p0,
            mu=float(v[0]),
            spread=float(np.clip(abs(v[1]), 0.05, 5.0)),
            gamma=float(np.clip(v[2], 1.05, 6.0)),
            max_drop=float(np.clip(v[3], 0.12, 0.95)),
            t_max=float(np.clip(v[4], 0.5, 5.0)),
        )

    def stats(p: SyntheticParams) -> tuple[np.ndarray, float, float]:
        s = _scores(texts, gaps, p, seed, features=feats, noise=noise)
        rel = s / s.max(axis=1, keepdims=True)
        ok = rel >= target.ratio - 1e-12
        opt = m - 1 - np.argmax(ok[:, ::-1], axis=1)
        shares = np.bincount(opt, minlength=m) / len(texts)
        return shares, float(s[np.arange(len(texts)), opt].mean()), float(s.mean())

    def loss(v: np.ndarray) -> float:
        shares, oracle, rand = stats(build(v))
        err = 25.0 * (rand / oracle - want_ratio) ** 2
        if want_shares is not None:
            err += float(((shares - want_shares) ** 2).sum())
        return err

    best = None
    for g0 in (1.6, 2.2, 3.0):
        res = minimize(
            loss,
            np.array([p0.mu, p0.spread, g0, p0.max_drop, p0.t_max]),
            method="Nelder-Mead",
            options={"maxiter": maxiter, "xatol": 1e-3, "fatol": 1e-7, "initial_simplex": None},
        )
        if best is None or res.fun < best.fun:
            best = res
    fitted = build(best.x)
    _, oracle, _ = stats(fitted)
    # scores scale with base_mean (up to the small clipped noise): one rescale hits the oracle mean
    fitted = replace(fitted, base_mean=fitted.base_mean * target.oracle / oracle)
    table = synthetic_quality_table(prompts, profile, seed=seed, params=fitted)
    return fitted, calibration_report(table, ratio=target.ratio, target=target)
