"""Cache policy: which similarity earns which K, and which latents to keep under a byte budget.

Pure functions and small value types, no I/O and no wall clock, so the simulator, the router and
the cache itself share one definition.

**Similarity → K (NIRVANA).** A new prompt may resume from the latent an earlier prompt left after
K of N denoising steps when the two prompts' text embeddings are similar enough; the more steps
skipped, the more similar they must be. NIRVANA's defaults (NIRVANA, NSDI '24; the papers in
../shared give no table — ARGUS §4.5 and §5.1 only say K follows the prompt's similarity):
similarity > 0.95 → K = 25, > 0.90 → 20, > 0.85 → 15, > 0.75 → 10, > 0.65 → 5, else a miss (K = 0).
Comparisons are strict, as in the paper.

**Retention (LCBFU).** NIRVANA's "least computational benefit × frequently used" eviction: each
stored latent (a prompt at one K) is worth ``hits × K`` — the denoising steps it has saved so far.
When the store is over its byte budget the least valuable latents go first; ties go to the least
recently used, then to the larger blob.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from argusdiff.errors import ConfigError

__all__ = [
    "NIRVANA_THRESHOLDS",
    "CachePolicy",
    "LatentStat",
    "RetentionPolicy",
    "k_for_similarities",
    "k_for_similarity",
    "lcbfu_value",
    "min_similarity_for_k",
    "validate_thresholds",
]

#: (similarity threshold, K) pairs, most similar first: similarity > threshold earns K.
NIRVANA_THRESHOLDS: tuple[tuple[float, int], ...] = (
    (0.95, 25),
    (0.90, 20),
    (0.85, 15),
    (0.75, 10),
    (0.65, 5),
)


def validate_thresholds(
    thresholds: Iterable[Sequence[float]], *, name: str = "thresholds"
) -> tuple[tuple[float, int], ...]:
    """Normalise and check a threshold table; raises :class:`ConfigError` naming ``name``.

    Rules: at least one pair; similarities in [-1, 1] strictly decreasing; K positive integers
    strictly decreasing (a higher similarity never earns fewer skipped steps).
    """
    out: list[tuple[float, int]] = []
    for i, pair in enumerate(thresholds):
        try:
            sim, k = pair
        except (TypeError, ValueError):
            raise ConfigError(f"{name}[{i}]: expected a [similarity, K] pair (got {pair!r})") from None
        try:
            sim_f = float(sim)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}[{i}]: similarity must be a number (got {sim!r})") from None
        if not (-1.0 <= sim_f <= 1.0) or math.isnan(sim_f):
            raise ConfigError(f"{name}[{i}]: similarity must be in [-1, 1] (got {sim!r})")
        if isinstance(k, bool) or not float(k).is_integer() or int(k) < 1:
            raise ConfigError(f"{name}[{i}]: K must be a positive integer (got {k!r})")
        out.append((sim_f, int(k)))
    if not out:
        raise ConfigError(f"{name}: needs at least one [similarity, K] pair")
    for i in range(1, len(out)):
        if not out[i][0] < out[i - 1][0]:
            raise ConfigError(
                f"{name}[{i}]: similarities must strictly decrease, most similar first "
                f"({out[i][0]} after {out[i - 1][0]})"
            )
        if not out[i][1] < out[i - 1][1]:
            raise ConfigError(
                f"{name}[{i}]: K must strictly decrease with similarity ({out[i][1]} after {out[i - 1][1]})"
            )
    return tuple(out)


def k_for_similarity(similarity: float, thresholds: Sequence[tuple[float, int]] = NIRVANA_THRESHOLDS) -> int:
    """The largest K a prompt at ``similarity`` to a cached one may skip; 0 means a miss."""
    s = float(similarity)
    if math.isnan(s):
        return 0
    for threshold, k in thresholds:
        if s > threshold:
            return int(k)
    return 0


def k_for_similarities(
    similarities: Sequence[float] | np.ndarray, thresholds: Sequence[tuple[float, int]] = NIRVANA_THRESHOLDS
) -> np.ndarray:
    """Vectorised :func:`k_for_similarity`: an int64 array of K (0 = miss), same shape as the input."""
    sims = np.asarray(similarities, dtype=np.float64)
    # Ascending thresholds; searchsorted(side="left") counts thresholds strictly below each value.
    ths = np.array([t for t, _ in thresholds], dtype=np.float64)[::-1]
    ks = np.concatenate([[0], np.array([k for _, k in thresholds], dtype=np.int64)[::-1]])
    idx = np.searchsorted(ths, sims, side="left")
    out = ks[idx]
    if np.isnan(sims).any():
        out = np.where(np.isnan(sims), 0, out)
    return out.astype(np.int64)


def min_similarity_for_k(k: int, thresholds: Sequence[tuple[float, int]] = NIRVANA_THRESHOLDS) -> float:
    """The similarity a cached prompt must *exceed* to serve a request skipping ``k`` steps.

    It is the threshold of the smallest tabulated K ≥ ``k``; ``-inf`` for ``k <= 0`` (no skip
    needs no match) and ``+inf`` when ``k`` is above every tabulated K (never servable).
    """
    if k <= 0:
        return -math.inf
    best = math.inf
    for threshold, kk in thresholds:
        if kk >= k:
            best = threshold  # thresholds decrease as K decreases: the last match is the loosest
    return best


# --- Retention ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatentStat:
    """What the retention policy sees of one stored latent (one prompt at one K)."""

    prompt_id: str
    k: int
    size_bytes: int
    hits: int = 0
    last_use_s: float = 0.0  # any monotone clock; only the order matters

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt_id, self.k)


def lcbfu_value(hits: int, k: int) -> int:
    """LCBFU worth of a latent: denoising steps it has saved so far (hits × K)."""
    return int(hits) * int(k)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Keep stored latents within ``byte_budget`` (and optionally ``max_latents``) by LCBFU."""

    byte_budget: int | None = None  # None: unbounded
    max_latents: int | None = None  # None: unbounded

    def __post_init__(self) -> None:
        if self.byte_budget is not None and self.byte_budget < 0:
            raise ConfigError(f"byte_budget must be >= 0 (got {self.byte_budget})")
        if self.max_latents is not None and self.max_latents < 0:
            raise ConfigError(f"max_latents must be >= 0 (got {self.max_latents})")

    @staticmethod
    def order(stats: Iterable[LatentStat]) -> list[LatentStat]:
        """Latents in eviction order: lowest hits × K first, then least recently used, then larger."""
        return sorted(stats, key=lambda s: (lcbfu_value(s.hits, s.k), s.last_use_s, -s.size_bytes, s.prompt_id, s.k))

    def over_budget(self, total_bytes: int, count: int) -> bool:
        if self.byte_budget is not None and total_bytes > self.byte_budget:
            return True
        return self.max_latents is not None and count > self.max_latents

    def victims(
        self, stats: Sequence[LatentStat], *, incoming_bytes: int = 0, incoming_count: int = 0
    ) -> list[tuple[str, int]]:
        """Keys ``(prompt_id, k)`` to evict so the kept latents plus the incoming ones fit.

        ``incoming_*`` reserve room for latents about to be stored (they are not candidates).
        If the incoming latents alone exceed the budget, every stored latent is a victim.
        """
        total = sum(s.size_bytes for s in stats) + int(incoming_bytes)
        count = len(stats) + int(incoming_count)
        out: list[tuple[str, int]] = []
        for s in self.order(stats):
            if not self.over_budget(total, count):
                break
            out.append(s.key)
            total -= s.size_bytes
            count -= 1
        return out


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Thresholds plus retention: everything the cache decides, in one value.

    The thresholds speak of K out of ``reference_steps`` (NIRVANA: N = 50). A level running a
    different N may pass ``steps``: its K is then scaled to the same *fraction* of the trajectory
    (K = 4 of N = 8 is judged like K = 25 of 50), so short schedules are not under-protected.
    """

    thresholds: tuple[tuple[float, int], ...] = NIRVANA_THRESHOLDS
    retention: RetentionPolicy = RetentionPolicy()
    reference_steps: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", validate_thresholds(self.thresholds))
        if self.reference_steps < 1:
            raise ConfigError(f"reference_steps must be >= 1 (got {self.reference_steps})")

    @property
    def ks(self) -> tuple[int, ...]:
        """Tabulated K values, largest first."""
        return tuple(k for _, k in self.thresholds)

    def scaled_k(self, k: int, steps: int | None = None) -> int:
        """``k`` of ``steps`` expressed in the table's K of ``reference_steps`` (rounded up)."""
        if steps is None or steps == self.reference_steps or k <= 0:
            return int(k)
        if steps < 1:
            raise ValueError(f"steps must be >= 1 (got {steps})")
        return math.ceil(int(k) * self.reference_steps / int(steps) - 1e-9)

    def min_similarity(self, k: int, steps: int | None = None) -> float:
        return min_similarity_for_k(self.scaled_k(k, steps), self.thresholds)

    def admits(self, similarity: float, k: int, steps: int | None = None) -> bool:
        """True when a cached prompt at ``similarity`` may serve a request skipping ``k`` (of ``steps``)."""
        return k > 0 and similarity > self.min_similarity(k, steps)
