"""The cascade discriminator (DiffServe §3.2): EfficientNet-V2 (timm), real vs generated images.

``confidence(images)`` is the softmax probability of the *real* class; a cascade returns the light
model's image when ``confidence >= threshold`` (``accept``) and defers the query to the heavy model
otherwise. The variant is configurable (``tf_efficientnetv2_b0`` by default; timm's tiny
``test_efficientnet`` in tests). DiffServe fine-tunes an ImageNet-pretrained EfficientNet-V2 (its
artifact, ``src/worker/model.py``: torchvision ``efficientnet_v2_s(weights='IMAGENET1K_V1')`` with
a new two-class head): ``pretrained=`` names local weights of the variant (a ``.safetensors``/``.pth``/``.bin``
file, or a folder holding ``model.safetensors`` or ``pytorch_model.bin``, e.g. a snapshot of
``timm/tf_efficientnetv2_b0.in1k``); the backbone starts from them and the two-class head is new.
Without it the model starts from random weights. Nothing is downloaded from a hub. Models are
trained with :func:`train_discriminator`.

Images may be PIL images, ``uint8`` arrays (H, W, 3), encoded image bytes (PNG/JPEG) or file paths.
Each is converted to RGB, its shorter side resized to ``image_size`` and centre-cropped, then
normalised with the ImageNet mean/std.

A saved discriminator is a directory: ``model.safetensors`` + ``argusdiff_discriminator.json``
(format version, variant, image size, the cascade's light/heavy level ids and profile). Loading it
for another light level raises :class:`ModelMismatchError`.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.loading import MODEL_BUILD_LOCK
from classifiers._io import read_meta, write_dir_atomically, write_json
from classifiers.errors import ClassifierInputError, ModelFormatError, ModelMismatchError, TrainingDataError

__all__ = [
    "IMAGE_SUFFIXES",
    "Discriminator",
    "DiscriminatorMeta",
    "DiscriminatorReport",
    "DiscriminatorTrainConfig",
    "deferral_curve",
    "format_ft_toml",
    "list_images",
    "pretrained_weights_file",
    "roc_auc",
    "train_discriminator",
]

META_NAME = "argusdiff_discriminator.json"
KIND = "discriminator"
FORMAT_VERSION = 1
REAL = 1  # class index of real images; 0 = generated
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class DiscriminatorMeta:
    variant: str = "tf_efficientnetv2_b0"
    image_size: int = 224
    pretrained: str | None = None  # the weights the backbone started from (None: random)
    profile: str | None = None
    light: str | None = None
    heavy: str | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    created: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        d["kind"], d["format_version"] = KIND, FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DiscriminatorMeta:
        kwargs = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("mean", "std"):
            if k in kwargs:
                kwargs[k] = tuple(kwargs[k])
        return cls(**kwargs)


def _torch():
    import torch

    return torch


def _to_pil(image: Any, index: int = 0) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(image, Image.Image):
            return image.convert("RGB")
        if isinstance(image, bytes | bytearray | memoryview):
            with Image.open(io.BytesIO(bytes(image))) as im:
                return im.convert("RGB")
        if isinstance(image, str | Path):
            with Image.open(image) as im:
                return im.convert("RGB")
        arr = np.asarray(image)
    except (UnidentifiedImageError, OSError) as exc:
        raise ClassifierInputError(f"image {index}: cannot be read as an image: {exc}") from None
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
        raise ClassifierInputError(f"image {index}: array of shape {arr.shape} is not (H, W, 3)")
    if arr.dtype != np.uint8:
        if np.issubdtype(arr.dtype, np.floating) and arr.size and arr.min() >= 0 and arr.max() <= 1:
            arr = (arr * 255).round()
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return Image.fromarray(arr[..., :3])


_PRETRAINED_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth")
_PRETRAINED_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def pretrained_weights_file(path: str | Path) -> Path:
    """The weights file of local pretrained weights ``path`` (a file, or a folder holding one of
    ``model.safetensors``, ``pytorch_model.bin``, ``model.pth``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in _PRETRAINED_FILES:
            if (p / name).is_file():
                return p / name
        raise ClassifierInputError(f"pretrained weights {p}: folder holds none of {', '.join(_PRETRAINED_FILES)}")
    if not p.is_file():
        raise ClassifierInputError(f"pretrained weights {p}: no such file or folder")
    if p.suffix.lower() not in _PRETRAINED_SUFFIXES:
        raise ClassifierInputError(f"pretrained weights {p}: expected one of {', '.join(_PRETRAINED_SUFFIXES)}")
    return p


class Discriminator:
    """Binary real-vs-generated image classifier; ``confidence`` = P(real)."""

    def __init__(self, model: Any, meta: DiscriminatorMeta, *, device: str = "cpu") -> None:
        self.model = model.to(device).eval()
        self.meta = meta
        self.device = device

    @classmethod
    def new(
        cls,
        variant: str = "tf_efficientnetv2_b0",
        *,
        image_size: int = 224,
        profile: str | None = None,
        light: str | None = None,
        heavy: str | None = None,
        seed: int = 0,
        device: str = "cpu",
        pretrained: str | Path | None = None,
    ) -> Discriminator:
        """A new two-class model: random weights, or the backbone from local ``pretrained`` weights
        of ``variant`` (an ImageNet checkpoint: its 1000-class head is replaced by a new one)."""
        torch = _torch()
        import timm

        if image_size < 16:
            raise ClassifierInputError(f"image_size must be >= 16, got {image_size}")
        weights = None if pretrained is None else pretrained_weights_file(pretrained)
        torch.manual_seed(seed)
        try:
            with MODEL_BUILD_LOCK:
                if weights is None:
                    model = timm.create_model(variant, pretrained=False, num_classes=2)
                else:
                    model = timm.create_model(
                        variant, pretrained=True, pretrained_cfg_overlay={"file": str(weights)}, num_classes=2
                    )
        except RuntimeError as exc:  # timm: "Unknown model (...)", or weights of another architecture
            what = "" if weights is None else f" with pretrained weights {weights}"
            raise ClassifierInputError(f"discriminator variant {variant!r}{what}: {exc}") from None
        meta = DiscriminatorMeta(
            variant=variant,
            image_size=image_size,
            pretrained=None if weights is None else str(weights),
            profile=profile,
            light=light,
            heavy=heavy,
        )
        return cls(model, meta, device=device)

    @classmethod
    def load(
        cls, path: str | Path, *, light: str | None = None, profile: str | None = None, device: str = "cpu"
    ) -> Discriminator:
        """Load a saved discriminator; ``light``/``profile`` must match what it was trained for."""
        import timm
        from safetensors.torch import load_file

        p = Path(path)
        meta = DiscriminatorMeta.from_json(read_meta(p, META_NAME, KIND, FORMAT_VERSION))
        if light is not None and meta.light is not None and light != meta.light:
            raise ModelMismatchError(f"{p}: discriminator was trained on images of level {meta.light!r}, not {light!r}")
        if profile is not None and meta.profile is not None and profile != meta.profile:
            raise ModelMismatchError(f"{p}: discriminator was trained for profile {meta.profile!r}, not {profile!r}")
        weights = p / "model.safetensors"
        if not weights.is_file():
            raise ModelFormatError(f"{p}: missing model.safetensors")
        with MODEL_BUILD_LOCK:
            model = timm.create_model(meta.variant, pretrained=False, num_classes=2)
        try:
            model.load_state_dict(load_file(str(weights)), strict=True)
        except RuntimeError as exc:
            raise ModelFormatError(f"{p}: weights do not fit variant {meta.variant!r}: {exc}") from None
        return cls(model, meta, device=device)

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        def write(tmp: Path) -> None:
            state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
            save_file(state, str(tmp / "model.safetensors"))
            meta = self.meta
            if not meta.created:
                meta = replace(meta, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            write_json(tmp / META_NAME, meta.to_json())

        return write_dir_atomically(path, write)

    # ---- inference -----------------------------------------------------------------------

    def preprocess(self, images: Sequence[Any]) -> Any:
        """A float tensor (N, 3, S, S) of normalised images."""
        torch = _torch()
        from PIL import Image

        s = self.meta.image_size
        out = np.empty((len(images), 3, s, s), dtype=np.float32)
        mean = np.asarray(self.meta.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.meta.std, dtype=np.float32)[:, None, None]
        for i, image in enumerate(images):
            im = _to_pil(image, i)
            w, h = im.size
            scale = s / min(w, h)
            nw, nh = max(s, round(w * scale)), max(s, round(h * scale))
            im = im.resize((nw, nh), Image.Resampling.BILINEAR)
            left, top = (nw - s) // 2, (nh - s) // 2
            im = im.crop((left, top, left + s, top + s))
            arr = np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 255.0
            out[i] = (arr - mean) / std
        return torch.from_numpy(out)

    def logits_of(self, batch: Any) -> Any:
        return self.model(batch.to(self.device))

    def confidence(self, images: Sequence[Any], *, batch_size: int = 32) -> np.ndarray:
        """P(real) per image, shape (n,)."""
        torch = _torch()
        if not isinstance(images, Sequence) or isinstance(images, str | bytes):
            images = [images]
        out = []
        with torch.inference_mode():
            for start in range(0, len(images), batch_size):
                x = self.preprocess(images[start : start + batch_size])
                out.append(torch.softmax(self.logits_of(x).float(), dim=1)[:, REAL].cpu().numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)

    def accept(self, image: Any, threshold: float) -> bool:
        """True when the light model's ``image`` is good enough: confidence ≥ ``threshold``."""
        if not 0.0 <= threshold <= 1.0:
            raise ClassifierInputError(f"threshold must be in [0, 1], got {threshold}")
        return bool(self.confidence([image])[0] >= threshold)


# ---- metrics -------------------------------------------------------------------------------


def roc_auc(scores_pos: Sequence[float], scores_neg: Sequence[float]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count half."""
    from scipy.stats import rankdata

    pos, neg = np.asarray(scores_pos, dtype=np.float64), np.asarray(scores_neg, dtype=np.float64)
    if len(pos) == 0 or len(neg) == 0:
        raise TrainingDataError("ROC-AUC needs at least one positive and one negative example")
    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def deferral_curve(
    light_confidence: Sequence[float], thresholds: Sequence[float] | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """f(t): the share of light-model images with confidence < t (deferred to the heavy model),
    on ``thresholds`` (default: DiffServe's 201-point grid 0, 0.005, ..., 1). Non-decreasing in t."""
    conf = np.sort(np.asarray(light_confidence, dtype=np.float64))
    if len(conf) == 0:
        raise TrainingDataError("f(t) needs at least one light-model confidence")
    ts = np.round(np.linspace(0.0, 1.0, 201), 6) if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    f = np.searchsorted(conf, ts, side="left") / len(conf)
    return tuple(float(t) for t in ts), tuple(round(float(x), 6) for x in f)


def format_ft_toml(thresholds: Sequence[float], deferral: Sequence[float], *, source: str = "") -> str:
    """The ``thresholds``/``deferral`` arrays in the profile's ``[cascade]`` TOML format."""

    def rows(values: Sequence[float]) -> str:
        items = [f"{v:g}" for v in values]
        return "\n".join("  " + ", ".join(items[i : i + 10]) + "," for i in range(0, len(items), 10))

    head = f"# {source}\n" if source else ""
    return f"{head}thresholds = [\n{rows(thresholds)}\n]\ndeferral = [\n{rows(deferral)}\n]\n"


# ---- training ------------------------------------------------------------------------------


def list_images(folder: str | Path) -> list[Path]:
    p = Path(folder)
    if not p.is_dir():
        raise TrainingDataError(f"{p}: not a folder of images")
    files = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
    if not files:
        raise TrainingDataError(f"{p}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


@dataclass(frozen=True)
class DiscriminatorTrainConfig:
    variant: str = "tf_efficientnetv2_b0"
    image_size: int = 224
    epochs: int = 10
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    patience: int = 3
    seed: int = 0
    flip: bool = True  # random horizontal flips while training
    progress: bool = True
    pretrained: str | None = None  # local ImageNet weights of the variant to start from (None: random)


@dataclass
class DiscriminatorReport:
    n_train: int
    n_val: int
    roc_auc: float
    accuracy: float  # at threshold 0.5
    thresholds: tuple[float, ...]
    deferral: tuple[float, ...]
    epochs_run: int
    best_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    train_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["thresholds"], d["deferral"] = list(self.thresholds), list(self.deferral)
        return d

    def f(self, t: float) -> float:
        return float(np.interp(t, self.thresholds, self.deferral))

    def format(self) -> str:
        return (
            f"train {self.n_train} images, validation {self.n_val}; {self.epochs_run} epochs "
            f"(best {self.best_epoch}) in {self.train_s:.1f} s\n"
            f"validation ROC-AUC {self.roc_auc:.3f}, accuracy at t=0.5 {self.accuracy:.3f}\n"
            f"deferral f(t) of generated images: f(0.25)={self.f(0.25):.3f} f(0.5)={self.f(0.5):.3f} "
            f"f(0.75)={self.f(0.75):.3f}"
        )


def _split(n: int, val_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    n_val = min(max(1, round(n * val_fraction)), n - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def _labelled_splits(disc: Discriminator, real_images: Sequence[Any], generated_images: Sequence[Any], config):
    """``(x_train, y_train, x_val, y_val)``: each class split into train/validation on its own
    (``config.val_fraction``, seeded), preprocessed; real images are class 1, generated class 0."""
    torch = _torch()
    rng = np.random.default_rng(config.seed)
    r_tr, r_va = _split(len(real_images), config.val_fraction, rng)
    g_tr, g_va = _split(len(generated_images), config.val_fraction, rng)
    x_real = disc.preprocess(list(real_images))
    x_gen = disc.preprocess(list(generated_images))
    x_tr = torch.cat([x_real[r_tr], x_gen[g_tr]])
    y_tr = torch.cat([torch.ones(len(r_tr), dtype=torch.long), torch.zeros(len(g_tr), dtype=torch.long)])
    x_va = torch.cat([x_real[r_va], x_gen[g_va]])
    y_va = torch.cat([torch.ones(len(r_va), dtype=torch.long), torch.zeros(len(g_va), dtype=torch.long)])
    return x_tr, y_tr, x_va, y_va


def _train_epoch(model: Any, opt: Any, loss_fn: Any, x_tr: Any, y_tr: Any, config, epoch: int) -> float:
    """One pass over the training images in the epoch's seeded order (random horizontal flips with
    ``config.flip``); the mean training loss."""
    torch = _torch()
    torch.manual_seed(config.seed * 100_003 + epoch)
    model.train()
    order = torch.as_tensor(np.random.default_rng([config.seed, epoch]).permutation(len(y_tr)))
    total = 0.0
    for start in range(0, len(order), config.batch_size):
        idx = order[start : start + config.batch_size]
        xb = x_tr[idx]
        if config.flip:
            flip = torch.rand(len(idx)) < 0.5
            xb = torch.where(flip[:, None, None, None], xb.flip(-1), xb)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), y_tr[idx])
        loss.backward()
        opt.step()
        total += loss.detach().item() * len(idx)
    return total / len(order)


def train_discriminator(
    real_images: Sequence[Any],
    generated_images: Sequence[Any],
    *,
    config: DiscriminatorTrainConfig | None = None,
    profile: str | None = None,
    light: str | None = None,
    heavy: str | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Discriminator, DiscriminatorReport]:
    """Train a discriminator on real (class 1) vs generated (class 0) images.

    Each class is split into train/validation separately; the loss is class-weighted; training
    stops early when the validation loss stops improving and the best epoch is kept. The report
    gives the validation ROC-AUC and f(t) computed on the validation *generated* images.
    """
    torch = _torch()
    from tqdm.auto import tqdm

    config = config or DiscriminatorTrainConfig()
    say = log or (lambda s: None)
    if len(real_images) < 2 or len(generated_images) < 2:
        raise TrainingDataError(
            f"need at least 2 real and 2 generated images, got {len(real_images)} and {len(generated_images)}"
        )
    if not 0.0 < config.val_fraction < 1.0:
        raise TrainingDataError(f"val_fraction must be in (0, 1), got {config.val_fraction}")
    t0 = time.perf_counter()
    disc = Discriminator.new(
        config.variant,
        image_size=config.image_size,
        profile=profile,
        light=light,
        heavy=heavy,
        seed=config.seed,
        pretrained=config.pretrained,
    )
    say(f"preprocessing {len(real_images) + len(generated_images)} images at {config.image_size} px")
    x_tr, y_tr, x_va, y_va = _labelled_splits(disc, real_images, generated_images, config)
    counts = torch.bincount(y_tr, minlength=2).float()
    loss_fn = torch.nn.CrossEntropyLoss(weight=len(y_tr) / (2 * counts))
    model = disc.model
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    def val_pass() -> tuple[float, np.ndarray]:
        model.eval()
        with torch.inference_mode():
            logits = torch.cat([model(x_va[i : i + 64]) for i in range(0, len(x_va), 64)])
            return float(loss_fn(logits, y_va)), torch.softmax(logits, 1)[:, REAL].numpy()

    best_val, best_epoch, bad, best_state, history = float("inf"), 0, 0, None, []
    epoch = 0
    for epoch in tqdm(range(1, config.epochs + 1), desc="training", unit="epoch", disable=not config.progress):
        train_loss = _train_epoch(model, opt, loss_fn, x_tr, y_tr, config, epoch)
        vloss, _ = val_pass()
        history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": vloss})
        say(f"epoch {epoch}: train loss {train_loss:.4f}, validation loss {vloss:.4f}")
        if vloss < best_val - 1e-6:
            best_val, best_epoch, bad = vloss, epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad >= config.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    _, conf = val_pass()
    y = y_va.numpy()
    ts, fs = deferral_curve(conf[y == 0])
    report = DiscriminatorReport(
        n_train=len(y_tr),
        n_val=len(y_va),
        roc_auc=roc_auc(conf[y == 1], conf[y == 0]),
        accuracy=float(np.mean((conf >= 0.5) == (y == 1))),
        thresholds=ts,
        deferral=fs,
        epochs_run=epoch,
        best_epoch=best_epoch,
        history=history,
        train_s=time.perf_counter() - t0,
    )
    disc.meta = replace(
        disc.meta, report={"roc_auc": report.roc_auc, "accuracy": report.accuracy, "n_train": report.n_train}
    )
    model.eval()
    return disc, report
