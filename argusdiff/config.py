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

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from argusdiff.errors import ConfigError

ENV_PREFIX = "ARGUSDIFF_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SolverConfig(_Section):
    """Allocation solver settings (``[solver]``)."""

    backend: Literal["auto", "highs", "gurobi"] = "auto"
    time_limit_s: float = Field(5.0, gt=0, description="per-solve time limit")
    switch_tolerance: float = Field(
        0.005, ge=0, le=1, description="relative quality a plan may give up to move fewer workers"
    )
    overprovision: float = Field(1.05, ge=1.0, description="DiffServe over-provisioning factor on demand")


class PredictorConfig(_Section):
    """Demand and affinity predictors (``[predictor]``)."""

    ewma_alpha: float = Field(0.5, gt=0, le=1, description="weight of the newest period in the demand EWMA")
    affinity_window: int = Field(1000, ge=1, description="classified prompts in the affinity histogram H")


# --- One section per subsystem. Each subsystem edits only its own class below. -----------------


class TracesConfig(_Section):
    """Arrival traces, prompt sets, quality tables and the prompt encoder (``[traces]``)."""


class CacheConfig(_Section):
    """The latent cache: index, blob store, similarity thresholds (``[cache]``)."""


class WorkersConfig(_Section):
    """Diffusers workers: device, dtype, model registry overrides (``[workers]``)."""


class ClassifierConfig(_Section):
    """Prompt-level classifier, discriminator and scorers (``[classifier]``)."""


class ReplayConfig(_Section):
    """Trace replay on the simulator (``[replay]``)."""


class ServiceConfig(_Section):
    """REST endpoint, router, control loop and Redis distribution (``[service]``)."""


class Settings(_Section):
    """The whole configuration."""

    profile: str = "sdxl-ac-a100"
    solver: SolverConfig = SolverConfig()
    predictor: PredictorConfig = PredictorConfig()
    traces: TracesConfig = TracesConfig()
    cache: CacheConfig = CacheConfig()
    workers: WorkersConfig = WorkersConfig()
    classifier: ClassifierConfig = ClassifierConfig()
    replay: ReplayConfig = ReplayConfig()
    service: ServiceConfig = ServiceConfig()


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
