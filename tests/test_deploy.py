"""deploy/: what can be checked without a Docker engine.

* deploy/production.toml loads with the project's config loader (with the environment the
  services get), its profiles load and the model registry resolves every level's model;
* deploy/compose.yaml is valid against the Compose Specification's JSON schema, has the services
  the deployment needs (two routers, GPU workers, Redis with AOF, Qdrant, an S3-compatible store),
  every argusdiff command line in it parses with the real CLI, every ARGUSDIFF_* variable is a
  real setting, and every host the settings name is a service;
* deploy/Dockerfile has the two targets the compose file builds and copies only files that exist;
* deploy/nginx.conf balances over the two routers;
* both images check at build time that sqlite3, ssl, ctypes and argusdiff import (the worker stage
  installs the libraries its copied Python links to); every service has a health check on the
  right port (a worker's: its own heartbeat key); docs/operations.md's walk-through uses the load
  balancer's port and the Bearer key.

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


def _stages(dockerfile: str) -> dict[str, str]:
    """Each named stage of the Dockerfile -> its text."""
    out: dict[str, str] = {}
    for block in re.split(r"^(?=FROM )", dockerfile, flags=re.MULTILINE):
        m = re.match(r"FROM \S+ AS (\S+)", block)
        if m:
            out[m[1]] = block
    return out


def _nginx_listen() -> int:
    nginx = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    (port,) = re.findall(r"^\s*listen (\d+);", nginx, re.MULTILINE)
    return int(port)


def test_images_check_at_build_that_their_modules_load():
    stages = _stages((DEPLOY / "Dockerfile").read_text(encoding="utf-8"))
    for target in ("router", "worker"):
        text = stages[target]
        check = re.search(r'^RUN python -c "import ([^"]+)"$', text, re.MULTILINE)
        assert check, f"{target}: no build-time import check"
        modules = {m.strip() for m in check[1].split(",")}
        assert {"sqlite3", "ssl", "ctypes", "argusdiff"} <= modules, target
        assert text.index("COPY --from=build-") < check.start(), f"{target}: the check runs before the venv is in"
    # the worker's Python comes from another distribution: the libraries its modules link to are
    # installed on the CUDA base (cache/index.py imports sqlite3)
    worker = stages["worker"]
    assert "COPY --from=python /usr/local /usr/local" in worker
    installed = re.search(r"apt-get install (.*?)&&", worker, re.S)[1].replace("\\", " ").split()
    for lib in ("libsqlite3-0", "libssl3t64", "libffi8", "libgomp1"):
        assert lib in installed, lib


def test_every_service_has_a_health_check_on_the_right_port(compose):
    settings = load_settings(DEPLOY / "production.toml", environ={})
    from argusdiff.service.transport.redis_streams import RedisKeys

    keys = RedisKeys(settings.service.namespace)
    listen = _nginx_listen()
    for name, service in compose["services"].items():
        if name == "s3-init":
            continue  # a one-shot job
        assert "healthcheck" in service or name == "qdrant", f"{name} has no health check"
    for name, service in _argusdiff_services(compose).items():
        test = " ".join(service["healthcheck"]["test"])
        argv = list(service.get("command") or ())
        if argv and argv[0] == "worker":
            worker_id = argv[argv.index("--id") + 1]
            assert repr(keys.heartbeat(worker_id)) in test, f"{name}: checks another worker's heartbeat"
            assert argv[argv.index("--redis") + 1] in test, name
        else:
            port = int(re.search(r"127\.0\.0\.1:(\d+)/healthz", test)[1])
            assert port == settings.service.port, name
    lb = compose["services"]["lb"]
    assert int(re.search(r"127\.0\.0\.1:(\d+)/healthz", " ".join(lb["healthcheck"]["test"]))[1]) == listen
    (published,) = lb["ports"]
    assert int(published.rsplit(":", 1)[1]) == listen


def test_the_compose_walkthrough_names_the_ports_compose_publishes():
    """docs/operations.md's compose commands reach the load balancer on the port it listens on and
    published, and send the Bearer key compose requires to every authenticated endpoint."""
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    listen = _nginx_listen()
    assert set(map(int, re.findall(r"\blb:(\d+)", doc))) == {listen}
    compose_section = doc[doc.index("## Deploying with Docker Compose") : doc.index("## Kubernetes (Helm)")]
    assert set(map(int, re.findall(r"localhost:(\d+)", compose_section))) == {listen}
    for line in re.findall(r"^curl .*$", doc, re.MULTILINE):
        path = re.search(r"localhost:\d+(/\S*)", line)[1]
        if path.startswith("/v1/"):
            assert "Authorization: Bearer" in line, line
