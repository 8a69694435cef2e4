"""deploy/helm/argusdiff: the chart renders, every manifest validates offline, and what it runs is
what the code expects.

* rendered by tests/helm_render.py (Go templates + the Sprig functions the chart uses; why not helm:
  that module's docstring) with the default values and with the variants operators use (external
  Redis and Qdrant, an existing Secret, two GPU classes, KEDA's redis-streams trigger, monitoring
  off); with a ``helm`` binary on the PATH, ``helm lint`` and ``helm template`` are compared too;
* every core manifest validates with kubernetes-validate (strict: unknown fields are errors)
  against the newest Kubernetes it knows and an older one; the custom resources (ServiceMonitor,
  PrometheusRule, ScaledObject) against their CRDs' schemas (tests/data/crd-schemas, from
  prometheus-operator v0.93.0 and KEDA v2.20.1), also strict;
* the config the pods get loads with the project's loader and every ``ARGUSDIFF_*`` variable is a
  setting; the containers' command lines parse with the real CLI;
* probes, GPUs, grace periods, disruption budgets, selectors, the alert rules and the KEDA stream
  names agree with the service (the Redis transport's own key names).

No cluster is run here (docs/operations.md says so).
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from argusdiff import cli
from argusdiff.config import Settings, load_settings

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from tests.helm_render import TemplateError, render_chart  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "argusdiff"
CRD_SCHEMAS = Path(__file__).parent / "data" / "crd-schemas"
#: Kubernetes versions validated against: the newest kubernetes-validate knows and an older one
#: still in support by the large clouds
K8S_OLDER = "1.31"

VARIANTS: dict[str, dict] = {
    "defaults": {},
    "external services, existing secret, redis-streams": {
        "redis": {"enabled": False, "url": "redis://redis.shared:6379/2"},
        "qdrant": {"enabled": False, "url": "http://qdrant.shared:6333"},
        "s3": {"endpoint": "http://minio.storage:9000", "accessKeyId": "AK", "secretAccessKey": "SK"},
        "existingSecret": "my-argusdiff",
        "logFormat": "json",
        "otlpEndpoint": "http://otel-collector.monitoring:4318",
        "redisNamespace": "prod",
        "autoscaling": {"keda": {"trigger": "redis-streams", "redisStreams": {"address": "redis.shared:6379"}}},
    },
    "two GPU classes, keys, monitoring off": {
        "apiKeys": ["k1", "k2"],
        "s3": {"accessKeyId": "AK", "secretAccessKey": "SK"},
        "metrics": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}},
        "workers": {
            "classes": [
                {
                    "name": "h100",
                    "replicas": 4,
                    "gpusPerWorker": 1,
                    "autoscale": True,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "resources": {"requests": {"cpu": "4"}},
                    "podDisruptionBudget": {"maxUnavailable": 1},
                },
                {
                    "name": "l4",
                    "replicas": 2,
                    "profile": "/etc/argusdiff/l4.toml",
                    "resources": {},
                    "podDisruptionBudget": {"minAvailable": 1},
                },
            ]
        },
        "autoscaling": {"keda": {"enabled": True}},
    },
}


def _docs(rendered: dict[str, str]) -> list[dict]:
    out = []
    for path, text in rendered.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict) and doc.get("kind"), f"{path}: not a manifest"
                out.append(doc)
    return out


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
    values = VARIANTS[request.param]
    return values, _docs(render_chart(CHART, values, release="prod", namespace="serving"))


@pytest.fixture(scope="module")
def defaults():
    return _docs(render_chart(CHART, {}, release="prod", namespace="serving"))


def _values(override: dict) -> dict:
    base = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def merge(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return {**a, **{k: merge(a.get(k), v) for k, v in b.items()}}
        return copy.deepcopy(b)

    return merge(base, override)


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _strict(schema):
    """An OpenAPI v3 structural schema as JSON Schema that rejects unknown fields (kubectl's
    --validate=strict)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if schema.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def _crd_validator(kind: str):
    import jsonschema

    data = json.loads((CRD_SCHEMAS / f"{kind.lower()}.json").read_text(encoding="utf-8"))
    return data["apiVersion"], jsonschema.Draft202012Validator(_strict(data["schema"]))


def test_every_manifest_validates_offline(variant):
    _, docs = variant
    crds = {k: _crd_validator(k) for k in ("ServiceMonitor", "PrometheusRule", "ScaledObject")}
    latest = kubernetes_validate.latest_version()
    assert tuple(int(x) for x in latest.split(".")) >= (1, 34)
    core = 0
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in crds:
            api_version, validator = crds[doc["kind"]]
            assert doc["apiVersion"] == api_version, name
            errors = sorted(validator.iter_errors(doc), key=str)
            assert not errors, f"{name}: {errors[0].message} at {list(errors[0].absolute_path)}"
            continue
        for version in (latest, K8S_OLDER):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name} is not a valid Kubernetes {version} object: {exc}")
        core += 1
    assert core >= 5


def test_the_crd_check_catches_a_misspelt_field(defaults):
    _, validator = _crd_validator("ScaledObject")
    so = copy.deepcopy(_by_kind(defaults, "ScaledObject")[0])
    so["spec"]["cooldownPeriods"] = 600
    assert list(validator.iter_errors(so))
    with pytest.raises(kubernetes_validate.ValidationError):
        deployment = copy.deepcopy(_by_kind(defaults, "Deployment")[0])
        deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def _container(doc: dict) -> dict:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def _env(doc: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (fieldRefs to the pod's name)."""
    env = {}
    for e in _container(doc)["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["key"] in secrets.get(ref["name"], {}):
                env[e["name"]] = secrets[ref["name"]][ref["key"]]
            else:
                assert ref.get("optional") or ref["name"] not in secrets, e
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = "prod-argusdiff-worker-a100-7d9c-x2x"
    return env


def _secrets(docs: list[dict], values: dict) -> dict[str, dict[str, str]]:
    out = {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
           for s in _by_kind(docs, "Secret")}  # fmt: skip
    if values.get("existingSecret"):  # the operator's own Secret
        out[values["existingSecret"]] = {"api-keys": '["from-existing"]'}
    return out


def _expand(arg: str, env: dict[str, str]) -> str:
    for k, v in env.items():
        arg = arg.replace(f"$({k})", v)
    return arg


def test_pods_get_a_config_that_loads_and_command_lines_that_parse(variant, tmp_path):
    values, docs = variant
    (cm,) = _by_kind(docs, "ConfigMap")
    config = tmp_path / "argusdiff.toml"
    config.write_text(cm["data"]["argusdiff.toml"], encoding="utf-8")
    secrets = _secrets(docs, values)
    deployments = _by_kind(docs, "Deployment")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} == {"router", "worker"}
    services = {s["metadata"]["name"] for s in _by_kind(docs, "Service")}
    for d in deployments:
        name = d["metadata"]["name"]
        c = _container(d)
        env = _env(d, secrets)
        for key in env:
            if key.startswith("ARGUSDIFF_"):
                section = key.removeprefix("ARGUSDIFF_").lower().split("__")[0]
                assert section in Settings.model_fields, f"{name}: {key} is not a setting"
        settings = load_settings(config, environ=env)
        expected_keys = tuple(values.get("apiKeys", ())) or (("from-existing",) if values.get("existingSecret") else ())
        assert settings.service.api_keys == expected_keys, name
        assert settings.service.namespace == values.get("redisNamespace", "argusdiff")
        for url in (settings.service.redis_url, settings.cache.qdrant_url):
            host = urlsplit(url).hostname
            assert host in services or "." in host, f"{name}: {url} names no Service of the chart"
        argv = [_expand(a, env) for a in c["args"]]
        try:
            args = cli.build_parser(argv[0]).parse_args(argv)
        except SystemExit as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{name}: `argusdiff {' '.join(argv)}` does not parse (exit {exc.code})")
        assert args.config == "/etc/argusdiff/argusdiff.toml"
        assert args.log_format == values.get("logFormat", "text")
        assert settings.service.otlp_endpoint == (values.get("otlpEndpoint") or None)
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/etc/argusdiff" in mounts
        if argv[0] == "worker":
            assert args.redis == settings.service.redis_url and args.gpu == 0
            assert args.worker_id.startswith("prod-argusdiff-worker-")  # the pod's name: one id per pod
            assert "/models" in mounts
        else:
            assert argv[0] == "serve" and settings.service.port == c["ports"][0]["containerPort"]


def test_router_probes_and_worker_gpus_grace_and_budgets(variant):
    values, docs = variant
    cfg = _values(values)
    from argusdiff.profile import load_profile

    router = next(d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-router"))
    c = _container(router)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    drain = 60.0  # [service] drain_timeout_s in the chart's config
    assert router["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain
    workers = [d for d in _by_kind(docs, "Deployment") if "-worker-" in d["metadata"]["name"]]
    assert [w["metadata"]["name"].rsplit("-", 1)[1] for w in workers] == [k["name"] for k in cfg["workers"]["classes"]]
    profile = load_profile("sdxl-ac-a100")
    slowest_batch_s = max(lv.latency(b) for lv in profile.levels for b in lv.latency_s)
    for w in workers:
        spec = w["spec"]["template"]["spec"]
        res = _container(w)["resources"]
        assert (
            int(res["limits"]["nvidia.com/gpu"]) >= 1
            and res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
        )
        assert spec["terminationGracePeriodSeconds"] > slowest_batch_s
    # every PodDisruptionBudget and Service selects the pods of one workload of the chart
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in _by_kind(docs, "Deployment") + _by_kind(
        docs, "StatefulSet")]  # fmt: skip
    for obj in _by_kind(docs, "PodDisruptionBudget") + _by_kind(docs, "Service"):
        sel = obj["spec"]["selector"].get("matchLabels", obj["spec"]["selector"])
        matched = [p for p in pods if all(p.get(k) == v for k, v in sel.items())]
        assert len(matched) == 1, obj["metadata"]["name"]
    assert len(_by_kind(docs, "PodDisruptionBudget")) == 1 + len(workers)


def test_monitoring_objects_match_the_service_and_the_rules_file(defaults):
    (sm,) = _by_kind(defaults, "ServiceMonitor")
    router_svc = next(s for s in _by_kind(defaults, "Service") if s["metadata"]["name"].endswith("-router"))
    assert all(router_svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in router_svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    (rule,) = _by_kind(defaults, "PrometheusRule")
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == rules["groups"]
    assert (CHART / "files" / "rules.yaml").resolve() == (ROOT / "deploy" / "prometheus" / "rules.yaml").resolve()


def test_keda_targets_the_worker_deployments_and_reads_the_real_streams(variant):
    from argusdiff.profile import load_profile
    from argusdiff.service.transport.redis_streams import RedisKeys

    values, docs = variant
    cfg = _values(values)
    deployments = {d["metadata"]["name"] for d in _by_kind(docs, "Deployment")}
    scaled = _by_kind(docs, "ScaledObject")
    assert len(scaled) == sum(1 for k in cfg["workers"]["classes"] if k.get("autoscale"))
    keda = cfg["autoscaling"]["keda"]
    for so in scaled:
        assert (
            so["spec"]["scaleTargetRef"]["name"] in deployments and "-worker-" in so["spec"]["scaleTargetRef"]["name"]
        )
        triggers = so["spec"]["triggers"]
        if keda["trigger"] == "prometheus":
            assert [t["metadata"]["query"] for t in triggers] == ["max(argusdiff_desired_workers)"]
            continue
        keys = RedisKeys(cfg["redisNamespace"])
        cm = tomllib_loads(_by_kind(docs, "ConfigMap")[0]["data"]["argusdiff.toml"])
        levels = load_profile(cm["profile"]).ids
        assert tuple(keda["redisStreams"]["levels"]) == tuple(levels)  # the values name the profile's levels
        want = [s for lv in levels for s in keys.streams(lv)]
        assert sorted(t["metadata"]["stream"] for t in triggers) == sorted(want)
        assert {t["metadata"]["consumerGroup"] for t in triggers} == {keys.group}
        assert {t["type"] for t in triggers} == {"redis-streams"}


def tomllib_loads(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)


def test_values_errors_are_refused():
    with pytest.raises(TemplateError, match=r"redis\.url is required"):
        render_chart(CHART, {"redis": {"enabled": False}})
    with pytest.raises(TemplateError, match="prometheus or redis-streams"):
        render_chart(CHART, {"autoscaling": {"keda": {"trigger": "cpu"}}})


# -- the renderer itself: Go text/template semantics the chart relies on ------------------------


def _render_one(tmp_path: Path, template: str, values: dict | None = None) -> str:
    chart = tmp_path / "c"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text(yaml.safe_dump(values or {}))
    (chart / "templates" / "t.yaml").write_text(template)
    return render_chart(chart).get("templates/t.yaml", "")


def test_renderer_follows_go_templates(tmp_path):
    assert _render_one(tmp_path, "a:\n  {{- if .Values.x }} yes{{ else }} no{{ end }}\n", {"x": 0}) == "a: no\n"
    assert (
        _render_one(tmp_path, "{{ range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}", {"m": {"b": 2, "a": 1}})
        == "a=1;b=2;"
    )
    assert (
        _render_one(
            tmp_path, '{{ if eq .Values.t "x" }}1{{ else if eq .Values.t "y" }}2{{ else }}3{{ end }}', {"t": "y"}
        )
        == "2"
    )
    assert _render_one(tmp_path, "{{- $a := 1 }}{{ if true }}{{ $a = 2 }}{{ end }}{{ $a }}") == "2"
    assert (
        _render_one(tmp_path, "k:{{ toYaml .Values.d | nindent 2 }}", {"d": {"b": [1, 2], "a": "x"}})
        == "k:\n  a: x\n  b:\n  - 1\n  - 2"
    )
    assert _render_one(tmp_path, '{{ .Values.missing | default "d" | quote }}') == '"d"'
    assert _render_one(tmp_path, "{{ with .Values.o }}{{ .n }}{{ end }}", {"o": {"n": 3}}) == "3"
    with pytest.raises(TemplateError, match="not implemented"):
        _render_one(tmp_path, '{{ lookup "v1" "Secret" "ns" "x" }}')
    with pytest.raises(TemplateError, match="missing"):
        _render_one(tmp_path, "{{ if true }}x")  # fmt: skip


def test_helm_itself_lints_and_renders_the_same():
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("no helm binary on the PATH (not installable here: tests/helm_render.py says why)")
    lint = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for values in VARIANTS.values():
        vfile = Path(CHART.parent / "test-values.json")
        try:
            vfile.write_text(json.dumps(values))
            out = subprocess.run([helm, "template", "prod", str(CHART), "--namespace", "serving", "-f", str(vfile)],
                                 capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
        finally:
            vfile.unlink(missing_ok=True)
        theirs = [d for d in yaml.safe_load_all(out) if d]
        ours = _docs(render_chart(CHART, values, release="prod", namespace="serving"))
        key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
        assert sorted(theirs, key=key) == sorted(ours, key=key)
