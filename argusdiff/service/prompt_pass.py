"""One text-encoder pass per prompt: the level classifier and the cache-similarity view share it.

A policy that reads both the classifier's optimal level and the cache similarity (``argus+`` on an
AC or mixed profile) used to run two encoders per prompt: the classifier's BERT and the cache's
MiniLM sentence encoder. When they are the same encoder they compute the same thing: the level
classifier (pooling ``mean``) feeds the masked mean of the encoder's last hidden states to a linear
head, and the sentence encoder L2-normalises that same mean. :class:`PromptPass` then runs the
encoder once per micro-batch of prompts (:meth:`classifiers.level.LevelClassifier.pooled`), gives
the head its rows (the optimal level) and the cache their normalised rows (the nearest cached
prompt's similarity, and the embedding the AC executor stores under, ``meta["embedding"]``).

Whether the two encoders are the same is checked on the models, not on their names
(:func:`shares_encoder`): the classifier's normalised pooled vectors must match the cache encoder's
embeddings of a few probe prompts (cosine >= :data:`SHARE_MIN_COSINE`). That holds for a classifier
trained with the defaults (``[classifier] backbone`` unset = the packaged MiniLM, ``mode = "head"``:
a frozen encoder, ``pooling = "mean"``) and the default ``[cache] encoder = "minilm"``. It does not
hold for a fine-tuned encoder (``mode = "full"``), another backbone, ``pooling = "cls"``,
``[cache] encoder = "clip"`` or an int8 classifier; the pass then still batches both parts together
but runs each encoder (two passes), and says so once in the log. The check is repeated for each
classifier swapped in by the drift loop (:mod:`argusdiff.service.drift`).

Two consequences of sharing: prompts are truncated at the classifier's ``max_length`` word pieces
(128 by default; the sentence encoder alone reads 256), so a longer prompt's embedding describes its
head; and the embedding is computed at the classifier's ``precision`` (float32 unless the CPU has
native bfloat16).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from argusdiff.batching import LruCache, MicroBatcher

__all__ = ["SHARE_MIN_COSINE", "PromptPass", "PromptReading", "shares_encoder"]

log = logging.getLogger("argusdiff.router")

#: the probe prompts' least cosine between the two encoders' embeddings for them to count as one
SHARE_MIN_COSINE = 0.999
PROBES = (
    "a photo of a cat sitting on a windowsill",
    "an oil painting of a lighthouse at dusk, dramatic clouds, highly detailed, trending on artstation",
    "isometric pixel art of a tiny city",
    "portrait of an old fisherman, 85mm, bokeh",
)


def shares_encoder(classifier: Any, embed: Any) -> tuple[bool, str]:
    """Whether ``classifier``'s pooled vectors, L2-normalised, are ``embed``'s embeddings
    (``embed(prompts) -> (n, dim)``), and why (or why not)."""
    meta = getattr(classifier, "meta", None)
    if getattr(meta, "pooling", None) != "mean" or not hasattr(classifier, "pooled"):
        return False, "the classifier does not mean-pool its encoder's states"
    int8 = getattr(classifier, "precision", "float32") == "int8"
    if int8 and not getattr(classifier, "int8_gate_passed", False):
        return False, "its int8 encoder has no passed gate (classifiers.int8.int8_gate)"
    try:
        # an int8 encoder is the float32 one quantised within its gate: compare the float32 one
        probe = classifier.pooled(list(PROBES), exact=True) if int8 else classifier.pooled(list(PROBES))
        a = np.asarray(probe, dtype=np.float64)
        b = np.asarray(embed(list(PROBES)), dtype=np.float64)
    except Exception as exc:  # an encoder that cannot run here cannot be shared
        return False, f"cannot compare the encoders: {exc}"
    if a.shape != b.shape:
        return False, f"the classifier's encoder gives {a.shape[-1]}-d vectors, the cache's {b.shape[-1]}-d"
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    cos = float((a * b).sum(axis=1).min())
    if cos < SHARE_MIN_COSINE:
        return False, f"different encoders (probe cosine {cos:.4f} < {SHARE_MIN_COSINE})"
    if int8:
        return True, f"one encoder, run in int8 within its gate (float32 probe cosine {cos:.5f})"
    return True, f"one encoder (probe cosine {cos:.5f})"


@dataclass(frozen=True, slots=True)
class PromptReading:
    """What one pass learned of a prompt. A failed part carries its exception instead."""

    optimal: str | None = None
    similarity: float | None = None  # None: nothing of the model cached yet, or not looked up
    embedding: np.ndarray | None = None
    looked_up: bool = False
    classifier_error: BaseException | None = None
    lookup_error: BaseException | None = None


class PromptPass:
    """``submit(prompt, lookup) -> Future[PromptReading]``, micro-batched on one thread.

    ``classifier``: the live classifier holder (:class:`classifiers.level.BatchedClassifier`:
    ``.classifier`` is read once per batch, so a swap takes effect between batches and a prompt is
    classified by one model); ``similarity``: the cache view
    (:class:`argusdiff.service.similarity.CacheSimilarity`: its ``embed`` and ``nearest``).
    ``lookup=False`` skips the index query (an unhealthy cache) but still classifies.
    """

    def __init__(
        self,
        classifier: Any,
        similarity: Any,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        repeat_cache: int = 1024,
        merge: bool = True,
    ) -> None:
        self.holder = classifier
        self.similarity = similarity
        self._sharing: dict[int, tuple[bool, str]] = {}  # id(classifier) -> shares_encoder(...)
        self.encoded = 0  # prompt-encoder passes run (one per prompt when shared, two otherwise)
        self.prompts = 0
        # the encoder's output (level, unit embedding) of recent prompts, for the live model only:
        # an exact repeat is not encoded again (its index query still runs: the cache changes)
        self.repeats: LruCache[str, tuple[str | None, np.ndarray]] = LruCache(repeat_cache)
        self._repeats_of: int | None = None  # id() of the classifier the repeats were made with
        self._batcher: MicroBatcher[tuple[str, bool], PromptReading] = MicroBatcher(
            self._batch, max_batch=max_batch, max_wait_s=max_wait_s, retry_singly=False, name="prompt-pass",
            merge=merge,
        )  # fmt: skip

    @property
    def merged(self) -> int:
        """Prompts answered by an identical prompt's pass that was queued or running."""
        return self._batcher.merged

    @classmethod
    def of(cls, classifier: Any, similarity: Any, **kw: Any) -> PromptPass | None:
        """A pass over ``classifier`` and ``similarity`` when both are the live kinds it knows
        (a batched level classifier, a cache view with an encoder); else None."""
        if classifier is None or similarity is None:
            return None
        if not hasattr(getattr(classifier, "classifier", None), "predict") or not hasattr(similarity, "nearest"):
            return None
        return cls(classifier, similarity, **kw)

    def sharing(self, clf: Any = None) -> tuple[bool, str]:
        """(shared, why) for ``clf`` (default: the live classifier); checked once per model."""
        clf = self.holder.classifier if clf is None else clf
        got = self._sharing.get(id(clf))
        if got is None:
            got = shares_encoder(clf, self.similarity.embed)
            self._sharing = {id(clf): got}  # only the live model's answer is kept
            if got[0]:
                log.info("prompt pass: the level classifier and the cache view share one encoder (%s)", got[1])
            else:
                log.warning("prompt pass: two encoder passes per prompt: %s", got[1])
        return got

    @property
    def shared(self) -> bool:
        return self.sharing()[0]

    def submit(self, prompt: str, lookup: bool = True) -> Future:
        return self._batcher.submit((prompt, lookup))

    def _batch(self, items: list[tuple[str, bool]]) -> list[PromptReading]:
        clf = self.holder.classifier  # one model for the whole batch
        prompts = [p for p, _ in items]
        levels: list[str | None] = [None] * len(items)
        cerr: list[BaseException | None] = [None] * len(items)
        vecs: np.ndarray | None = None
        verr: BaseException | None = None
        if self.sharing(clf)[0]:
            if self._repeats_of != id(clf):  # another model (a drift retrain): its own outputs
                self.repeats.clear()
                self._repeats_of = id(clf)
            known = {p: got for p in dict.fromkeys(prompts) if (got := self.repeats.get(p)) is not None}
            # merging: each distinct prompt of the batch once (else every one, as it came)
            fresh = [p for p in (dict.fromkeys(prompts) if self._batcher.merge else prompts) if p not in known]
            try:
                pooled = clf.pooled(fresh, batch_size=max(1, len(fresh)))
            except Exception as exc:  # the encoder failed: both parts of every reading
                cerr = [exc] * len(items)
                verr = exc
            else:
                self.encoded += len(fresh)
                norms = np.linalg.norm(pooled, axis=1, keepdims=True)
                unit = (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
                fresh_levels: list[str | None] = [None] * len(fresh)
                try:
                    fresh_levels = list(clf.predict_pooled(fresh, pooled))
                except Exception:  # one bad prompt (e.g. empty with empty_prompt = "error"): alone
                    for i, p in enumerate(fresh):
                        try:
                            fresh_levels[i] = clf.predict_pooled([p], pooled[i : i + 1])[0]
                        except Exception as one:
                            for j, q in enumerate(prompts):
                                if q == p:
                                    cerr[j] = one
                for i, p in enumerate(fresh):
                    if fresh_levels[i] is not None:
                        self.repeats.put(p, (fresh_levels[i], unit[i]))
                    known[p] = (fresh_levels[i], unit[i])
                levels = [known[p][0] for p in prompts]
                vecs = np.stack([known[p][1] for p in prompts]) if prompts else None
        else:
            try:
                levels = list(clf.predict(prompts, batch_size=len(prompts)))
            except Exception:
                for i, p in enumerate(prompts):
                    try:
                        levels[i] = clf.predict([p])[0]
                    except Exception as one:
                        cerr[i] = one
            try:
                vecs = self.similarity.embed(prompts)
            except Exception as exc:
                verr = exc
            self.encoded += 2 * len(prompts)
        self.prompts += len(prompts)
        out: list[PromptReading] = []
        down: BaseException | None = None  # a failing index fails the rest of the batch at once
        for i, (_, lookup) in enumerate(items):
            sim, lerr = None, verr
            vec = None if vecs is None else vecs[i]
            if lookup and vec is not None:
                if down is not None:
                    lerr = down
                else:
                    try:
                        sim = self.similarity.nearest(vec)
                    except Exception as exc:
                        lerr = down = exc
            out.append(
                PromptReading(
                    optimal=levels[i],
                    similarity=sim,
                    embedding=vec,
                    looked_up=lookup and lerr is None and vec is not None,
                    classifier_error=cerr[i],
                    lookup_error=lerr if lookup else None,
                )
            )
        return out

    def close(self) -> None:
        self._batcher.close()
