"""Every command quoted in a code block of README.md and docs/*.md runs and exits 0, or is listed
in SKIPPED with the reason it cannot run here (a GPU, model weights, a server at the example's
address, minutes of work). A command added to the docs is run by this test until it is either
runnable or listed.

Commands are taken as written, with adjustments that keep this test to seconds: optional
``[...]`` groups of a synopsis are left out; a replay's trace is replaced by a 2-minute one and
``cache warm`` runs 2 prompts (the options are what is checked); example input files the text names (``traces.csv``,
``azure_functions_2019_hourly.csv``) are made from ``../shared`` or the package's data in the
working folder, where every command of one document runs in order (so ``quality show table.csv``
reads the table ``quality synth`` wrote).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(?:\$ )?((?:\.venv/bin/)?argusdiff\b.*|python3? (?:-m argusdiff|scripts/)\S+.*)$")

#: commands that cannot run here, by a regular expression on the command, and why
SKIPPED: dict[str, str] = {
    r"^argusdiff serve\b": "a long-running server (the service tests start it; tests/test_service_*.py)",
    r"^argusdiff worker --redis redis://10\.": "needs Redis at the example's address",
    r"^argusdiff status --(redis|url) \S*(redis|router)": "needs the compose deployment's Redis or router",
    r"--profile sdxl-ac-a100 --level": "needs SD-XL weights and a GPU",
    r"^argusdiff profile measure": "measures real model weights (a GPU)",
    r"^argusdiff profile show sdxl-ac-h100\.toml|--profile sdxl-ac-h100\.toml": "reads the file profile measure writes",
    r"^argusdiff train-classifier": "trains a BERT classifier (minutes; tests/test_classifier*.py train tiny ones)",
    r"^argusdiff train-discriminator": "needs folders of real and generated images",
    r"--discriminator DIR": "needs a trained discriminator folder",
    r"^python scripts/check_cuda_path\.py": "needs a CUDA GPU (scripts/gpu_checks.sh)",
    r"^python scripts/load_test\.py": "a 10-minute load test",
    r"\.\.\. ": "elides its options (...)",
}


SHORT_TRACE = "poisson:qpm=30,duration=2m"


def _commands() -> list[tuple[str, str]]:
    """(``file:line``, command) of every command line in a fenced block, continuations joined."""
    out: list[tuple[str, str]] = []
    for doc in DOCS:
        fenced = False
        lines = doc.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = COMMAND.match(line.strip()) if fenced else None
            if m is None:
                continue
            where, text = f"{doc.relative_to(ROOT)}:{i}", m.group(1)
            while text.rstrip().endswith("\\") or (i < len(lines) and lines[i].startswith(" ") and "[" in lines[i]):
                text = text.rstrip().removesuffix("\\") + " " + lines[i].strip()
                i += 1
            out.append((where, text))
    return out


def _normalise(text: str) -> str:
    text = re.sub(r"\s+#.*$", "", text)  # a trailing comment
    while re.search(r"\[[^\[\]]*\]", text):
        text = re.sub(r"\s*\[[^\[\]]*\]", "", text)  # optional groups of a synopsis
    return text.strip()


COMMANDS = _commands()


def test_the_docs_quote_commands():
    assert len(COMMANDS) >= 30
    assert any(c.startswith("argusdiff plan") for _w, c in COMMANDS)


def _prepare(argv: list[str], cwd: Path, cache: Path) -> list[str]:
    """Short traces for replays, example inputs in ``cwd``, scratch paths for caches."""
    if argv[:1] == ["replay"]:
        if "--trace" in argv:
            argv[argv.index("--trace") + 1] = _example_trace(argv[argv.index("--trace") + 1], cwd)
        else:
            argv += ["--trace", SHORT_TRACE]
        argv += ["--quiet", "--no-plots"]
    if argv[:2] == ["cache", "warm"] and "--limit" in argv:
        argv[argv.index("--limit") + 1] = "2"
    for i, arg in enumerate(argv):
        if arg.startswith("../shared/"):
            if not SHARED.is_dir():
                pytest.skip("../shared is not beside this checkout")
            argv[i] = str(SHARED / arg.removeprefix("../shared/"))
        elif arg == "azure_functions_2019_hourly.csv":
            shutil.copy(ROOT / "traces" / "data" / arg, cwd / arg)
        elif arg.startswith("/tmp/"):
            argv[i] = str(cache / arg.removeprefix("/tmp/"))
    return argv


def _example_trace(spec: str, cwd: Path) -> str:
    if spec == "traces.csv":  # the DiffServe artifact's arrival_ms,prompt_idx format
        (cwd / spec).write_text("".join(f"{i * 500},{i + 1}\n" for i in range(200)))
        return spec
    return SHORT_TRACE


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    return {}


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _c in COMMANDS])
def test_quoted_command_runs(where, command, workdirs, tmp_path_factory, monkeypatch, demo_models_dir, capsys):
    text = _normalise(command)
    for pattern, reason in SKIPPED.items():
        if re.search(pattern, text):
            pytest.skip(f"{where}: {reason}")
    doc = where.split(":")[0]
    if doc not in workdirs:
        workdirs[doc] = tmp_path_factory.mktemp(Path(doc).stem)
    cwd = workdirs[doc]
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ARGUSDIFF_WORKERS__MODELS_DIR", demo_models_dir)
    monkeypatch.setenv("ARGUSDIFF_CACHE__PATH", str(cwd / "latent-cache"))
    monkeypatch.setenv("ARGUSDIFF_SERVICE__IMAGE_PATH", str(cwd / "images"))
    argv = shlex.split(text)
    if argv[0].endswith("argusdiff"):
        argv = argv[1:]
    elif argv[:3] == ["python", "-m", "argusdiff"] or argv[:3] == ["python3", "-m", "argusdiff"]:
        argv = argv[3:]
    else:  # pragma: no cover - a script that is not listed in SKIPPED
        pytest.fail(f"{where}: add a way to run {argv[1]} here or list it in SKIPPED")
    argv = _prepare(argv, cwd, cwd / "tmp")
    from argusdiff.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 0, f"{where}: `{' '.join(argv)}` exited {rc}: {err[-2000:]}"


def test_operations_metrics_table_lists_every_metric():
    """docs/operations.md's metrics table names exactly the metrics a service exports."""
    pytest.importorskip("prometheus_client")
    from argusdiff.service.autoscale import AutoscaleMetrics
    from argusdiff.service.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    AutoscaleMetrics(metrics, {})  # the autoscaling gauges register on the same registry
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(argusdiff_\w+)`", doc, re.MULTILINE))
    assert exported - listed == set(), "exported but not in docs/operations.md"
    assert listed - exported == set(), "in docs/operations.md but not exported"


def test_the_last_lines_say_which_integration_tests_were_skipped():
    from conftest import integration_summary

    assert integration_summary(12, {}) == ["integration tests: 12 run, none skipped"]
    lines = integration_summary(3, {"redis-server is not installed (apt-get install redis-server)": 40, "no S3": 2})
    assert lines[0].startswith("integration tests: 3 run, 42 SKIPPED")
    assert lines[1].split() == ["40", "redis-server", "is", "not", "installed", "(apt-get", "install", "redis-server)"]
