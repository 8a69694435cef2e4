"""Offline training of the prompt → level classifier from a :class:`~traces.quality.QualityTable`.

Labels: each prompt's optimal level (:mod:`classifiers.labelling`). The table is split by prompt
text (a prompt never lands in both splits), classes are weighted by inverse frequency, training
stops early when the validation loss has not improved for ``patience`` epochs, and the best
epoch's weights are kept. Training is deterministic for a seed and resumable: with a
``checkpoint_dir`` the state after every epoch is saved, and a rerun with the same data and
settings continues where it stopped and ends with the same weights as an uninterrupted run.

Two modes:

* ``head`` (default, fast): the encoder is frozen; its pooled states are computed once and only the
  head is trained on them (pooling ``mean``: the linear layer, on standardized features, folded
  back into the layer afterwards; pooling ``cls``: the model's pooler + linear layer).
* ``full``: every weight is fine-tuned (slow on CPU).

The report holds accuracy, per-class precision/recall, the confusion matrix, and the number that
matters: mean quality on the validation prompts when routing by the classifier vs a random level
vs the oracle (each prompt at its optimal level).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.errors import TrainingDataError
from classifiers.labelling import DEFAULT_RATIO, optimal_labels, routing_quality
from traces.quality import QualityTable

__all__ = [
    "TrainConfig",
    "TrainReport",
    "classification_metrics",
    "evaluate_classifier",
    "split_by_prompt",
    "train_level_classifier",
]


@dataclass(frozen=True)
class TrainConfig:
    mode: str = "head"  # "head" | "full"
    epochs: int = 30
    batch_size: int = 32
    lr: float | None = None  # None: 3e-4 for "head", 3e-5 for "full"
    weight_decay: float = 0.01
    val_fraction: float = 0.2
    patience: int = 4
    seed: int = 0
    ratio: float = DEFAULT_RATIO
    max_length: int = 128
    backbone: str | None = None  # None: the packaged MiniLM
    class_weighting: bool = False  # inverse-frequency class weights (lower routing quality here)
    pooling: str = "mean"  # "mean" | "cls" (see classifiers.level)
    progress: bool = True
    checkpoint_dir: str | None = None
    feature_batch_size: int = 64
    int8_gate: bool = True  # measure the int8 encoder against float32 on the validation split

    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 3e-4 if self.mode == "head" else 3e-5

    def validate(self) -> None:
        if self.mode not in ("head", "full"):
            raise TrainingDataError(f"mode must be 'head' or 'full', got {self.mode!r}")
        if self.epochs < 1:
            raise TrainingDataError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise TrainingDataError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 < self.val_fraction < 1.0:
            raise TrainingDataError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.patience < 1:
            raise TrainingDataError(f"patience must be >= 1, got {self.patience}")
        if self.learning_rate() <= 0:
            raise TrainingDataError(f"lr must be > 0, got {self.lr}")


@dataclass
class TrainReport:
    level_ids: tuple[str, ...]
    n_train: int
    n_val: int
    label_counts: dict[str, int]
    accuracy: float
    accuracy_within_1: float
    per_class: dict[str, dict[str, float]]
    confusion: list[list[int]]
    routing: dict[str, float]
    epochs_run: int
    best_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    train_s: float = 0.0
    resumed_from_epoch: int = 0
    mode: str = "head"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["level_ids"] = list(self.level_ids)
        return d

    def format(self) -> str:
        lines = [
            f"train {self.n_train} prompts, validation {self.n_val}; mode {self.mode}; "
            f"{self.epochs_run} epochs (best {self.best_epoch}) in {self.train_s:.1f} s",
            "labels: " + ", ".join(f"{k}={v}" for k, v in self.label_counts.items()),
            f"validation accuracy {self.accuracy:.3f} (within one level {self.accuracy_within_1:.3f})",
            f"{'level':<16}{'precision':>10}{'recall':>8}{'support':>9}",
        ]
        for lv, m in self.per_class.items():
            lines.append(f"{lv:<16}{m['precision']:>10.3f}{m['recall']:>8.3f}{int(m['support']):>9}")
        lines.append("confusion (rows: optimal level, columns: predicted)")
        width = max(8, *(len(x) + 1 for x in self.level_ids))
        lines.append(" " * 16 + "".join(f"{lv:>{width}}" for lv in self.level_ids))
        for lv, row in zip(self.level_ids, self.confusion, strict=True):
            lines.append(f"{lv:<16}" + "".join(f"{c:>{width}}" for c in row))
        r = self.routing
        lines.append(
            f"mean quality on validation prompts: classifier {r['classifier']:.4f}, random {r['random']:.4f}, "
            f"oracle {r['oracle']:.4f}, best level {r['best']:.4f}"
        )
        lines.append(
            f"mean level index: classifier {r['classifier_level']:.2f}, random {r['random_level']:.2f}, "
            f"oracle {r['oracle_level']:.2f}; served below the bar {r['too_fast']:.1%}, slower than needed "
            f"{r['too_slow']:.1%}"
        )
        return "\n".join(lines)


# ---- data ----------------------------------------------------------------------------------


def split_by_prompt(prompts: Sequence[str], val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, val): rows with the same prompt text always share a split."""
    uniq = sorted(set(prompts))
    if len(uniq) < 2:
        raise TrainingDataError(f"need at least 2 distinct prompts to split, got {len(uniq)}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(uniq))
    n_val = min(max(1, round(len(uniq) * val_fraction)), len(uniq) - 1)
    val_set = {uniq[i] for i in order[:n_val]}
    is_val = np.array([p in val_set for p in prompts])
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def classification_metrics(labels: np.ndarray, predicted: np.ndarray, level_ids: Sequence[str]) -> dict[str, Any]:
    m = len(level_ids)
    labels = np.asarray(labels, dtype=np.int64)
    predicted = np.asarray(predicted, dtype=np.int64)
    conf = np.zeros((m, m), dtype=np.int64)
    np.add.at(conf, (labels, predicted), 1)
    per_class = {}
    for i, lv in enumerate(level_ids):
        tp = conf[i, i]
        col, row = conf[:, i].sum(), conf[i, :].sum()
        per_class[lv] = {
            "precision": float(tp / col) if col else 0.0,
            "recall": float(tp / row) if row else 0.0,
            "support": int(row),
        }
    return {
        "accuracy": float(np.mean(labels == predicted)) if len(labels) else 0.0,
        "accuracy_within_1": float(np.mean(np.abs(labels - predicted) <= 1)) if len(labels) else 0.0,
        "per_class": per_class,
        "confusion": conf.tolist(),
    }


def _class_weights(labels: np.ndarray, m: int) -> np.ndarray:
    counts = np.bincount(labels, minlength=m).astype(np.float64)
    present = counts > 0
    w = np.zeros(m)
    w[present] = len(labels) / (present.sum() * counts[present])
    return w


def _fingerprint(table: QualityTable, rows: np.ndarray, config: TrainConfig, level_ids: Sequence[str]) -> str:
    h = hashlib.sha256()
    cfg = asdict(config)
    for k in ("epochs", "progress", "checkpoint_dir", "feature_batch_size"):
        cfg.pop(k)
    h.update(json.dumps(cfg, sort_keys=True).encode())
    h.update(json.dumps(list(level_ids)).encode())
    for i in rows:
        h.update(table.prompts[i].encode())
        h.update(table.scores[i].tobytes())
    return h.hexdigest()[:16]


# ---- model pieces --------------------------------------------------------------------------


def _head_forward(model: Any, cls_states: Any) -> Any:
    """Logits from cached [CLS] states (B, H) for the frozen-encoder mode."""
    h = cls_states.unsqueeze(1)  # (B, 1, H): what the pooler / head expects
    base = model.base_model
    pooler = getattr(base, "pooler", None)
    if pooler is not None and hasattr(model, "dropout"):  # BERT-style: pooler -> dropout -> linear
        return model.classifier(model.dropout(pooler(h)))
    if hasattr(model, "classifier") and type(model.classifier).__name__.endswith("ClassificationHead"):
        return model.classifier(h)  # RoBERTa-style head takes the token states
    raise TrainingDataError(f"mode 'head' does not support {type(model).__name__}; use mode 'full' for this backbone")


def _head_parameters(model: Any) -> list[Any]:
    params = list(model.classifier.parameters())
    pooler = getattr(model.base_model, "pooler", None)
    if pooler is not None:
        params += list(pooler.parameters())
    return params


def _pooled_states(clf: Any, prompts: Sequence[str], batch_size: int, progress: bool) -> Any:
    torch = _torch()
    from tqdm.auto import tqdm

    out = []
    order = np.argsort([len(p) for p in prompts], kind="stable")  # similar lengths batch together
    starts = range(0, len(prompts), batch_size)
    with torch.inference_mode():
        for start in tqdm(starts, desc="encoding prompts", unit="batch", disable=not progress, leave=False):
            enc = clf.tokenize([prompts[i] for i in order[start : start + batch_size]])
            out.append(clf.encode(enc).clone())
    feats = torch.cat(out)
    restored = torch.empty_like(feats)
    restored[torch.as_tensor(order)] = feats
    return restored


def _torch():
    import torch

    return torch


# ---- training ------------------------------------------------------------------------------


class _Fit:
    """One training run's model, features and optimizer (:func:`train_level_classifier`).

    ``config.mode == "head"``: the encoder is frozen and the prompts are encoded once (their pooled
    states are the features; with mean pooling they are standardized on the training rows and
    the standardization is folded into the layer at the end); ``"full"``: every parameter trains
    on tokenized prompts."""

    def __init__(
        self,
        classifier: Any,
        prompts: list[str],
        labels: np.ndarray,
        n_levels: int,
        train_rows: np.ndarray,
        val_rows: np.ndarray,
        config: TrainConfig,
        say: Callable[[str], None],
    ) -> None:
        torch = self.torch = _torch()
        self.classifier, self.prompts, self.config = classifier, prompts, config
        self.train_rows, self.val_rows = train_rows, val_rows
        model = self.model = classifier.model
        self.mean_head = config.mode == "head" and classifier.meta.pooling == "mean"
        self.y = torch.as_tensor(labels, dtype=torch.long)
        weights = _class_weights(labels[train_rows], n_levels) if config.class_weighting else np.ones(n_levels)
        self.loss_fn = torch.nn.CrossEntropyLoss(weight=torch.as_tensor(weights, dtype=torch.float32))
        for p in model.parameters():
            p.requires_grad_(config.mode == "full")
        self.feats = self.mu = self.sd = None
        if config.mode == "head":
            params = list(model.classifier.parameters()) if self.mean_head else _head_parameters(model)
            for p in params:
                p.requires_grad_(True)
            say(f"encoding {len(prompts)} prompts with the frozen encoder")
            model.eval()
            feats = _pooled_states(classifier, prompts, config.feature_batch_size, config.progress)
            if self.mean_head:  # standardize on the training rows; folded into the layer at the end
                self.mu = feats[torch.as_tensor(train_rows)].mean(0)
                self.sd = feats[torch.as_tensor(train_rows)].std(0).clamp(min=1e-6)
                feats = (feats - self.mu) / self.sd
            self.feats = feats
        else:
            params = [p for p in model.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate(), weight_decay=config.weight_decay)
        self.say = say

    def batch_logits(self, rows: np.ndarray) -> Any:
        if self.feats is not None:
            x = self.feats[self.torch.as_tensor(rows)]
            return self.model.classifier(x) if self.mean_head else _head_forward(self.model, x)
        return self.classifier.forward(self.classifier.tokenize([self.prompts[i] for i in rows]))

    def val_loss_acc(self) -> tuple[float, float]:
        """The validation split's mean loss and accuracy."""
        self.model.eval()
        total, correct, n = 0.0, 0, 0
        y, val_rows = self.y, self.val_rows
        with self.torch.inference_mode():
            for start in range(0, len(val_rows), 128):
                rows = val_rows[start : start + 128]
                logits = self.batch_logits(rows)
                total += float(self.loss_fn(logits, y[rows])) * len(rows)
                correct += int((logits.argmax(1) == y[rows]).sum())
                n += len(rows)
        return total / n, correct / n

    def epoch(self, epoch: int) -> float:
        """One pass over the training rows in the epoch's order; the mean training loss."""
        torch, config, model = self.torch, self.config, self.model
        torch.manual_seed(config.seed * 100_003 + epoch)  # dropout: same stream on resume
        order = self.train_rows[np.random.default_rng([config.seed, epoch]).permutation(len(self.train_rows))]
        if self.feats is None:
            model.train()
        else:  # frozen encoder: only the head's dropout is live
            model.eval()
            if hasattr(model, "dropout"):
                model.dropout.train()
        total, n = 0.0, 0
        for start in range(0, len(order), config.batch_size):
            rows = order[start : start + config.batch_size]
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.batch_logits(rows), self.y[rows])
            loss.backward()
            self.optimizer.step()
            total += loss.detach().item() * len(rows)
            n += len(rows)
        return total / n

    def snapshot(self) -> dict[str, Any]:
        return {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}

    def resume(self, ckpt: Path | None, fp: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The trainer's state and the best weights so far: from ``ckpt`` when it holds a
        checkpoint of this data and these settings (``fp``; the model and optimizer are loaded),
        else a fresh start."""
        state = {"epoch": 0, "best_val": float("inf"), "best_epoch": 0, "bad_epochs": 0, "history": []}
        if ckpt is None or not (ckpt / "trainer_state.json").is_file():
            return state, None
        saved = json.loads((ckpt / "trainer_state.json").read_text())
        if saved.get("fingerprint") != fp:
            self.say(f"{ckpt}: checkpoint is for other data or settings; starting over")
            return state, None
        from safetensors.torch import load_file

        state = saved["state"]
        self.model.load_state_dict(load_file(str(ckpt / "last.safetensors")), strict=True)
        self.optimizer.load_state_dict(self.torch.load(ckpt / "optimizer.pt", weights_only=True))
        self.say(f"resuming from {ckpt} after epoch {state['epoch']}")
        return state, load_file(str(ckpt / "best.safetensors"))

    def save(self, ckpt: Path, fp: str, state: dict[str, Any], best_state: dict[str, Any] | None) -> None:
        """A checkpoint after an epoch: the last and best weights, the optimizer and the trainer's
        state, each written beside and then moved over the previous one."""
        from safetensors.torch import save_file

        ckpt.mkdir(parents=True, exist_ok=True)
        save_file(self.snapshot(), str(ckpt / "last.safetensors.tmp"))
        save_file(best_state, str(ckpt / "best.safetensors.tmp"))
        self.torch.save(self.optimizer.state_dict(), ckpt / "optimizer.pt.tmp")
        (ckpt / "trainer_state.json.tmp").write_text(json.dumps({"fingerprint": fp, "state": state}))
        for name in ("last.safetensors", "best.safetensors", "optimizer.pt", "trainer_state.json"):
            (ckpt / f"{name}.tmp").replace(ckpt / name)

    def finish(self, best_state: dict[str, Any] | None) -> None:
        """The best epoch's weights, the standardization folded into the layer, frozen, eval mode."""
        model = self.model
        if best_state is not None:
            model.load_state_dict(best_state)
        if self.mean_head:  # W((x - mu) / sd) + b  ==  (W / sd) x + (b - (W / sd) mu)
            with self.torch.no_grad():
                w = model.classifier.weight / self.sd
                model.classifier.bias.sub_(w @ self.mu)
                model.classifier.weight.copy_(w)
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()


def train_level_classifier(
    table: QualityTable,
    *,
    config: TrainConfig | None = None,
    profile: str | None = None,
    strategy: str | None = None,
    classifier: Any = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Any, TrainReport]:
    """Train a :class:`~classifiers.level.LevelClassifier` on ``table``; returns it and its report.

    ``classifier``: an (untrained or previously trained) classifier to start from; by default a
    new one on ``config.backbone``. Its levels must be the table's levels.
    """
    from tqdm.auto import tqdm

    from classifiers.level import LevelClassifier

    config = config or TrainConfig()
    config.validate()
    say = log or (lambda s: None)
    t0 = time.perf_counter()

    keep = np.array([bool(p.strip()) for p in table.prompts])
    if not keep.all():
        say(f"skipping {int((~keep).sum())} empty prompts (the classifier assigns them the best level)")
        table = table.subset(np.flatnonzero(keep))
    labels_all = optimal_labels(table, config.ratio).index
    m = len(table.level_ids)
    if len(set(labels_all.tolist())) < 2:
        raise TrainingDataError(
            f"every prompt has the same optimal level ({table.level_ids[int(labels_all[0])]!r} at ratio "
            f"{config.ratio}): nothing to learn"
        )
    train_rows, val_rows = split_by_prompt(table.prompts, config.val_fraction, config.seed)
    if len(train_rows) < 2:
        raise TrainingDataError(f"only {len(train_rows)} training prompts after the split")

    if classifier is None:
        classifier = LevelClassifier.new(
            table.level_ids,
            backbone=config.backbone,
            profile=profile or table.profile,
            strategy=strategy,
            ratio=config.ratio,
            max_length=config.max_length,
            mode=config.mode,
            pooling=config.pooling,
            seed=config.seed,
        )
    else:
        classifier.check_levels(table.level_ids)
        classifier.meta = replace(classifier.meta, ratio=config.ratio, mode=config.mode)
    fit = _Fit(classifier, list(table.prompts), labels_all, m, train_rows, val_rows, config, say)
    ckpt = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    fp = _fingerprint(table, np.arange(len(table)), config, table.level_ids)
    state, best_state = fit.resume(ckpt, fp)
    resumed = state["epoch"]
    bar = tqdm(total=config.epochs, initial=state["epoch"], desc="training", unit="epoch", disable=not config.progress)
    try:
        while state["epoch"] < config.epochs and state["bad_epochs"] < config.patience:
            epoch = state["epoch"] + 1
            train_loss = fit.epoch(epoch)
            vloss, vacc = fit.val_loss_acc()
            state["history"].append({"epoch": epoch, "train_loss": train_loss, "val_loss": vloss, "val_acc": vacc})
            if vloss < state["best_val"] - 1e-6:
                state["best_val"], state["best_epoch"], state["bad_epochs"] = vloss, epoch, 0
                best_state = fit.snapshot()
            else:
                state["bad_epochs"] += 1
            state["epoch"] = epoch
            bar.update(1)
            bar.set_postfix(train_loss=f"{train_loss:.3f}", val_loss=f"{vloss:.3f}", val_acc=f"{vacc:.3f}")
            say(f"epoch {epoch}: train loss {train_loss:.4f}, validation loss {vloss:.4f}, accuracy {vacc:.3f}")
            if ckpt is not None:
                fit.save(ckpt, fp, state, best_state)
    finally:
        bar.close()
    fit.finish(best_state)

    report = evaluate_classifier(classifier, table.subset(val_rows), ratio=config.ratio)
    report.n_train = len(train_rows)
    report.label_counts = {
        lv: int(c) for lv, c in zip(table.level_ids, np.bincount(labels_all, minlength=m), strict=True)
    }
    report.epochs_run = state["epoch"]
    report.best_epoch = state["best_epoch"]
    report.history = state["history"]
    report.train_s = time.perf_counter() - t0
    report.resumed_from_epoch = resumed
    report.mode = config.mode
    saved = {k: v for k, v in report.to_dict().items() if k != "history"}
    if config.int8_gate and config.pooling == "mean":
        saved["int8"] = _int8_gate(classifier, table, val_rows, config.ratio)
    classifier.meta = replace(classifier.meta, report=saved)
    return classifier, report


def _int8_gate(classifier: Any, table: QualityTable, val_rows: np.ndarray, ratio: float) -> dict[str, Any]:
    """The int8 encoder's gate on the validation split (:func:`classifiers.int8.int8_gate`): the
    router's ``precision = "auto"`` uses int8 only where it passed."""
    from classifiers.int8 import int8_gate

    val = table.subset(val_rows)
    try:
        return int8_gate(
            classifier, list(val.prompts), optimal_labels(val, ratio).index, list(dict.fromkeys(table.prompts))
        )
    except Exception as exc:  # no int8 back end here: the router stays in float32
        return {"passed": False, "error": f"{type(exc).__name__}: {exc}"}


def evaluate_classifier(classifier: Any, table: QualityTable, *, ratio: float | None = None) -> TrainReport:
    """Accuracy, per-class P/R, confusion and routing quality of ``classifier`` on ``table``."""
    classifier.check_levels(table.level_ids)
    ratio = classifier.meta.ratio if ratio is None else ratio
    labels = optimal_labels(table, ratio).index
    predicted = classifier.predict_index(list(table.prompts))
    metrics = classification_metrics(labels, predicted, table.level_ids)
    return TrainReport(
        level_ids=table.level_ids,
        n_train=0,
        n_val=len(table),
        label_counts={
            lv: int(c)
            for lv, c in zip(table.level_ids, np.bincount(labels, minlength=len(table.level_ids)), strict=True)
        },
        accuracy=metrics["accuracy"],
        accuracy_within_1=metrics["accuracy_within_1"],
        per_class=metrics["per_class"],
        confusion=metrics["confusion"],
        routing=routing_quality(table.scores, predicted, labels),
        epochs_run=0,
        best_epoch=0,
        mode=classifier.meta.mode,
    )
