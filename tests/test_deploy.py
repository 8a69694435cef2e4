"""deploy/: what can be checked without a Docker engine.

* deploy/production.toml loads with the project's config loader (with the environment the
  services get), its profiles load and the model registry resolves every level's model;
* deploy/compose.yaml is valid against the Compose Specification's JSON schema, has the services
  the deployment needs (two routers, GPU workers, Redis with AOF, Qdrant, an S3-compatible store),
  every argusdiff command line in it parses with the real CLI, every ARGUSDIFF_* variable is a
  real setting, and every host the settings name is a service;
* deploy/Dockerfile has the two targets the compose file builds and copies only files that exist;
* deploy/nginx.conf balances over the two routers.

Building the images and starting the stack are not tested (docs/operations.md says so).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from argusdiff import cli
from argusdiff.config import Settings, load_settings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# The values compose.yaml requires from deploy/.env (see deploy/env.example).
DOTENV = {"ARGUSDIFF_API_KEY": "test-key", "S3_SECRET_KEY": "test-secret"}


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} interpolation ($$ is a literal $)."""

    def one(m: re.Match) -> str:
        name, op, arg = m["name"], m["op"], m["arg"] or ""
        if name in env and env[name] != "":
            return env[name]
        if op == ":?":
            raise KeyError(f"${{{name}}} is required: {arg}")
        return arg if op == ":-" else ""

    text = re.sub(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}", one, value)
    return text.replace("$$", "$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))


def _argusdiff_services(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if str(s.get("image", "")).startswith("argusdiff-")}


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _interpolate(str(v), DOTENV) for k, v in env.items()}


def test_production_config_loads_with_the_services_environment(compose):
    config = DEPLOY / "production.toml"
    bare = load_settings(config, environ={})
    assert bare.service.redis_url and bare.cache.index == "qdrant" and bare.cache.store == "s3"
    for name, service in _argusdiff_services(compose).items():
        env = _environment(service)
        settings = load_settings(config, environ=env)
        assert settings.service.api_keys == ("test-key",), name  # the secret came from the environment
        for key in env:
            if key.startswith("ARGUSDIFF_"):
                section = key.removeprefix("ARGUSDIFF_").lower().split("__")[0]
                assert section in Settings.model_fields, f"{name}: {key} is not a setting (it would be ignored)"


def test_production_profiles_and_models_resolve():
    from argusdiff.profile import load_profile
    from workers.registry import ModelRegistry

    settings = load_settings(DEPLOY / "production.toml", environ={})
    profiles = [load_profile(settings.profile)]
    if settings.service.fallback_profile:
        profiles.append(load_profile(settings.service.fallback_profile))
    registry = ModelRegistry.from_config(settings.workers)
    for profile in profiles:
        for level in profile.levels:
            spec = registry.spec(level.model)  # every level's model is known
            assert spec.source.startswith("/models/"), (level.model, spec.source)  # the mounted weights


def test_compose_file_is_valid_against_the_compose_spec(compose):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text(encoding="utf-8"))
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(compose)]
    assert errors == []


def test_compose_has_the_services_of_the_deployment(compose):
    services = compose["services"]
    routers = [n for n, s in services.items() if s.get("build", {}).get("target") == "router"]
    workers = [n for n, s in services.items() if s.get("build", {}).get("target") == "worker"]
    assert len(routers) == 2 and len(workers) >= 1
    for name in workers:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
    redis = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis  # accepted work survives a Redis restart
    assert services["qdrant"]["image"].startswith("qdrant/qdrant")
    assert "minio" in services["s3"]["image"]
    assert "argusdiff-latents" in services["s3-init"]["command"][0]
    for name, service in services.items():
        for dep in service.get("depends_on") or {}:
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in service.get("volumes") or []:
            source = _interpolate(volume, DOTENV).split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            elif not source.startswith("/"):
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"


def _command_lines(compose: dict) -> list[tuple[str, list[str]]]:
    lines = [(name, list(service["command"])) for name, service in _argusdiff_services(compose).items()]
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines += [("Dockerfile CMD", json.loads(m)) for m in re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)]
    return lines


def test_every_argusdiff_command_line_parses_with_the_real_cli(compose):
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert dockerfile.count('ENTRYPOINT ["argusdiff"]') == 2  # commands are argusdiff's arguments
    lines = _command_lines(compose)
    assert {argv[0] for _, argv in lines} == {"serve", "worker"}
    for where, argv in lines:
        parser = cli.build_parser(argv[0])
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{where}: `argusdiff {' '.join(argv)}` does not parse (exit {exc.code})")
        assert args.config == "/etc/argusdiff/production.toml", where
        if getattr(args, "redis", None):
            assert urlsplit(args.redis).hostname in compose["services"], where
    for name, service in _argusdiff_services(compose).items():
        mounts = {v.split(":")[1] for v in service["volumes"]}
        assert "/etc/argusdiff/production.toml" in mounts, name


def test_every_host_the_settings_name_is_a_service(compose):
    settings = load_settings(DEPLOY / "production.toml", environ={})
    for url in (settings.service.redis_url, settings.cache.qdrant_url, settings.cache.s3_endpoint_url):
        assert urlsplit(url).hostname in compose["services"], url
    nginx = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    upstream = re.findall(r"^\s*server ([\w.-]+):(\d+)", nginx, re.MULTILINE)
    routers = {n for n, s in compose["services"].items() if s.get("build", {}).get("target") == "router"}
    assert {host for host, _ in upstream} == routers
    assert {int(port) for _, port in upstream} == {settings.service.port}
    assert "listen 8080;" in nginx and compose["services"]["lb"]["ports"] == ["${ARGUSDIFF_PORT:-8080}:8080"]


def test_dockerfile_targets_and_copied_paths():
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^FROM \S+ AS ([\w-]+)$", dockerfile, re.MULTILINE))
    assert {"router", "worker"} <= targets
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.MULTILINE):
        for source in sources.split():
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert f"!{source.rstrip('/')}" in ignore, f"COPY {source}: excluded from the build context"
    for pinned in re.findall(r"(torch(?:vision)?==[\d.]+)", dockerfile):
        assert pinned in (ROOT / "constraints.txt").read_text(), f"{pinned} differs from constraints.txt"
