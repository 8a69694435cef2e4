"""The model registry: what a level's ``model`` name means and how its pipeline is loaded.

A :class:`ModelSpec` names a diffusers model (hub id, local folder, or one single-file checkpoint),
its pipeline family (:data:`FAMILY_PIPELINES`: ``sd`` for SD-1.x/2.x-style UNets with one CLIP
text encoder, ``sdxl`` for SD-XL-style with two, ``flux`` for FLUX.1-style DiTs
(``FluxPipeline``), ``sd3`` for SD3/SD3.5 DiTs (``StableDiffusion3Pipeline``)),
the scheduler to run (class name + config overrides; ``None`` keeps the model's own), the default
number of steps, guidance scale and resolution. :class:`ModelRegistry` loads pipelines with
``from_pretrained`` (on a GPU: float16, or the spec's ``gpu_dtype`` such as bfloat16 for FLUX.1 and SD3.5, whose
model cards load them in bfloat16; float32 on CPU; an explicit registry dtype wins), keeps the loaded ones
per worker (least recently used evicted beyond ``max_loaded``) and records every load time.

Sources, and how each loads:

* a hub id (``stabilityai/stable-diffusion-xl-base-1.0``): ``from_pretrained``, with the spec's
  ``variant`` (``fp16`` weight files) when loading in float16;
* a local folder in the diffusers layout (``model_index.json``): ``from_pretrained``, with the
  spec's ``variant`` whenever the folder holds weight files of that variant (a hub snapshot
  downloaded with ``variant="fp16"`` has only those);
* one checkpoint file (``.safetensors``, ``.ckpt``, ...; the original Stable Diffusion layout):
  ``from_single_file``, with the component configs of the spec's ``config`` folder or hub id (a
  local folder keeps it offline; without one diffusers infers the model and fetches its configs).

The weights' dtype goes to diffusers under the keyword the installed version understands
(:func:`dtype_keyword`): ``dtype`` since diffusers 0.40, ``torch_dtype`` before it. diffusers
before 0.40 silently ignores ``dtype=`` and loads float32 (SD-XL at twice the memory).

Sources starting with ``demo:`` are tiny random-weight pipelines built from configs by
:mod:`workers.demo` into ``models_dir`` on first use, then loaded back through the same
``from_pretrained`` path as a real model. They check the pipeline, not image quality.

No torch at import time: the loading code imports torch and diffusers inside functions.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from workers.errors import ModelLoadError, UnknownModel

__all__ = [
    "FAMILY_PIPELINES",
    "FLOW_FAMILIES",
    "SHIPPED_MODELS",
    "LoadedModel",
    "ModelRegistry",
    "ModelSpec",
    "default_models_dir",
    "dtype_keyword",
    "is_single_file",
    "resolve_device",
]

Family = Literal["sd", "sdxl", "flux", "sd3"]

#: The diffusers text-to-image pipeline class of each family.
FAMILY_PIPELINES: dict[str, str] = {
    "sd": "StableDiffusionPipeline",
    "sdxl": "StableDiffusionXLPipeline",
    "flux": "FluxPipeline",
    "sd3": "StableDiffusion3Pipeline",
}
#: Families whose denoiser is a transformer (``pipe.transformer``) sampled by flow matching.
FLOW_FAMILIES = frozenset({"flux", "sd3"})

#: Suffixes of single-file checkpoints (loaded with ``from_single_file``).
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")

#: Schedulers that are first-order and deterministic: a trajectory captured after K steps can be
#: resumed exactly (approximate caching). Ancestral/SDE and multistep (history) schedulers cannot.
#: Flow matching's Euler sampler (FLUX.1, SD3) is one, unless configured with stochastic sampling.
AC_SCHEDULERS = frozenset({"DDIMScheduler", "EulerDiscreteScheduler", "FlowMatchEulerDiscreteScheduler"})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    source: str  # hub id, local folder, single checkpoint file, or "demo:<kind>" (workers.demo.DEMO_MODELS)
    family: Family
    scheduler: str | None = None  # diffusers scheduler class name; None keeps the model's own
    scheduler_kwargs: Mapping[str, Any] = field(default_factory=dict)
    steps: int = 50
    guidance: float = 7.5
    height: int = 512
    width: int = 512
    variant: str | None = None  # e.g. "fp16" weight files (hub: loading in fp16; local folder: when present)
    unet_weights: str | None = None  # "<hub repo>/<file>.safetensors" replacing the UNet (distilled models)
    config: str | None = None  # single-file checkpoints: diffusers folder or hub id with the component configs
    preview_decoder: str | None = None  # partial images: TAESD-style id/folder, "vae"; None: by family
    gpu_dtype: str | None = None  # dtype on a GPU when the registry's dtype is "auto" (None: float16)
    text_length: int | None = None  # T5 tokens per prompt (flux/sd3 max_sequence_length; None: the pipeline's)
    description: str = ""

    def with_overrides(self, overrides: Mapping[str, Any]) -> ModelSpec:
        allowed = set(self.__dataclass_fields__) - {"name"}
        unknown = set(overrides) - allowed
        if unknown:
            raise UnknownModel(
                f"model {self.name!r}: unknown override field(s) {', '.join(sorted(unknown))} "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
        return replace(self, **dict(overrides))


def _spec(**kw: Any) -> ModelSpec:
    return ModelSpec(**kw)


#: Registry entries for the models the shipped profiles reference. Scheduler choices follow the
#: model cards; AC levels need DDIM or Euler (see :data:`AC_SCHEDULERS`).
SHIPPED_MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _spec(
            name="sdxl-base-1.0",
            source="stabilityai/stable-diffusion-xl-base-1.0",
            family="sdxl",
            scheduler="EulerDiscreteScheduler",
            steps=50,
            guidance=5.0,
            height=768,
            width=768,
            variant="fp16",
            description="SD-XL base 1.0 at 768 px (ARGUS §5.1), Euler: resumable for approximate caching",
        ),
        _spec(
            name="sdxl-lightning-2step",
            source="stabilityai/stable-diffusion-xl-base-1.0",
            family="sdxl",
            scheduler="EulerDiscreteScheduler",
            scheduler_kwargs={"timestep_spacing": "trailing"},
            steps=2,
            guidance=0.0,
            height=1024,
            width=1024,
            variant="fp16",
            unet_weights="ByteDance/SDXL-Lightning/sdxl_lightning_2step_unet.safetensors",
            description="SDXL-Lightning 2-step UNet on SD-XL base, Euler with trailing timesteps, no CFG",
        ),
        _spec(
            name="sd-turbo",
            source="stabilityai/sd-turbo",
            family="sd",
            scheduler="EulerDiscreteScheduler",
            scheduler_kwargs={"timestep_spacing": "trailing"},
            steps=1,
            guidance=0.0,
            variant="fp16",
            description="SD-Turbo (adversarial distillation of SD-2.1): one step, no CFG",
        ),
        _spec(
            name="sdxs-512",
            source="IDKiro/sdxs-512-0.9",
            family="sd",
            scheduler=None,
            steps=1,
            guidance=0.0,
            description="SDXS-512: one step, no CFG",
        ),
        _spec(
            name="sd-1.5",
            source="stable-diffusion-v1-5/stable-diffusion-v1-5",
            family="sd",
            scheduler="DDIMScheduler",
            steps=50,
            guidance=7.5,
            variant="fp16",
            description="Stable Diffusion 1.5",
        ),
        _spec(
            name="sd-1.4",
            source="CompVis/stable-diffusion-v1-4",
            family="sd",
            scheduler="DDIMScheduler",
            steps=50,
            guidance=7.5,
            variant="fp16",
            description="Stable Diffusion 1.4",
        ),
        _spec(
            name="sd-2.0",
            source="stabilityai/stable-diffusion-2",
            family="sd",
            scheduler="DDIMScheduler",
            steps=50,
            guidance=7.5,
            height=768,
            width=768,
            variant="fp16",
            description="Stable Diffusion 2.0 (768 px, v-prediction)",
        ),
        _spec(
            name="small-sd",
            source="segmind/small-sd",
            family="sd",
            scheduler="DDIMScheduler",
            steps=50,
            guidance=7.5,
            description="Segmind Small-SD (block-removed distillation of SD-1.5)",
        ),
        _spec(
            name="tiny-sd",
            source="segmind/tiny-sd",
            family="sd",
            scheduler="DDIMScheduler",
            steps=50,
            guidance=7.5,
            description="Segmind Tiny-SD (block-removed distillation of SD-1.5)",
        ),
        # DiT / flow-matching families. Steps, guidance and resolution follow the model cards'
        # examples (FLUX.1 [dev]: 50 steps, guidance 3.5, 1024 px, max_sequence_length 512;
        # [schnell]: 4 steps, guidance 0, max_sequence_length 256; SD3.5 Large: 28 steps, guidance
        # 3.5; Medium: 40 steps, guidance 4.5; Large-Turbo: 4 steps, guidance 0), all in bfloat16.
        _spec(
            name="flux.1-dev",
            source="black-forest-labs/FLUX.1-dev",
            family="flux",
            scheduler=None,  # its own FlowMatchEulerDiscreteScheduler (dynamic shift): resumable
            steps=50,
            guidance=3.5,
            height=1024,
            width=1024,
            gpu_dtype="bfloat16",
            text_length=512,
            preview_decoder="madebyollin/taef1",
            description="FLUX.1 [dev] (guidance-distilled, 12B MM-DiT), flow-matching Euler",
        ),
        _spec(
            name="flux.1-schnell",
            source="black-forest-labs/FLUX.1-schnell",
            family="flux",
            scheduler=None,
            steps=4,
            guidance=0.0,
            height=1024,
            width=1024,
            gpu_dtype="bfloat16",
            text_length=256,
            preview_decoder="madebyollin/taef1",
            description="FLUX.1 [schnell] (timestep-distilled, 1-4 steps, no guidance)",
        ),
        _spec(
            name="sd3.5-large",
            source="stabilityai/stable-diffusion-3.5-large",
            family="sd3",
            scheduler=None,
            steps=28,
            guidance=3.5,
            height=1024,
            width=1024,
            gpu_dtype="bfloat16",
            preview_decoder="madebyollin/taesd3",
            description="Stable Diffusion 3.5 Large (8.1B MM-DiT), flow-matching Euler",
        ),
        _spec(
            name="sd3.5-medium",
            source="stabilityai/stable-diffusion-3.5-medium",
            family="sd3",
            scheduler=None,
            steps=40,
            guidance=4.5,
            height=1024,
            width=1024,
            gpu_dtype="bfloat16",
            preview_decoder="madebyollin/taesd3",
            description="Stable Diffusion 3.5 Medium (2.5B MMDiT-X), flow-matching Euler",
        ),
        _spec(
            name="sd3.5-large-turbo",
            source="stabilityai/stable-diffusion-3.5-large-turbo",
            family="sd3",
            scheduler=None,
            steps=4,
            guidance=0.0,
            height=1024,
            width=1024,
            gpu_dtype="bfloat16",
            preview_decoder="madebyollin/taesd3",
            description="Stable Diffusion 3.5 Large Turbo (ADD-distilled, 4 steps, no guidance)",
        ),
        # Tiny random-weight pipelines for this CPU machine and CI: a pipeline check, not quality.
        _spec(
            name="demo-tiny-sdxl",
            source="demo:tiny-sdxl",
            family="sdxl",
            scheduler="EulerDiscreteScheduler",
            steps=8,
            guidance=5.0,
            height=64,
            width=64,
            description="tiny SD-XL-shaped pipeline, random weights (pipeline check only)",
        ),
        _spec(
            name="demo-tiny-sd",
            source="demo:tiny-sd",
            family="sd",
            scheduler="DDIMScheduler",
            steps=8,
            guidance=7.5,
            height=64,
            width=64,
            description="tiny SD-1.x-shaped pipeline, random weights (pipeline check only)",
        ),
        _spec(
            name="demo-tiny-sd-1step",
            source="demo:tiny-sd",
            family="sd",
            scheduler="EulerDiscreteScheduler",
            scheduler_kwargs={"timestep_spacing": "trailing"},
            steps=1,
            guidance=0.0,
            height=64,
            width=64,
            description="tiny one-step light level (SD-Turbo-style: 1 step, no CFG), random weights",
        ),
        _spec(
            name="demo-tiny-flux",
            source="demo:tiny-flux",
            family="flux",
            steps=8,
            guidance=3.5,
            height=64,
            width=64,
            gpu_dtype="bfloat16",
            text_length=32,
            description="tiny FLUX.1 [dev]-shaped pipeline (guidance embedding, dynamic shift), random weights",
        ),
        _spec(
            name="demo-tiny-flux-schnell",
            source="demo:tiny-flux-schnell",
            family="flux",
            steps=2,
            guidance=0.0,
            height=64,
            width=64,
            gpu_dtype="bfloat16",
            text_length=32,
            description="tiny FLUX.1 [schnell]-shaped pipeline (fewer blocks, no guidance, 2 steps), random weights",
        ),
        _spec(
            name="demo-tiny-sd3",
            source="demo:tiny-sd3",
            family="sd3",
            steps=8,
            guidance=4.5,
            height=64,
            width=64,
            gpu_dtype="bfloat16",
            text_length=32,
            description="tiny SD3-shaped pipeline (three text encoders, patch size 2, shift 3), random weights",
        ),
    )
}


def default_models_dir() -> Path:
    env = os.environ.get("ARGUSDIFF_MODELS_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "argusdiff" / "models"


def dtype_keyword(version: str | None = None) -> str:
    """The ``from_pretrained``/``from_single_file`` keyword for the weights' dtype in diffusers
    ``version`` (default: the installed one): ``dtype`` since 0.40 (which deprecates
    ``torch_dtype``), ``torch_dtype`` before (where ``dtype`` is silently ignored)."""
    if version is None:
        import diffusers

        version = diffusers.__version__
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return "dtype" if (major, minor) >= (0, 40) else "torch_dtype"


def is_single_file(source: str) -> bool:
    """True when ``source`` is one checkpoint file (local, or an https URL to one)."""
    if source.startswith(("https://", "http://")):
        return source.lower().endswith(SINGLE_FILE_SUFFIXES)
    path = Path(source).expanduser()
    return path.suffix.lower() in SINGLE_FILE_SUFFIXES and path.is_file()


def _folder_has_variant(folder: Path, variant: str) -> bool:
    """True when a diffusers folder holds weight files of ``variant`` (``unet/*.fp16.safetensors``)."""
    names = tuple(f".{variant}{suffix}" for suffix in _WEIGHT_SUFFIXES)
    return any(f.name.endswith(names) for f in folder.glob("*/*"))


def resolve_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    pipe: Any  # a diffusers pipeline
    device: str
    dtype: str
    load_s: float
    extras: dict[str, Any] = field(default_factory=dict)  # derived pipelines sharing the components
    # A pipeline's scheduler keeps per-run state: runs on one loaded model are serialised, so
    # workers sharing a registry in one process never interleave on it.
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)


class ModelRegistry:
    """Model specs by name plus this worker's loaded pipelines.

    ``overrides`` maps a model name to field overrides (e.g. a local ``source`` folder) or to a
    full new entry (then ``source`` and ``family`` are required).
    """

    def __init__(
        self,
        specs: Mapping[str, ModelSpec] | Iterable[ModelSpec] | None = None,
        *,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        device: str = "auto",
        dtype: str = "auto",
        models_dir: str | Path | None = None,
        max_loaded: int = 2,
    ) -> None:
        if specs is None:
            specs = SHIPPED_MODELS
        items = specs.values() if isinstance(specs, Mapping) else specs
        self._specs: dict[str, ModelSpec] = {s.name: s for s in items}
        for name, over in (overrides or {}).items():
            if name in self._specs:
                self._specs[name] = self._specs[name].with_overrides(over)
            else:
                missing = {"source", "family"} - set(over)
                if missing:
                    raise UnknownModel(
                        f"model {name!r} is not in the registry: a new entry needs {', '.join(sorted(missing))}"
                    )
                self._specs[name] = ModelSpec(name=name, **dict(over))
        self.device_setting = device
        self.dtype_setting = dtype
        self.models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
        if max_loaded < 1:
            raise ValueError("max_loaded must be >= 1")
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        # _lock guards the loaded set (held for moments: a heartbeat reads it while a model loads);
        # _load_lock makes loads one at a time
        self._lock = threading.RLock()
        self._load_lock = threading.RLock()
        self.load_times: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: Any) -> ModelRegistry:
        """From a :class:`argusdiff.config.WorkersConfig`."""
        return cls(
            overrides=dict(config.models),
            device=config.device,
            dtype=config.dtype,
            models_dir=config.models_dir,
            max_loaded=config.max_loaded_models,
        )

    # -- specs -------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._specs))

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def spec(self, name: str) -> ModelSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownModel(
                f"unknown model {name!r}: not in the model registry (known: {', '.join(self.names)}); "
                "add it under [workers.models] with a source and family"
            ) from None

    def register(self, spec: ModelSpec) -> None:
        self._specs[spec.name] = spec

    # -- loading -----------------------------------------------------------------------------
    @property
    def device(self) -> str:
        return resolve_device(self.device_setting)

    def torch_dtype_name(self, spec: ModelSpec | None = None) -> str:
        """The weights' dtype: the registry's setting, else on a GPU the spec's ``gpu_dtype``
        (float16 without one), else float32."""
        if self.dtype_setting != "auto":
            return self.dtype_setting
        if not self.device.startswith("cuda"):
            return "float32"
        return (spec.gpu_dtype if spec is not None else None) or "float16"

    def loaded(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._loaded)

    def unload(self, name: str) -> None:
        with self._lock:
            self._loaded.pop(name, None)

    def local_path(self, spec: ModelSpec) -> str:
        """The ``from_pretrained`` (or ``from_single_file``) argument of ``spec``: a hub id, or a
        local path with ``~`` expanded (building a demo model on first use)."""
        if spec.source.startswith("demo:"):
            from workers.demo import ensure_demo_model

            return str(ensure_demo_model(spec.source.removeprefix("demo:"), self.models_dir))
        if spec.source.startswith("~"):
            return str(Path(spec.source).expanduser())
        return spec.source

    def load(self, name: str) -> LoadedModel:
        """The loaded pipeline of ``name`` (cached; the first call measures the load time)."""
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return self._loaded[name]
        with self._load_lock:
            with self._lock:  # loaded by another thread while this one waited
                if name in self._loaded:
                    self._loaded.move_to_end(name)
                    return self._loaded[name]
            spec = self.spec(name)
            t0 = time.perf_counter()
            from argusdiff.loading import MODEL_BUILD_LOCK

            with MODEL_BUILD_LOCK:
                pipe = self._load_pipeline(spec)
            load_s = time.perf_counter() - t0
            loaded = LoadedModel(
                spec=spec, pipe=pipe, device=self.device, dtype=self.torch_dtype_name(spec), load_s=load_s
            )
            with self._lock:
                self._loaded[name] = loaded
                self.load_times[name] = load_s
                while len(self._loaded) > self.max_loaded:
                    self._loaded.popitem(last=False)
            return loaded

    def _load_pipeline(self, spec: ModelSpec) -> Any:
        import diffusers
        import torch
        import transformers

        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
        dtype_name = self.torch_dtype_name(spec)
        dtype = getattr(torch, dtype_name)
        device = self.device
        if spec.family not in FAMILY_PIPELINES:
            raise ModelLoadError(
                f"model {spec.name!r}: field 'family' must be one of {', '.join(FAMILY_PIPELINES)}, got {spec.family!r}"
            )
        pipe_cls = getattr(diffusers, FAMILY_PIPELINES[spec.family])
        path = self.local_path(spec)
        kwargs: dict[str, Any] = {dtype_keyword(diffusers.__version__): dtype}
        if spec.family == "sd":
            kwargs["safety_checker"] = None
            kwargs["requires_safety_checker"] = False
        single = is_single_file(path)
        if single:
            if spec.config is not None:
                kwargs["config"] = self._config_path(spec)
            if os.environ.get("HF_HUB_OFFLINE"):
                kwargs["local_files_only"] = True
        elif spec.variant and (
            _folder_has_variant(Path(path), spec.variant) if Path(path).is_dir() else dtype_name == "float16"
        ):
            kwargs["variant"] = spec.variant
        try:
            pipe = pipe_cls.from_single_file(path, **kwargs) if single else pipe_cls.from_pretrained(path, **kwargs)
        except Exception as exc:  # any failure to load is this model's load error, named
            hint = ""
            if single and spec.config is None:
                hint = " (a single-file checkpoint needs component configs: set `config` to a local diffusers folder)"
            elif os.environ.get("HF_HUB_OFFLINE"):
                hint = " (offline: HF_HUB_OFFLINE is set; point [workers.models] at a local folder)"
            what = "" if isinstance(exc, OSError | ValueError) else f"{type(exc).__name__}: "
            raise ModelLoadError(f"model {spec.name!r}: cannot load {path!r}: {what}{exc}{hint}") from None
        if spec.unet_weights:
            self._replace_unet(pipe, spec)
        if spec.scheduler is not None:
            sched_cls = getattr(diffusers, spec.scheduler, None)
            if sched_cls is None:
                raise ModelLoadError(f"model {spec.name!r}: field 'scheduler': diffusers has no {spec.scheduler!r}")
            pipe.scheduler = sched_cls.from_config(pipe.scheduler.config, **dict(spec.scheduler_kwargs))
        pipe = pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def _config_path(self, spec: ModelSpec) -> str:
        """``spec.config`` as ``from_single_file`` takes it (a ``demo:`` model's folder works too)."""
        assert spec.config is not None
        if spec.config.startswith("demo:"):
            return self.local_path(replace(spec, source=spec.config))
        return str(Path(spec.config).expanduser()) if spec.config.startswith("~") else spec.config

    def _replace_unet(self, pipe: Any, spec: ModelSpec) -> None:
        from huggingface_hub import hf_hub_download
        from safetensors.torch import load_file

        assert spec.unet_weights is not None
        if Path(spec.unet_weights).is_file():
            file = spec.unet_weights
        else:
            repo, _, filename = spec.unet_weights.rpartition("/")
            try:
                file = hf_hub_download(repo, filename)
            except Exception as exc:
                raise ModelLoadError(
                    f"model {spec.name!r}: cannot fetch UNet weights {spec.unet_weights!r}: {exc}"
                ) from None
        state = load_file(file, device="cpu")
        pipe.unet.load_state_dict(state)
