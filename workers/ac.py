"""Approximate caching (AC) levels: skip K of N denoising steps by resuming from the cached
latent of a similar earlier prompt (NIRVANA; ARGUS §4.5).

Per request an :class:`ApproxCacheExecutor`:

1. embeds the prompt (MiniLM by default, or the ``embed`` callable given) and asks the cache
   for a latent at this level's K for this model (``cache_lookup_s`` + ``latent_fetch_s``);
2. on a hit whose metadata matches (model, scheduler, N, K, shape) resumes from it and runs only
   N−K steps (``k_used = K``);
3. on a miss (or a K = 0 level) runs all N steps, capturing the latents after every K the
   deployment's AC levels use, and stores them with the prompt's embedding for later requests.

A level with a ``feature_cache`` (K = 0) runs all N steps with that diffusers cache hook on the
model's denoiser (:mod:`workers.feature_cache`) and neither stores nor resumes latents: its
trajectory is approximate.

A failing cache (:class:`cache.api.CacheUnavailable`) never fails the request: it runs all N
steps and the result carries ``cache_error`` so the control plane can switch AC→SM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from argusdiff.domain import ApproxLevel, Profile, Strategy
from cache.api import (
    EMBEDDING_META_KEY,
    CacheHit,
    CacheUnavailable,
    LatentCacheProtocol,
    LatentMeta,
    decode_embedding,
)
from workers.adapters import adapter_cache_model
from workers.cancel import Cancelled, CancelWatch
from workers.errors import LatentMismatch, WorkerError
from workers.messages import WorkItem, WorkResult
from workers.pipelines import check_resumable, generate, latent_shape, resume
from workers.registry import ModelRegistry
from workers.sm import ModelExecutor, feature_cache_timing, queue_wait, seeds_of

__all__ = ["ApproxCacheExecutor", "ac_capture_ks", "default_embedder"]

Embedder = Callable[[Sequence[str]], Any]


def ac_capture_ks(levels: Profile | Iterable[ApproxLevel], level: ApproxLevel) -> tuple[int, ...]:
    """Which K latents an AC worker of ``level`` captures on a miss and stores: every K > 0 that an
    AC level of the same model and N uses among ``levels`` (a profile's, or a deployment's
    catalogue with its fallback). The one rule: a latent of another model or N could never be
    resumed (a hit must match model, scheduler, N, K and shape)."""
    pool = levels.levels if isinstance(levels, Profile) else levels
    return tuple(
        sorted(
            {
                lv.skip
                for lv in pool
                if lv.strategy is Strategy.AC and lv.model == level.model and lv.steps == level.steps and lv.skip > 0
            }
        )
    )


def default_embedder() -> Embedder:
    """The MiniLM prompt encoder of :mod:`traces.embeddings` (384-d, L2-normalised), without its
    disk cache (a serving prompt stream would grow it without bound)."""
    try:
        from traces.embeddings import get_encoder
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise WorkerError(
            f"approximate caching needs a prompt encoder: traces.embeddings is unavailable ({exc}); "
            "pass embed= or install the 'models' extra"
        ) from None
    return get_encoder(use_cache=False).encode


class ApproxCacheExecutor(ModelExecutor):
    def __init__(
        self,
        level: ApproxLevel,
        registry: ModelRegistry,
        *,
        cache: LatentCacheProtocol | None = None,
        embed: Embedder | None = None,
        capture_ks: Sequence[int] | None = None,
        store: bool = True,
        encoder: str = "minilm",
    ) -> None:
        super().__init__(level, registry)
        if level.strategy is not Strategy.AC:
            raise ValueError(f"level {level.id!r} is not an approximate-caching level")
        self.cache = cache
        self._embed = embed
        self.encoder = encoder  # "minilm" or "clip" (the loaded pipeline's text encoder)
        ks = set(capture_ks or ())
        if level.skip:
            ks.add(level.skip)
        self.capture_ks = tuple(sorted(k for k in ks if 0 < k < level.steps))
        self.store_latents = store and cache is not None
        if level.feature_cache:  # its trajectory is approximate: it neither stores nor resumes latents
            self.capture_ks = ()
            self.store_latents = False
        self.stats = {"hits": 0, "misses": 0, "cache_errors": 0, "mismatches": 0, "stored": 0, "embedded": 0}

    def embed(self, prompts: Sequence[str]) -> np.ndarray:
        if self._embed is None:
            if self.encoder == "clip":
                from workers.prompt_encoder import ClipPromptEncoder, check_dim

                clip = ClipPromptEncoder.from_pipeline(self.loaded.pipe)
                if self._index_dim is not None:
                    check_dim(clip.dim, self._index_dim, f"the CLIP text encoder of {self.model!r}")
                self._embed = clip
            else:
                self._embed = default_embedder()
        out = np.asarray(self._embed(list(prompts)), dtype=np.float32)
        return out.reshape(len(prompts), -1)

    @property
    def cache_model(self) -> str:
        """The model name latents are stored and looked up under: the model's, with the active LoRA
        adapter and scale (:mod:`workers.adapters`), so a latent made with another adapter (or
        none) is never reused."""
        return adapter_cache_model(self.model, getattr(self, "active_adapter", None))

    @property
    def _index_dim(self) -> int | None:
        dim = getattr(getattr(self.cache, "index", None), "dim", None)
        return None if dim is None else int(dim)

    def _embeddings(self, items: Sequence[WorkItem]) -> np.ndarray:
        """The items' prompt embeddings: the router's (``meta["embedding"]``, when it looked every
        prompt of the batch up in the cache already, at the index's size), else this executor's
        encoder for the whole batch."""
        given = [decode_embedding(i.meta.get(EMBEDDING_META_KEY), self._index_dim) for i in items]
        if all(v is not None for v in given):
            return np.stack(given)  # type: ignore[arg-type]
        self.stats["embedded"] += len(items)
        return self.embed([i.prompt for i in items])

    def _scheduler_name(self) -> str:
        return check_resumable(self.loaded)

    def _usable(self, hit: CacheHit, scheduler: str) -> bool:
        meta = hit.meta
        want = latent_shape(self.loaded)[1:]
        got = tuple(meta.shape[-3:]) if meta.shape else tuple(np.shape(hit.latent)[-3:])
        return (
            meta.model == self.cache_model
            and meta.scheduler == scheduler
            and meta.steps == self.level.steps
            and hit.k == self.level.skip
            and got == want
            and tuple(np.shape(hit.latent)[-3:]) == want
        )

    def run(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        if not items:
            return []
        started = time.time()
        model = self.loaded
        scheduler = (
            self._scheduler_name() if (self.capture_ks or self.level.skip) else type(model.pipe.scheduler).__name__
        )
        seeds = seeds_of(items)
        k = self.level.skip
        lookups, embeddings = self._lookups(items, k, scheduler)
        hits = [i for i, e in enumerate(lookups) if e["hit"] is not None]
        misses = [i for i, e in enumerate(lookups) if e["hit"] is None]
        results: dict[int, WorkResult] = {}
        if hits:
            self.stats["hits"] += len(hits)
            try:
                gen = resume(
                    model,
                    [items[i].prompt for i in hits],
                    [lookups[i]["hit"].latent for i in hits],
                    k,
                    [seeds[i] for i in hits],
                    steps=self.level.steps,
                    on_step=self.reporter([items[i] for i in hits], start=k),
                    cancel=CancelWatch([items[i] for i in hits]),
                )
            except Cancelled as exc:
                for i, res in zip(hits, self.cancelled([items[i] for i in hits], exc, started), strict=True):
                    results[i] = res
            except LatentMismatch:
                self.stats["mismatches"] += len(hits)
                misses = sorted(misses + hits)
                hits = []
            else:
                for j, i in enumerate(hits):
                    results[i] = self._result(
                        items[i],
                        seeds[i],
                        gen.images[j],
                        _timings(items[i], started, lookups[i], gen, len(hits)),
                        cache_hit=True,
                        k_used=k,
                        unet_calls=gen.unet_calls,
                    )
        if misses:
            self.stats["misses"] += len(misses)
            capture = self.capture_ks if (self.store_latents and embeddings is not None) else ()
            try:
                gen = generate(
                    model,
                    [items[i].prompt for i in misses],
                    [seeds[i] for i in misses],
                    steps=self.level.steps,
                    capture=capture,
                    on_step=self.reporter([items[i] for i in misses]),
                    cancel=CancelWatch([items[i] for i in misses]),
                    feature_cache=self.level.feature_cache,
                )
            except Cancelled as exc:  # nothing captured is stored: the run stopped early
                for i, res in zip(misses, self.cancelled([items[i] for i in misses], exc, started), strict=True):
                    results[i] = res
                misses = []
            for j, i in enumerate(misses):
                error = lookups[i]["error"]
                if capture and error is None:
                    error = self._store(embeddings[i], {kk: lat[j] for kk, lat in gen.captured.items()}, scheduler)
                results[i] = self._result(
                    items[i],
                    seeds[i],
                    gen.images[j],
                    _timings(items[i], started, lookups[i], gen, len(misses)),
                    cache_hit=False,
                    k_used=0,
                    unet_calls=gen.unet_calls,
                    cache_error=error,
                )
        return [results[i] for i in range(len(items))]

    def _lookups(
        self, items: Sequence[WorkItem], k: int, scheduler: str
    ) -> tuple[list[dict[str, Any]], np.ndarray | None]:
        """Each item's cache lookup (``lookup_s``, ``fetch_s``, the usable ``hit`` or None, an
        ``error``) and the prompts' embeddings (None without a cache, when nothing is looked up or
        stored, or when embedding failed). A hit that does not fit this level (``_usable``: model,
        scheduler, steps, K, latent shape) counts as a mismatch, not a hit."""
        lookups: list[dict[str, Any]] = [{"lookup_s": 0.0, "fetch_s": 0.0, "hit": None, "error": None} for _ in items]
        embeddings: np.ndarray | None = None
        if self.cache is not None and (k > 0 or self.store_latents):
            t0 = time.perf_counter()
            try:
                embeddings = self._embeddings(items)
            except Exception as exc:
                for entry in lookups:
                    entry["error"] = f"prompt embedding failed: {exc}"
                embeddings = None
            embed_s = (time.perf_counter() - t0) / len(items)
            for idx, entry in enumerate(lookups):
                entry["lookup_s"] = embed_s
                if embeddings is None or k == 0:
                    continue
                t1 = time.perf_counter()
                try:
                    hit = self.cache.lookup(embeddings[idx], k, model=self.cache_model, steps=self.level.steps)
                except CacheUnavailable as exc:
                    entry["error"] = str(exc) or "cache unavailable"
                    entry["lookup_s"] += time.perf_counter() - t1
                    self.stats["cache_errors"] += 1
                    continue
                elapsed = time.perf_counter() - t1
                if hit is not None:
                    entry["lookup_s"] += hit.lookup_s
                    entry["fetch_s"] = hit.fetch_s
                    if self._usable(hit, scheduler):
                        entry["hit"] = hit
                    else:
                        self.stats["mismatches"] += 1
                else:
                    entry["lookup_s"] += elapsed
        return lookups, embeddings

    def _store(self, embedding: np.ndarray, latents: dict[int, Any], scheduler: str) -> str | None:
        """Store one prompt's captured latents (fp16); returns an error message instead of raising."""
        if not latents or self.cache is None:
            return None
        arrays = {int(kk): lat.detach().to("cpu").float().numpy().astype(np.float16) for kk, lat in latents.items()}
        shape = next(iter(arrays.values())).shape
        meta = LatentMeta(
            model=self.cache_model,
            scheduler=scheduler,
            steps=self.level.steps,
            k=max(arrays),
            shape=tuple(shape),
            dtype="float16",
            extra={"ks": ",".join(str(x) for x in sorted(arrays))},
        )
        try:
            self.cache.store(embedding, arrays, meta)
        except CacheUnavailable as exc:
            self.stats["cache_errors"] += 1
            return str(exc) or "cache unavailable"
        self.stats["stored"] += 1
        return None


def _timings(item, started: float, lookup: dict, gen, batch: int) -> dict[str, float]:
    """Per-request timings of one generated batch (cache lookup and fetch are per request)."""
    return {
        "queue_wait_s": queue_wait(item, started),
        "cache_lookup_s": lookup["lookup_s"],
        "latent_fetch_s": lookup["fetch_s"],
        "denoise_s": gen.denoise_s,
        "decode_s": gen.decode_s,
        "batch": float(batch),
    } | feature_cache_timing(gen)
